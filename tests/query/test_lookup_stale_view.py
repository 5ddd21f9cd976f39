"""Lookups whose view of the commitlog does not know a quarantined range yet (recovery made it after
the view was taken): the guessed reads that meet the range fail, each hit is then read alone, its
head first, and only the hit whose record lies in the range is lost. In process, over scripted
backends: the processes' view always knows the ranges a fresh start recovered."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from services.query.backends import CommitLogClient, IndexerClient, KeyHits, StoreInfo
from services.query.errors import DataLossError
from services.query.lookup import MessageLookup
from services.query.store_view import StoreView
from services.store.formats.message import properties_to_string
from services.store.formats.message_id import MessageIdKind
from services.store.formats.record import encode_record
from services.store.formats.socket_address import encode_address

NOWHERE = "127.0.0.1:1"  # never dialled: every call the lookup makes is scripted
TOPIC = "Stale"
UNIQ = ["0A00000100002A9F1B6D3586000000B1", "0A00000100002A9F1B6D3586000000B2", "0A00000100002A9F1B6D3586000000B3"]


def build_log() -> tuple[bytes, list[int]]:
    log, offsets = b"", []
    for i, uniq in enumerate(UNIQ):
        offsets.append(len(log))
        log += encode_record(topic=TOPIC.encode(), queue_id=0, body=f"record {i}".encode(), flag=0,
                             properties=properties_to_string({"UNIQ_KEY": uniq, "KEYS": "near"}).encode(),
                             sys_flag=0, born_timestamp=1_800_000_000_000, born_host=encode_address("127.0.0.1:5"),
                             store_host=encode_address("127.0.0.1:10911"), queue_offset=i,
                             commitlog_offset=len(log), store_timestamp=1_800_000_000_000 + i)
    return log, offsets


class QuarantinedLog(CommitLogClient):
    """A commitlog whose [start, stop) is quarantined while its StoreInfo does not say so."""

    def __init__(self, data: bytes, start: int, stop: int) -> None:
        super().__init__(NOWHERE)
        self.data, self.start, self.stop = data, start, stop

    async def store_info(self) -> StoreInfo:
        return StoreInfo(0, len(self.data), 1 << 20, "127.0.0.1:10911", "x")

    async def read(self, offset: int, size: int) -> bytes:
        if offset < self.stop and offset + size > self.start:
            raise DataLossError(f"[{offset}, {offset + size}) reaches into the QUARANTINED commitlog range "
                                f"[{self.start}, {self.stop})")
        return self.data[offset:offset + size]

    async def read_batch(self, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        return [await self.read(offset, size) for offset, size in ranges]


class Hits(IndexerClient):
    def __init__(self, offsets: list[int]) -> None:
        super().__init__(NOWHERE)
        self.offsets = offsets

    async def query_by_key(self, topic: str, key: str, max_num: int, begin: int, end: int,
                           skip: int = 0) -> KeyHits:
        return KeyHits(self.offsets[skip:skip + max_num], 0, 0)


async def _lookups() -> None:
    data, offsets = build_log()
    commitlog = QuarantinedLog(data, offsets[1], offsets[2])
    indexer = Hits(offsets[::-1])  # newest first
    lookup = MessageLookup(indexer, commitlog, StoreView(commitlog))
    try:
        found, kind = await lookup.view(UNIQ[0], TOPIC, MessageIdKind.UNIQ_KEY)
        assert (found.body, found.commitlog_offset, kind) == (b"record 0", 0, MessageIdKind.UNIQ_KEY)
        result = await lookup.query(TOPIC, "near", 0, 0, 0)
        assert [m.body for m in result.messages] == [b"record 0", b"record 2"]
        with pytest.raises(DataLossError, match=f"no readable message has UNIQ_KEY {UNIQ[1]}.*QUARANTINED"):
            await lookup.view(UNIQ[1], TOPIC, MessageIdKind.UNIQ_KEY)
    finally:
        await indexer.close()
        await commitlog.close()


def test_a_quarantined_range_the_view_does_not_know_costs_only_its_record() -> None:
    asyncio.run(_lookups())
