"""Per-queue offsets: the offset range, the offset by store time, the earliest store time.

An unknown queue is an empty one (min = max = 0), as RocketMQ's findConsumeQueue creates it on demand.
"""

from __future__ import annotations

import struct

from mqstore.services.query.backends import CommitLogClient, IndexerClient
from mqstore.services.query.errors import DataLossError
from mqstore.services.query.stored_message import record_size_at
from mqstore.services.store.errors import NotFoundError, OutOfRangeError
from mqstore.services.store.names import check_offset, check_queue
from mqstore.services.store.record import IPV6_HOST_LENGTH, PHYSICAL_OFFSET_POS, SYSFLAG_POS, store_timestamp_pos

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
        unit = entries.units[0]
        try:
            data = await self._commitlog.read(unit.commitlog_offset, min(unit.size, STORE_TIME_PREFIX_BYTES))
        except OutOfRangeError:
            raise NotFoundError(f"the earliest message of {topic}/{queue_id} (commitlog offset "
                                f"{unit.commitlog_offset}) was deleted from the commitlog") from None
        if record_size_at(data) != unit.size or _I64.unpack_from(data, PHYSICAL_OFFSET_POS)[0] != unit.commitlog_offset:
            raise DataLossError(f"{topic}/{queue_id} queue offset {unit.queue_offset}: no {unit.size}-byte record "
                                f"starts at commitlog offset {unit.commitlog_offset}")
        sys_flag = _I32.unpack_from(data, SYSFLAG_POS)[0]
        return int(_I64.unpack_from(data, store_timestamp_pos(sys_flag))[0])
