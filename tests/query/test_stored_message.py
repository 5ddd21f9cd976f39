"""The query service's record decoder: its fast path (IPv4 hosts, v1 magic) and the general one
(decode_record) agree on every record RocketMQ 4.9.8 wrote and on IPv6 records; damage is DATA_LOSS."""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from services.query.errors import DataLossError
from services.query.stored_message import _general, stored_message
from services.store.formats.message import COMPRESSED_FLAG, properties_to_string
from services.store.formats.record import BLANK_MAGIC_CODE, encode_record, read_size_and_magic
from services.store.formats.socket_address import encode_address


def fixture_records(store: Path) -> Iterator[tuple[int, bytes]]:
    for path in sorted((store / "commitlog").iterdir()):
        data = path.read_bytes()
        base, pos = int(path.name), 0
        while pos + 8 <= len(data):
            size, magic = read_size_and_magic(data, pos)
            if magic == BLANK_MAGIC_CODE or size <= 0:
                break
            yield base + pos, data[pos:pos + size]
            pos += size


def test_fast_and_general_paths_agree_on_every_fixture_record(pristine_store: Callable[[str], Path]) -> None:
    records = list(fixture_records(pristine_store("normal-raw")))
    assert len(records) == 3000
    for offset, raw in records:
        assert dataclasses.asdict(stored_message(raw, offset)) == dataclasses.asdict(_general(raw, offset)), offset


def _record(born: str = "127.0.0.1:50000", store: str = "127.0.0.1:10911", body: bytes = b"body", sys_flag: int = 0,
            offset: int = 4096) -> bytes:
    born_raw, store_raw = encode_address(born), encode_address(store)
    flags = sys_flag | (0x10 if len(born_raw) == 20 else 0) | (0x20 if len(store_raw) == 20 else 0)
    return encode_record(topic=b"T", queue_id=3, body=body, flag=5,
                         properties=properties_to_string({"TAGS": "a", "KEYS": "k1 k2"}).encode(), sys_flag=flags,
                         born_timestamp=11, born_host=born_raw, store_host=store_raw, reconsume_times=2,
                         queue_offset=9, commitlog_offset=offset, store_timestamp=12)


def test_ipv6_records_take_the_general_path() -> None:
    message = stored_message(_record(born="[2001:db8::7]:5000", store="[::1]:10911"), 4096)
    assert (message.born_host, message.store_host) == ("[2001:db8::7]:5000", "[::1]:10911")
    assert message.msg_id == (encode_address("[::1]:10911") + (4096).to_bytes(8, "big")).hex().upper()
    assert (message.topic, message.queue_id, message.queue_offset, message.tags, message.keys) == \
        ("T", 3, 9, "a", "k1 k2")


def test_compressed_bodies_are_inflated_unless_they_cannot_be() -> None:
    packed = zlib.compress(b"x" * 10_000)
    inflated = stored_message(_record(body=packed, sys_flag=COMPRESSED_FLAG), 4096)
    assert (inflated.body, inflated.body_compressed) == (b"x" * 10_000, False)
    lz4 = stored_message(_record(body=packed, sys_flag=COMPRESSED_FLAG | 0x100), 4096)
    assert (lz4.body, lz4.body_compressed) == (packed, True)
    garbage = stored_message(_record(body=b"not zlib", sys_flag=COMPRESSED_FLAG), 4096)
    assert (garbage.body, garbage.body_compressed) == (b"not zlib", True)


@pytest.mark.parametrize("damage", ["crc", "offset", "short", "long", "magic", "topic"])
def test_damaged_records_are_data_loss(damage: str) -> None:
    raw = bytearray(_record())
    offset = 4096
    if damage == "crc":
        raw[8:12] = (zlib.crc32(b"bodz") & 0x7FFFFFFF).to_bytes(4, "big")  # BODYCRC of another body
    elif damage == "offset":
        offset = 8192
    elif damage == "short":
        raw = raw[:-1]
    elif damage == "long":
        raw += b"\x00"
    elif damage == "magic":
        raw[4:8] = b"\x00\x00\x00\x00"
    elif damage == "topic":
        raw[88 + 4] = 200  # topic length past the record
    with pytest.raises(DataLossError) as info:
        stored_message(bytes(raw), offset)
    assert f"commitlog offset {offset}" in str(info.value)
