"""The lazy view of a raw pull answer (PulledRecords, RecordView) and its columns against
decode_records: every field, every column and every failure the same, on real RocketMQ 4.9.8 records
(the fixture store: zlib bodies, CJK and emoji properties), on the store encoder's varied records, and
on random and damaged bytes. In process: no services."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqstore.client.errors import DataLossError
from mqstore.client.models import Message
from mqstore.client.record_view import PulledRecords, RecordView
from mqstore.client.records import decode_records
from tests.query.test_raw_records import DAMAGE, GOOD, records, store_of

FIELDS = ("topic", "queue_offset", "commitlog_offset", "store_size", "flag", "sys_flag", "body_crc", "born_timestamp",
          "store_timestamp", "reconsume_times", "body", "properties", "tags", "keys", "uniq_key", "msg_id")


def check_equal(data: bytes, queue_id: int | None = None) -> list[Message]:
    """Every field of every view, every column, equal to decode_records' messages."""
    expected = decode_records(data, queue_id)
    pulled = PulledRecords(data, queue_id)
    assert len(pulled) == len(expected)
    for view, message in zip(pulled, expected, strict=True):
        for name in FIELDS:
            assert getattr(view, name) == getattr(message, name), name
        assert view.queue_id == message.queue_id
        assert view.message() == message
    assert pulled.messages() == expected
    assert [bytes(b) for b in pulled.bodies()] == [m.body for m in expected]
    assert list(pulled.queue_offsets()) == [m.queue_offset for m in expected]
    assert list(pulled.commitlog_offsets()) == [m.commitlog_offset for m in expected]
    assert list(pulled.store_timestamps()) == [m.store_timestamp for m in expected]
    assert list(pulled.born_timestamps()) == [m.born_timestamp for m in expected]
    if expected:
        assert pulled[-1].message() == expected[-1] and [v.message() for v in pulled[::2]] == expected[::2]
    return expected


def fixture_records(store: Path, dump: list[dict[str, Any]]) -> bytes:
    """The records of the dump's first 1,000 messages, cut from the fixture's commitlog files."""
    files = sorted((store / "commitlog").iterdir())
    file_size = 1024 * 1024
    parts = []
    for row in dump[:1000]:
        offset, size = row["commitLogOffset"], row["storeSize"]
        data = files[offset // file_size].read_bytes()
        parts.append(data[offset % file_size:offset % file_size + size])
    return b"".join(parts)


def test_real_rocketmq_records_read_lazily_as_decoded(pristine_store: Callable[[str], Path],
                                                      dump_rows: Callable[..., list[dict[str, Any]]]) -> None:
    data = fixture_records(pristine_store("normal-raw"), dump_rows("normal", "msg"))
    messages = check_equal(data)
    assert any(m.sys_flag & 1 for m in messages) or len(messages) == 1000
    assert any("日本語" in m.properties.get("desc", "") for m in messages)
    check_equal(data, 7)


def test_the_store_encoders_varied_records_read_lazily_as_decoded() -> None:
    _, encoded = store_of(list(GOOD.values()))
    check_equal(b"".join(encoded))
    check_equal(b"")


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(records(), min_size=1, max_size=4))
def test_random_records_read_lazily_as_decoded(encoded: list[tuple[bytes, int]]) -> None:
    check_equal(b"".join(data for data, _ in encoded))


def every_field(pulled: Sequence[RecordView]) -> None:
    for view in pulled:
        for name in FIELDS:
            getattr(view, name)


@pytest.mark.parametrize("damage", DAMAGE)
def test_damaged_bytes_fail_as_decode_records_fails(damage: str) -> None:
    _, encoded = store_of([GOOD["plain"]] * 3)
    data = b"".join([encoded[0], DAMAGE[damage](encoded[1]), encoded[2]])
    try:
        decode_records(data)
    except DataLossError:
        refused = True
    else:
        refused = False  # a damage only a unit check sees (queue id, offsets): the bytes are whole records
    # Refused alike (the view may name another record: it splits the answer before it checks any record).
    raised = pytest.raises(DataLossError) if refused else contextlib.nullcontext()
    with raised:
        every_field(PulledRecords(data))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=4), st.integers(0, 400))
def test_the_view_fails_only_with_data_loss(flips: list[tuple[int, int]], cut: int) -> None:
    _, good = store_of([GOOD["plain"], GOOD["ipv6 both"], GOOD["zlib"], GOOD["v2 ipv6"]])
    blob = bytearray(b"".join(good))
    for index, value in flips:
        blob[index % len(blob)] ^= value
    data = bytes(blob[:len(blob) - cut])
    with contextlib.suppress(DataLossError):
        pulled = PulledRecords(data)
        every_field(pulled)
        pulled.bodies()
        assert pulled.messages() == decode_records(data)  # every field read: decode_records reads the same
