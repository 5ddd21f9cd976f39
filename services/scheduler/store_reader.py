"""Read-only access to the shard's files for the scheduler: SCHEDULE_TOPIC_XXXX's ConsumeQueue units
(under the indexer's root) and the commitlog records they point at (under the commitlog service's).

Only units below the max offset the indexer published (GetQueueOffsets, WatchArrivals) are read:
those are whole, and so are the records they point at (the indexer dispatched them).
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import NamedTuple

from mqstore.services.store.consume_queue import is_valid_unit
from mqstore.services.store.message import SCHEDULE_TOPIC, MessageRecord
from mqstore.services.store.parked_record import ParkedRecord, decode_parked
from mqstore.services.store.readonly_files import ReadOnlyFiles
from mqstore.services.store.record import RecordError, decode_record
from mqstore.services.store.store_layout import COMMITLOG_DIR, CONSUMEQUEUE_DIR
from mqstore.services.store.timer_message import record_timer_out_ms

_UNIT = struct.Struct(">qiq")
UNIT_SIZE = _UNIT.size


class ScheduledUnit(NamedTuple):
    queue_offset: int
    commitlog_offset: int
    size: int
    #: the deliver timestamp (ms) for SCHEDULE_TOPIC_XXXX units
    deliver_at: int

    @property
    def valid(self) -> bool:
        return is_valid_unit(self.commitlog_offset, self.size)


class ScheduleFiles:
    def __init__(self, store_root: Path, indexer_root: Path, commitlog_file_size: int, cq_file_size: int) -> None:
        self._cq_root = indexer_root / CONSUMEQUEUE_DIR
        self._cq_file_size = cq_file_size
        self._queues: dict[tuple[str, int], ReadOnlyFiles] = {}
        self._commitlog = ReadOnlyFiles(store_root / COMMITLOG_DIR, commitlog_file_size)

    def unit(self, queue_id: int, queue_offset: int, topic: str = SCHEDULE_TOPIC) -> ScheduledUnit | None:
        """The unit at ``queue_offset`` (the caller knows it is below the published max), None when its
        file is not readable yet (being created). ``topic``: SCHEDULE_TOPIC_XXXX, or rmq_sys_wheel_timer
        (whose units' last field is a plain tags code)."""
        files = self._queues.get((topic, queue_id))
        if files is None:
            files = self._queues[topic, queue_id] = ReadOnlyFiles(self._cq_root / topic / str(queue_id),
                                                                  self._cq_file_size)
        position = queue_offset * UNIT_SIZE
        found = files.find(position)
        if found is None:
            return None
        start, mapped = found
        commitlog_offset, size, deliver_at = _UNIT.unpack_from(mapped, position - start)
        return ScheduledUnit(queue_offset, commitlog_offset, size, deliver_at)

    def record(self, commitlog_offset: int) -> MessageRecord | None:
        """The record at ``commitlog_offset``; None when its file is gone (expired) or it does not decode."""
        found = self._commitlog.find(commitlog_offset)
        if found is None:
            return None
        start, mapped = found
        try:
            return decode_record(mapped, commitlog_offset - start)
        except RecordError:
            return None

    def parked(self, commitlog_offset: int) -> ParkedRecord | None:
        """What the re-put of the parked record at ``commitlog_offset`` needs (cheaper than :meth:`record`);
        None when its file is gone or it does not decode."""
        found = self._commitlog.find(commitlog_offset)
        if found is None:
            return None
        start, mapped = found
        try:
            return decode_parked(mapped, commitlog_offset - start)
        except RecordError:
            return None

    def timer_out_ms(self, commitlog_offset: int) -> tuple[bool, int | None]:
        """(found, TIMER_OUT_MS) of the record at ``commitlog_offset``, read from its properties only;
        found is False when its file is gone or it does not decode."""
        found = self._commitlog.find(commitlog_offset)
        if found is None:
            return False, None
        start, mapped = found
        try:
            return True, record_timer_out_ms(mapped, commitlog_offset - start)
        except RecordError:
            return False, None

    def close(self) -> None:
        for files in self._queues.values():
            files.close()
        self._commitlog.close()
