"""Read-only access to the shard's files for the scheduler: SCHEDULE_TOPIC_XXXX's ConsumeQueue units
(under the indexer's root) and the commitlog records they point at (under the commitlog service's).

Only units below the max offset the indexer published (GetQueueOffsets, WatchArrivals) are read:
those are whole, and so are the records they point at (the indexer dispatched them). The re-puts of
a stretch of the log (:meth:`ScheduleFiles.reputs`) are read below the commitlog's own max offset.
"""

from __future__ import annotations

import logging
import mmap
import struct
from array import array
from bisect import bisect_right
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from services.store.formats.consume_queue import is_valid_unit
from services.store.formats.message import PROPERTY_REAL_TOPIC, SCHEDULE_TOPIC, MessageRecord
from services.store.formats.parked_record import ParkedRecord, decode_parked
from services.store.formats.readonly_files import ReadOnlyFiles
from services.store.formats.record import (
    MESSAGE_MAGIC_CODE,
    MESSAGE_MAGIC_CODE_V2,
    MIN_RECORD_LENGTH,
    SIZE_AND_MAGIC,
    SYSFLAG_POS,
    RecordError,
    decode_record,
    real_destination,
    store_timestamp_pos,
)
from services.store.formats.record_scan import record_positions
from services.store.formats.store_layout import COMMITLOG_DIR, CONSUMEQUEUE_DIR
from services.store.rules.timer_message import record_timer_out_ms

log = logging.getLogger(__name__)

_UNIT = struct.Struct(">qiq")
UNIT_SIZE = _UNIT.size
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
#: the bytes every parked record and every re-put of one holds in its properties
_REAL_TOPIC_MARK = (PROPERTY_REAL_TOPIC + "\x01").encode()


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

    def reputs(self, start: int, end: int, stored_until_ms: int | None = None) -> Iterator[ParkedRecord]:
        """The records in the commitlog's ``[start, end)`` stored under their own REAL_TOPIC / REAL_QID:
        the scheduler's re-puts (a parked record, a transaction's half, lies under another topic), in log
        order, with the fields a re-put copies (:func:`decode_parked`: what :func:`reput_key` reads).
        ``start`` is a record's first byte and ``end`` at most the commitlog's max offset. Only the
        records whose bytes hold "REAL_TOPIC" are decoded. The walk ends at a file whose first record
        was stored after ``stored_until_ms`` (what a scheduler long down finds past its mark is not
        walked through), or at a stretch that holds no record (logged; the re-puts found before it are
        returned)."""
        offset = start
        file_size = self._commitlog.file_size
        while offset < end:
            located = self._commitlog.find(offset)
            if located is None:
                log.warning("commitlog offset %d is in no file: re-puts past it are not looked for", offset)
                break
            base, mapped = located
            if offset == base and offset != start and stored_until_ms is not None \
                    and _first_stored_ms(mapped) > stored_until_ms:
                break
            try:
                starts, reached, blank = record_positions(mapped, offset - base, min(end - base, file_size))
            except RecordError as exc:
                log.warning("commitlog at %d: %s: re-puts past it are not looked for", base, exc)
                break
            yield from self._reputs_among(mapped, base, starts, reached)
            offset = base + (file_size if blank else reached)

    @staticmethod
    def _reputs_among(mapped: mmap.mmap, base: int, starts: array[int], stop: int) -> Iterator[ParkedRecord]:
        """The re-puts among the records at ``starts`` (positions in ``mapped``, the last ending at ``stop``)."""
        hit = mapped.find(_REAL_TOPIC_MARK, starts[0], stop) if starts else -1
        while hit >= 0:
            index = bisect_right(starts, hit) - 1
            try:
                record = decode_parked(mapped, starts[index])
            except RecordError as exc:
                log.warning("commitlog offset %d: %s: not looked at for a re-put", base + starts[index], exc)
            else:
                if _is_reput(record):
                    yield record
            after = starts[index + 1] if index + 1 < len(starts) else stop
            hit = mapped.find(_REAL_TOPIC_MARK, after, stop)

    def close(self) -> None:
        for files in self._queues.values():
            files.close()
        self._commitlog.close()


def _first_stored_ms(mapped: mmap.mmap) -> int:
    """STORETIMESTAMP of a file's first record (0 when it does not hold one)."""
    size, magic = SIZE_AND_MAGIC.unpack_from(mapped, 0)
    if magic not in (MESSAGE_MAGIC_CODE, MESSAGE_MAGIC_CODE_V2) or size < MIN_RECORD_LENGTH:
        return 0
    stored: int = _I64.unpack_from(mapped, store_timestamp_pos(_I32.unpack_from(mapped, SYSFLAG_POS)[0]))[0]
    return stored


def _is_reput(record: ParkedRecord) -> bool:
    try:
        return real_destination(record.properties) == (record.topic, record.queue_id)
    except ValueError:
        return False
