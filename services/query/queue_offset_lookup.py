"""Per-queue offsets: the offset range, the offset by store time, the earliest store time.

An unknown queue is an empty one (min = max = 0), as RocketMQ's findConsumeQueue creates it on demand.
"""

from __future__ import annotations

import struct

from services.query.backends import CommitLogClient, IndexerClient, QueueUnit
from services.query.errors import DataLossError
from services.query.stored_message import record_size_at
from services.store.errors import NotFoundError, OutOfRangeError
from services.store.formats.record import IPV6_HOST_LENGTH, PHYSICAL_OFFSET_POS, SYSFLAG_POS, store_timestamp_pos
from services.store.rules.names import check_offset, check_queue

# Enough of a record to reach STORETIMESTAMP even behind an IPv6 born host.
STORE_TIME_PREFIX_BYTES = SYSFLAG_POS + 4 + 8 + IPV6_HOST_LENGTH + 8
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")


class QueueOffsets:
    def __init__(self, indexer: IndexerClient, commitlog: CommitLogClient) -> None:
        self._indexer = indexer
        self._commitlog = commitlog

    async def offset_range(self, topic: str, queue_id: int) -> tuple[int, int]:
        check_queue(topic, queue_id)
        return await self._indexer.queue_offsets(topic, queue_id) or (0, 0)

    async def offset_by_time(self, topic: str, queue_id: int, timestamp: int) -> int:
        check_queue(topic, queue_id)
        check_offset("timestamp", timestamp)
        found = await self._indexer.offset_by_time(topic, queue_id, timestamp)
        return 0 if found is None else found

    async def earliest_store_time(self, topic: str, queue_id: int) -> int:
        """Store time of the message at the queue's min offset."""
        check_queue(topic, queue_id)
        entries = await self._indexer.queue_entries(topic, queue_id, 0, 1)
        if entries.known and entries.max_offset > entries.min_offset and not entries.units:
            entries = await self._indexer.queue_entries(topic, queue_id, entries.min_offset, 1)
        if not entries.units:
            raise NotFoundError(f"queue {topic}/{queue_id} has no messages")
        return await self._store_time_of(topic, queue_id, entries.units[0])

    async def store_time_at(self, topic: str, queue_id: int, offset: int) -> int | None:
        """Store time of the message at ``offset`` (or the first one after it still in the queue); None
        when the queue holds nothing from there. Raises NotFoundError / DataLossError like
        :meth:`earliest_store_time` when the record is gone from the commitlog or damaged."""
        entries = await self._indexer.queue_entries(topic, queue_id, offset, 1)
        if not entries.units and entries.known and entries.max_offset > max(offset, entries.min_offset):
            entries = await self._indexer.queue_entries(topic, queue_id, max(offset, entries.min_offset), 1)
        return await self._store_time_of(topic, queue_id, entries.units[0]) if entries.units else None

    async def _store_time_of(self, topic: str, queue_id: int, unit: QueueUnit) -> int:
        """STORETIMESTAMP of the record ``unit`` points to, checked to be that record."""
        try:
            data = await self._commitlog.read(unit.commitlog_offset, min(unit.size, STORE_TIME_PREFIX_BYTES))
        except OutOfRangeError:
            raise NotFoundError(f"the message at {topic}/{queue_id} queue offset {unit.queue_offset} (commitlog "
                                f"offset {unit.commitlog_offset}) was deleted from the commitlog") from None
        if record_size_at(data) != unit.size or _I64.unpack_from(data, PHYSICAL_OFFSET_POS)[0] != unit.commitlog_offset:
            raise DataLossError(f"{topic}/{queue_id} queue offset {unit.queue_offset}: no {unit.size}-byte record "
                                f"starts at commitlog offset {unit.commitlog_offset}")
        sys_flag = _I32.unpack_from(data, SYSFLAG_POS)[0]
        return int(_I64.unpack_from(data, store_timestamp_pos(sys_flag))[0])
