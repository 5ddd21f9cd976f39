"""The dispatch path's parser agrees with the full decoder on every fixture record."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.store.formats.commitlog_walk import iter_commitlog
from services.store.formats.message import BORNHOST_V6_FLAG, STOREHOSTADDRESS_V6_FLAG, properties_to_string
from services.store.formats.record import RecordError, check_record, encode_record, parse_dispatch_requests
from services.store.formats.socket_address import encode_address
from tests.conftest import StoreFactory


def chunks_of(commitlog: Path) -> list[tuple[int, bytes]]:
    """(start offset, whole records) per file, as Tail would send them."""
    chunks = []
    for path in sorted(commitlog.iterdir()):
        data = path.read_bytes()
        start = int(path.name)
        end = 0
        while end + 8 <= len(data):
            request = check_record(data, end, check_crc=False)
            if not request.success or request.msg_size <= 0:
                break
            end += request.msg_size
        if end:
            chunks.append((start, data[:end]))
    return chunks


@pytest.mark.parametrize("store", ["normal-raw", "crash-recovered"])
def test_parse_matches_check_record(pristine_store: StoreFactory, store: str) -> None:
    commitlog = pristine_store(store) / "commitlog"
    parsed = [r for start, data in chunks_of(commitlog) for r in parse_dispatch_requests(data, start)]
    expected = [entry.dispatch for entry in iter_commitlog(commitlog) if getattr(entry, "dispatch", None)]
    assert len(parsed) == len(expected) > 2000
    assert parsed == expected


def test_a_chunk_that_does_not_start_at_a_record_is_refused(pristine_store: StoreFactory) -> None:
    start, data = chunks_of(pristine_store("normal-raw") / "commitlog")[0]
    with pytest.raises(RecordError):
        parse_dispatch_requests(data[161:], start + 161 + 1)
    with pytest.raises(RecordError):
        parse_dispatch_requests(data[:1000], start)  # the last record is cut short


@given(st.lists(st.tuples(st.booleans(), st.booleans(), st.binary(max_size=64), st.sampled_from(["", "TagA", "标签"]),
                          st.sampled_from([0, 0x4, 0x8, 0xC])), min_size=1, max_size=8))
def test_parse_matches_check_record_for_ipv6_and_transaction_records(
        specs: list[tuple[bool, bool, bytes, str, int]]) -> None:
    records, offset = [], 1000
    for born_v6, store_v6, body, tags, tx in specs:
        sys_flag = tx | (BORNHOST_V6_FLAG if born_v6 else 0) | (STOREHOSTADDRESS_V6_FLAG if store_v6 else 0)
        props = properties_to_string({"TAGS": tags, "KEYS": "a b"} if tags else {"KEYS": "a"}).encode()
        record = encode_record(
            topic=b"T6", queue_id=3, body=body, flag=1, properties=props, sys_flag=sys_flag, born_timestamp=5,
            born_host=encode_address("[::1]:80" if born_v6 else "10.0.0.1:80"),
            store_host=encode_address("[fe80::2]:90" if store_v6 else "10.0.0.2:90"),
            queue_offset=7, commitlog_offset=offset, store_timestamp=99)
        records.append(record)
        offset += len(record)
    data = b"".join(records)
    expected, pos = [], 0
    while pos < len(data):
        request = check_record(data, pos, check_crc=True)
        expected.append(request)
        pos += request.msg_size
    parsed = parse_dispatch_requests(data, 1000)
    assert [(r.commitlog_offset - 1000, r.tags_code, r.keys, r.store_timestamp, r.sys_flag) for r in parsed] == \
        [(r.commitlog_offset - 1000, r.tags_code, r.keys, r.store_timestamp, r.sys_flag) for r in expected]
