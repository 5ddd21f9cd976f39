"""ConsumeQueue: per-queue index of the commitlog, byte-compatible with Apache RocketMQ 4.9.8.

A queue lives in ``consumequeue/{topic}/{queueId}/`` as fixed-size files named by the 20-digit byte
offset of their first unit. A unit is 20 big-endian bytes: commitlog offset (8), message size (4),
tags code (8); unit *k* (queue offset *k*) sits at byte ``20*k`` of the queue's stream.
Files are created zero-filled and on demand (no successor is made for a full file until the next
unit arrives). RocketMQ's validity rule for a unit is ``commitlog offset >= 0 and size > 0``; the
first invalid unit ends a queue's data on recovery.

The writer (the dispatcher) is single-threaded per store; readers run concurrently and only look at
bytes below a file's wrote position, which is advanced after the bytes are in place.

File mtimes matter: RocketMQ's offset-by-time query picks the file to search by its mtime. A broker
writes these files through a memory mapping, and Linux sets a file's mtime when a write lands on one
of its pages that is clean (not written since it was mapped or last flushed). So a broker's file ends
up with the time of the first write into its last page since that page was last flushed: the store
time of the unit that started that page, plus the dispatch delay (the fixture stores agree to within
the kernel clock's few ms), unless a flush cleaned the page while units were still going into it
(then a later unit's, which a rebuild cannot know: docs/architecture.md says when that matters). A file
built later, by a lagging or rebuilding indexer or by ``pipeline reindex``, would carry the time it
was built; it is given that store time instead (``stamp_store_time``), once complete and, for the
last file, when the queue shuts down. Files this process did not write keep their mtime.
"""

from __future__ import annotations

import logging
import mmap
import os
import struct
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import overload

import numpy as np

from services.store.formats.dispatch_columns import DispatchColumns
from services.store.formats.mapped_file import OS_PAGE_SIZE, MappedFile
from services.store.formats.mapped_file_queue import MappedFileQueue
from services.store.formats.message import TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE, TRANSACTION_TYPE_MASK
from services.store.formats.record import DispatchRequest
from services.store.invariants import broken
from services.store.store_root import make_dirs

log = logging.getLogger(__name__)

CQ_STORE_UNIT_SIZE = 20
DEFAULT_MAPPED_FILE_SIZE = 300_000 * CQ_STORE_UNIT_SIZE
JAVA_INT_MAX = 0x7FFF_FFFF
#: Chunks with fewer records are dispatched record by record: below ~40 records (8 queues) numpy's fixed
#: cost is more than the per-record path's.
COLUMNAR_MIN_RECORDS = 48

_UNIT = struct.Struct(">qiq")
#: a unit's layout, for readers of the files (services/query/local_files.py)
UNIT = _UNIT
_OFFSET_AND_SIZE = struct.Struct(">qi")
#: the unit as a numpy record (20 bytes, no padding), to pack a batch in one operation
_UNIT_DTYPE = np.dtype([("offset", ">i8"), ("size", ">i4"), ("tags_code", ">i8")])
#: fillPreBlank's filler: commitlog offset 0, size Integer.MAX_VALUE, tags code 0.
BLANK_UNIT = _UNIT.pack(0, JAVA_INT_MAX, 0)
_ZERO_UNIT = bytes(CQ_STORE_UNIT_SIZE)
# Recovery scans files in chunks, so a mostly empty 6 MB file is not read (page-faulted) in full.
_SCAN_CHUNK = CQ_STORE_UNIT_SIZE * 4096

#: (commitlog offset, size, tags code, queue offset): what the dispatcher puts.
Unit = tuple[int, int, int, int]
#: store_time_of(commitlog offset, size) -> the record's store timestamp, negative when unreadable
#: (RocketMQ's CommitLog.pickupStoreTimestamp).
StoreTimeOf = Callable[[int, int], int]


def starts_page(queue_offset: int, units_per_file: int) -> bool:
    """Whether the unit at ``queue_offset`` is the first written into a page of its (sparse) file:
    writing it takes a new page of disk."""
    position = queue_offset % units_per_file * CQ_STORE_UNIT_SIZE
    return (position + CQ_STORE_UNIT_SIZE - 1) // OS_PAGE_SIZE != (position - 1) // OS_PAGE_SIZE


def is_valid_unit(commitlog_offset: int, size: int) -> bool:
    """RocketMQ's rule on recovery and truncation: anything else is the end of the data."""
    return commitlog_offset >= 0 and size > 0


def _is_filler(commitlog_offset: int, size: int, tags_code: int) -> bool:
    return commitlog_offset == 0 and size == JAVA_INT_MAX and tags_code == 0


def _chunks(mapped: MappedFile, stop: int) -> Iterator[tuple[int, bytes]]:
    """(byte position, bytes) of a file below ``stop`` in whole-unit chunks, so that a reader
    stopping early does not fault in the whole file."""
    for chunk_start in range(0, stop, _SCAN_CHUNK):
        yield chunk_start, mapped.buffer[chunk_start:min(chunk_start + _SCAN_CHUNK, stop)]


def _iter_units(mapped: MappedFile, stop: int) -> Iterator[tuple[int, int, int, int]]:
    """(byte position, commitlog offset, size, tags code) of the units of a file below ``stop``."""
    for chunk_start, chunk in _chunks(mapped, stop):
        for index, (offset, size, tags_code) in enumerate(_UNIT.iter_unpack(chunk)):
            yield chunk_start + index * CQ_STORE_UNIT_SIZE, offset, size, tags_code


def _all_valid(chunk: bytes) -> bool:
    """Whether every unit of ``chunk`` is valid, without a Python loop over the units (recovery
    reads up to 900,000 units a queue): no sign bit in any commitlog offset or size, and no size
    whose 4 bytes are all zero (the bytes of each size OR-ed together through 4 big integers)."""
    count = len(chunk) // CQ_STORE_UNIT_SIZE
    if count == 0:
        return True
    step = CQ_STORE_UNIT_SIZE
    if max(chunk[0::step]) >= 0x80 or max(chunk[8::step]) >= 0x80:
        return False
    size_bytes = (int.from_bytes(chunk[8::step]) | int.from_bytes(chunk[9::step])
                  | int.from_bytes(chunk[10::step]) | int.from_bytes(chunk[11::step]))
    return b"\x00" not in size_bytes.to_bytes(count)


def _java_div(numerator: int, denominator: int) -> int:
    """Java's long division truncates toward zero (Python's // floors): (-1) / 20 == 0."""
    quotient = abs(numerator) // abs(denominator)
    return quotient if (numerator >= 0) == (denominator > 0) else -quotient


def last_modified_ms(path: Path) -> int:
    """Java's File.lastModified() on Linux: mtime truncated to milliseconds, 0 when it cannot stat."""
    try:
        return os.stat(path).st_mtime_ns // 1_000_000
    except OSError:
        return 0


def stamp_store_time(path: Path, store_timestamp_ms: int) -> None:
    """Set a ConsumeQueue file's mtime to ``store_timestamp_ms`` (see the module docstring). Done once
    the file's writes are over: a later write through the mapping moves the mtime again, a flush
    does not."""
    try:
        os.utime(path, ns=(os.stat(path).st_atime_ns, store_timestamp_ms * 1_000_000))
    except OSError as exc:
        log.warning("cannot set the mtime of %s to store time %d: %s", path, store_timestamp_ms, exc)


def offset_in_file_by_time(buffer: bytes | mmap.mmap, file_from_offset: int, read_position: int,
                           min_logic_offset: int, timestamp: int, store_time_of: StoreTimeOf,
                           min_physic_offset: int = 0) -> int:
    """getOffsetInQueueByTime's search of one file (its units below ``read_position``): binary search
    by the records' store time, the queue offset of the nearest unit (a tie goes to the earlier one), 0
    for an unreadable record. Shared by the indexer and the query service's read-only file reader."""
    low = max(min_logic_offset - file_from_offset, 0)
    high = read_position - CQ_STORE_UNIT_SIZE
    target = left = right = -1
    left_time = right_time = -1
    while high >= low:
        middle = (low + high) // (2 * CQ_STORE_UNIT_SIZE) * CQ_STORE_UNIT_SIZE
        offset, size = _OFFSET_AND_SIZE.unpack_from(buffer, middle)
        if offset < min_physic_offset:
            low, left = middle + CQ_STORE_UNIT_SIZE, middle
            continue
        store_time = store_time_of(offset, size)
        if store_time < 0:
            return 0
        if store_time == timestamp:
            target = middle
            break
        if store_time > timestamp:
            high, right, right_time = middle - CQ_STORE_UNIT_SIZE, middle, store_time
        else:
            low, left, left_time = middle + CQ_STORE_UNIT_SIZE, middle, store_time
    if target != -1:
        position = target
    elif left_time == -1:
        position = right
    elif right_time == -1:
        position = left
    else:
        position = right if abs(timestamp - left_time) > abs(timestamp - right_time) else left
    return _java_div(file_from_offset + position, CQ_STORE_UNIT_SIZE)



def roll_next_file(queue_offset: int, mapped_file_size_consume_queue: int) -> int:
    """ConsumeQueue.rollNextFile: the first queue offset of the file after the one holding ``queue_offset``."""
    units_per_file = mapped_file_size_consume_queue // CQ_STORE_UNIT_SIZE
    return queue_offset + units_per_file - queue_offset % units_per_file

class ConsumeQueue:
    """One queue of one topic (RocketMQ's ConsumeQueue, without the ConsumeQueueExt)."""

    def __init__(self, root: Path, topic: str, queue_id: int,
                 mapped_file_size: int = DEFAULT_MAPPED_FILE_SIZE) -> None:
        if mapped_file_size <= 0 or mapped_file_size % CQ_STORE_UNIT_SIZE:
            raise ValueError(f"mappedFileSizeConsumeQueue {mapped_file_size} is not a multiple of "
                             f"{CQ_STORE_UNIT_SIZE}")
        self.topic = topic
        self.queue_id = queue_id
        self.mapped_file_size = mapped_file_size
        self.store_path = root / topic / str(queue_id)
        # No preallocation, and sparse files that take blocks a page at a time as units arrive (a broker
        # may have thousands of queues, most of them idle): each page is reserved before it is
        # written, so a full disk is a DiskFullError, never a SIGBUS in the mapping.
        self.mapped_file_queue = MappedFileQueue(self.store_path, mapped_file_size, preallocate=False,
                                                 reserve_step=OS_PAGE_SIZE)
        #: commitlog offset + size of the last unit put or recovered (-1: none). Units ending at or
        #: below it are re-dispatches and are skipped.
        self.max_physic_offset = -1
        #: byte offset of the first unit pointing at a commitlog record that still exists.
        self.min_logic_offset = 0
        #: (file start, page index) of the page holding the last unit this process wrote, and the
        #: store time of the first unit written into that page since it was clean (0: unknown): the
        #: mtime a broker's writes would have left on the file.
        self._last_page = (-1, -1)
        self._last_page_store_time = 0
        self._last_page_flushed = False

    def __repr__(self) -> str:
        return (f"ConsumeQueue({self.topic}/{self.queue_id}, min={self.min_offset_in_queue}, "
                f"max={self.max_offset_in_queue}, maxPhysicOffset={self.max_physic_offset})")

    # -- offsets -------------------------------------------------------------------------------
    @property
    def min_offset_in_queue(self) -> int:
        return self.min_logic_offset // CQ_STORE_UNIT_SIZE

    @property
    def max_offset_in_queue(self) -> int:
        """The next queue offset to be written (number of units, counting from 0)."""
        return self.mapped_file_queue.max_offset // CQ_STORE_UNIT_SIZE

    @property
    def message_total_in_queue(self) -> int:
        return self.max_offset_in_queue - self.min_offset_in_queue

    def roll_next_file(self, queue_offset: int) -> int:
        """The first queue offset of the file after the one holding ``queue_offset`` (a reader skipping a hole)."""
        return roll_next_file(queue_offset, self.mapped_file_size)

    # -- load and recovery ---------------------------------------------------------------------
    def load(self) -> None:
        self.mapped_file_queue.load()

    def recover(self) -> None:
        """Find the end of the data after a restart: walk the last 3 files from their first unit and
        stop at the first invalid unit. Files before them are taken as full, as RocketMQ does."""
        files = self.mapped_file_queue.files
        if not files:
            return
        end = 0
        for mapped in files[max(len(files) - 3, 0):]:
            position, max_physic = self._scan(mapped, None)
            if max_physic >= 0:
                self.max_physic_offset = max_physic
            end = mapped.file_from_offset + position
            if position != mapped.file_size:
                break
        log.debug("recovered %s/%d to byte %d", self.topic, self.queue_id, end)
        self._cut(end)

    def truncate_dirty_logic_files(self, commitlog_offset: int) -> None:
        """Drop every unit pointing at or past ``commitlog_offset``: the commitlog was cut there by a
        crash recovery, so those units point at nothing or at a different, later record."""
        self.max_physic_offset = commitlog_offset
        self._forget_page()  # the units left are older: their store times are not known here
        queue = self.mapped_file_queue
        while (last := queue.last_file()) is not None:
            position, max_physic = self._scan(last, commitlog_offset)
            if position == 0:
                queue.delete_last_file()
                continue
            if max_physic >= 0:
                self.max_physic_offset = max_physic
            self._cut(last.file_from_offset + position)
            return
        queue.flushed_where = queue.committed_where = 0

    def _scan(self, mapped: MappedFile, limit: int | None) -> tuple[int, int]:
        """Leading units of a file that are valid (and, with ``limit``, point below it).
        Returns (byte position after them, commitlog offset + size of the last one, -1 for none).
        Filler units do not count for the max: RocketMQ would make it Integer.MAX_VALUE."""
        max_physic = -1
        for chunk_start, chunk in _chunks(mapped, mapped.file_size):
            last = _UNIT.unpack_from(chunk, len(chunk) - CQ_STORE_UNIT_SIZE)
            if limit is None and not _is_filler(*last) and _all_valid(chunk):
                max_physic = last[0] + last[1]
                continue
            for index, (offset, size, tags_code) in enumerate(_UNIT.iter_unpack(chunk)):
                if not is_valid_unit(offset, size) or (limit is not None and offset >= limit):
                    return chunk_start + index * CQ_STORE_UNIT_SIZE, max_physic
                if not _is_filler(offset, size, tags_code):
                    max_physic = offset + size
        return mapped.file_size, max_physic

    def _cut(self, end: int) -> None:
        """Make byte ``end`` the end of the queue. Stale bytes after it are zeroed (an fdatasync)
        only when there are any right at ``end`` or in later files: on a clean restart nothing is
        written, which keeps thousands of queues cheap to open and leaves file mtimes alone
        (getOffsetInQueueByTime picks a file by its mtime)."""
        queue = self.mapped_file_queue
        last = queue.last_file()
        if last is None:
            return
        if last.file_from_offset <= end <= last.file_tail_offset:
            position = end - last.file_from_offset
            if position == last.file_size or last.buffer[position:position + CQ_STORE_UNIT_SIZE] == _ZERO_UNIT:
                last.set_positions(position)
                queue.flushed_where = queue.committed_where = end
                return
        queue.truncate_dirty_files(end)

    def correct_min_offset(self, commitlog_min_offset: int) -> None:
        """RocketMQ 4.9's correctMinOffset: the min logic offset becomes the first unit of the first
        file that points at or past the commitlog's min offset (unchanged when none does). Filler
        units point at 0, so after a restart a pre-blank-filled queue's min offset is its file start."""
        files = self.mapped_file_queue.files
        if not files:
            return
        first = files[0]
        for position, offset, _size, _tags_code in _iter_units(first, first.read_position):
            if offset >= commitlog_min_offset:
                self.min_logic_offset = first.file_from_offset + position
                return

    # -- writing -------------------------------------------------------------------------------
    def put_message_position_info(self, commitlog_offset: int, size: int, tags_code: int,
                                  queue_offset: int, store_timestamp: int = 0) -> bool:
        """Put one unit (RocketMQ's putMessagePositionInfo). True when written or already there."""
        self.put_batch(((commitlog_offset, size, tags_code, queue_offset),), (store_timestamp,))
        return True

    def put_batch(self, units: Sequence[Unit], store_timestamps: Sequence[int] | None = None,
                  lost: Sequence[tuple[int, int]] = ()) -> int:
        """Put units in dispatch order with putMessagePositionInfo's rules, one append per run of
        consecutive units in a file. Returns how many were written. ``store_timestamps`` (one per
        unit, 0 for unknown) are the records' store times, for the files' mtimes.

        - a unit ending at or below ``max_physic_offset``, or whose queue offset lies below the write
          position, was written before: skipped (re-dispatch changes nothing);
        - a queue's first file that starts past queue offset 0 gets filler units before the first one;
        - a gap (queue offset past the write position) is logged as an error and the unit is still
          appended at the write position, as RocketMQ does; except when one of the ``lost`` commitlog
          ranges (quarantined by the commitlog's recovery: their records are gone) lies between the
          queue's last unit and this one: the gap is the lost records' queue offsets, filled with filler
          units (a pull skips them) so the later units keep their own queue offsets.
        """
        written = skipped = 0
        index, count = 0, len(units)
        while index < count:
            commitlog_offset, size, _tags, queue_offset = units[index]
            if commitlog_offset + size <= self.max_physic_offset:
                skipped += 1
                index += 1
                continue
            mapped = self._file_for(queue_offset)
            expected = queue_offset * CQ_STORE_UNIT_SIZE
            current = mapped.file_from_offset + mapped.wrote_position
            if queue_offset != 0 and expected < current:
                skipped += 1
                index += 1
                continue
            if queue_offset != 0 and expected > current and self._lost_before(lost, commitlog_offset):
                self._fill_gap((expected - current) // CQ_STORE_UNIT_SIZE, current)
                continue  # this unit again, now at its place
            if queue_offset != 0 and expected != current:
                log.error("[BUG]logic queue order maybe wrong, expectLogicOffset: %d currentLogicOffset: %d "
                          "Topic: %s QID: %d Diff: %d", expected, current, self.topic, self.queue_id,
                          expected - current)
            end = self._run_end(units, index, mapped.remaining // CQ_STORE_UNIT_SIZE) \
                if expected == current else index + 1
            start_position = mapped.wrote_position
            self._append(mapped, units, index, end)
            self._note_store_times(mapped, start_position, store_timestamps, index, end)
            written += end - index
            index = end
        if skipped:
            log.info("%s/%d: %d units were already built (maybe a repeated dispatch), skipped",
                     self.topic, self.queue_id, skipped)
        return written

    def put_packed(self, data: bytes | memoryview, start: int, end: int, first_queue_offset: int, last_end: int,
                   store_timestamps: Sequence[int] | np.ndarray) -> bool:
        """Append units ``start:end`` of ``data`` (packed 20-byte units) when they go right at the
        write position: the caller checked that their queue offsets are consecutive from ``first_queue_offset``,
        that each ends past the one before, and that the first ends past max_physic_offset. False,
        writing nothing, when the write position is not at ``first_queue_offset`` (then put_batch's rules
        apply). ``last_end`` is the last unit's commitlog offset + size; ``store_timestamps`` are
        indexed like ``data``'s units."""
        mapped = self._file_for(first_queue_offset)
        if first_queue_offset * CQ_STORE_UNIT_SIZE != mapped.file_from_offset + mapped.wrote_position:
            return False
        index = start
        while True:
            run_end = min(end, index + mapped.remaining // CQ_STORE_UNIT_SIZE)
            start_position = mapped.wrote_position
            mapped.append(data[index * CQ_STORE_UNIT_SIZE:run_end * CQ_STORE_UNIT_SIZE])
            self._note_store_times(mapped, start_position, store_timestamps, index, run_end)
            index = run_end
            if index >= end:
                break
            mapped = self._file_for(first_queue_offset + index - start)
            self._check_unit_position(mapped, first_queue_offset + index - start)
        self.max_physic_offset = last_end
        return True

    def _check_unit_position(self, mapped: MappedFile, queue_offset: int) -> None:
        """The unit of ``queue_offset`` goes at byte ``queue_offset * 20`` of the queue, nowhere else: a
        pull reads it there."""
        position = mapped.file_from_offset + mapped.wrote_position
        if position != queue_offset * CQ_STORE_UNIT_SIZE:
            broken("ConsumeQueue units are written at their queue offset",
                   f"{self.topic}/{self.queue_id}: the unit of queue offset {queue_offset} would go to byte "
                   f"{position}, the place of queue offset {position / CQ_STORE_UNIT_SIZE:g}")

    def void_units(self, start: int, end: int) -> int:
        """Turn the units pointing into commitlog [start, end) (a range the commitlog quarantined: their
        records are lost) into filler units, so that none points at damaged bytes and a pull skips them.
        Units are in commitlog order, so the search runs from the last unit back to the first one
        below ``start``: it costs the units past the range. The change is msync'd at once. Returns the
        number of units changed."""
        changed = 0
        if self.max_physic_offset > start:
            changed = self._void_units_from_the_end(start, end)
        if changed:
            log.warning("%s/%d: %d units pointed into the quarantined commitlog range [%d, %d) (records lost): "
                        "now filler units", self.topic, self.queue_id, changed, start, end)
        return changed

    def _void_units_from_the_end(self, start: int, end: int) -> int:
        changed = 0
        for mapped in reversed(self.mapped_file_queue.files):
            buf = mapped.buffer
            for position in range(mapped.read_position - CQ_STORE_UNIT_SIZE, -1, -CQ_STORE_UNIT_SIZE):
                offset, size, tags_code = _UNIT.unpack_from(buf, position)
                if _is_filler(offset, size, tags_code) or offset >= end:
                    continue
                if offset < start:
                    return changed
                buf[position:position + CQ_STORE_UNIT_SIZE] = BLANK_UNIT
                page = position - position % OS_PAGE_SIZE
                buf.flush(page, min(OS_PAGE_SIZE, mapped.file_size - page))
                changed += 1
        return changed

    def _lost_before(self, lost: Sequence[tuple[int, int]], commitlog_offset: int) -> bool:
        return any(self.max_physic_offset <= start and end <= commitlog_offset for start, end in lost)

    def _fill_gap(self, count: int, position: int) -> None:
        log.warning("%s/%d: %d queue offsets from %d belong to records lost in a quarantined commitlog range: "
                    "filled with filler units", self.topic, self.queue_id, count, position // CQ_STORE_UNIT_SIZE)
        while count:
            mapped = self._file_for(position // CQ_STORE_UNIT_SIZE)
            here = min(count, mapped.remaining // CQ_STORE_UNIT_SIZE)
            mapped.append(BLANK_UNIT * here)
            count -= here
            position += here * CQ_STORE_UNIT_SIZE

    @staticmethod
    def _run_end(units: Sequence[Unit], start: int, room: int) -> int:
        """End of the run from ``start`` that the unit-by-unit rules would append back to back:
        consecutive queue offsets, each unit ending past the previous one, within the file's room."""
        limit = min(len(units), start + room)
        end = start + 1
        previous_offset, previous_size, _, previous_queue_offset = units[start]
        while end < limit:
            offset, size, _, queue_offset = units[end]
            if queue_offset != previous_queue_offset + 1 or offset + size <= previous_offset + previous_size:
                break
            previous_offset, previous_size, previous_queue_offset = offset, size, queue_offset
            end += 1
        return end

    def _append(self, mapped: MappedFile, units: Sequence[Unit], start: int, end: int) -> None:
        buffer = bytearray(CQ_STORE_UNIT_SIZE * (end - start))
        pack_into = _UNIT.pack_into
        for position, (offset, size, tags_code, _) in zip(
                range(0, len(buffer), CQ_STORE_UNIT_SIZE), units[start:end], strict=True):
            pack_into(buffer, position, offset, size, tags_code)
        mapped.append(buffer)
        last_offset, last_size = units[end - 1][0], units[end - 1][1]
        self.max_physic_offset = last_offset + last_size

    def _note_store_times(self, mapped: MappedFile, start_position: int,
                          store_timestamps: Sequence[int] | np.ndarray | None,
                          start: int, end: int) -> None:
        """After units[start:end] were appended at ``start_position`` of ``mapped``: remember the store
        time of the first unit this process wrote into the page the run ended in, and stamp the file
        with it once the file is complete (nothing writes it again)."""
        page = (mapped.file_from_offset, (mapped.wrote_position - 1) // OS_PAGE_SIZE)
        if page != self._last_page or self._last_page_flushed:
            first_byte = max(page[1] * OS_PAGE_SIZE, start_position)  # the page's first byte of this run
            first = start + (first_byte - start_position) // CQ_STORE_UNIT_SIZE
            self._last_page, self._last_page_flushed = page, False
            self._last_page_store_time = int(store_timestamps[first]) if store_timestamps is not None else 0
        if mapped.is_full and self._last_page_store_time > 0:
            stamp_store_time(mapped.path, self._last_page_store_time)

    def _forget_page(self) -> None:
        self._last_page = (-1, -1)
        self._last_page_store_time = 0
        self._last_page_flushed = False

    def stamp_last_file(self) -> None:
        """Give the last file the mtime a broker's writes would have left, if this process wrote its
        last page (at shutdown, once nothing more is written)."""
        last = self.mapped_file_queue.last_file()
        if last is not None and self._last_page[0] == last.file_from_offset and self._last_page_store_time > 0:
            stamp_store_time(last.path, self._last_page_store_time)

    def _file_for(self, queue_offset: int) -> MappedFile:
        """The file to append to (getLastMappedFile(expectLogicOffset)), created on demand; the
        queue's very first file is pre-filled with blanks up to ``queue_offset`` (fillPreBlank)."""
        queue = self.mapped_file_queue
        last = queue.last_file()
        if last is not None and not last.is_full:
            return last
        first_in_queue = last is None
        make_dirs(self.store_path)
        expected = queue_offset * CQ_STORE_UNIT_SIZE
        mapped = queue.last_file_for_append(expected)
        if first_in_queue and queue_offset != 0 and mapped.wrote_position == 0:
            self.min_logic_offset = expected
            queue.flushed_where = queue.committed_where = expected
            blanks = (expected % self.mapped_file_size) // CQ_STORE_UNIT_SIZE
            if blanks:
                mapped.append(BLANK_UNIT * blanks)
            log.info("fill pre blank space %s %d %d", mapped.path, expected, mapped.wrote_position)
        return mapped

    def flush(self, least_pages: int) -> bool:
        """Flush the file at the flushed position when ``least_pages`` dirty pages are waiting
        (flushConsumeQueueLeastPages = 2; 0 flushes whatever is there). True if anything moved.

        A queue often ends exactly at the end of a full file with no successor yet; there is
        nothing to flush then (MappedFileQueue.flush would fall back to the first file)."""
        queue = self.mapped_file_queue
        last = queue.last_file()
        if last is None or queue.flushed_where >= last.file_tail_offset:
            return False
        before = queue.flushed_where
        moved = queue.flush(least_pages)
        if moved and 0 <= before - self._last_page[0] < self.mapped_file_size:
            # The flush wrote back the file of the last page and so made its pages clean: the next
            # write into that page sets the mtime again, as a broker's would.
            self._last_page_flushed = True
        return moved

    # -- reading -------------------------------------------------------------------------------
    def get_index_buffer(self, start_queue_offset: int) -> bytes | None:
        """The units from ``start_queue_offset`` to the end of the readable part of its file (RocketMQ's
        getIndexBuffer); None below the min logic offset or past the data."""
        offset = start_queue_offset * CQ_STORE_UNIT_SIZE
        if start_queue_offset < 0 or offset < self.min_logic_offset:
            return None
        mapped = self.mapped_file_queue.find_by_offset(offset)
        if mapped is None:
            return None
        position = offset - mapped.file_from_offset
        readable = mapped.read_position
        if position >= readable:
            return None
        return mapped.read(position, readable - position)

    def get_units(self, start_queue_offset: int, max_count: int) -> list[Unit]:
        """Up to ``max_count`` units from ``start_queue_offset`` on, across files, as
        (commitlog offset, size, tags code, queue offset); empty below the min offset or past the end."""
        units: list[Unit] = []
        queue_offset = start_queue_offset
        while len(units) < max_count:
            buffer = self.get_index_buffer(queue_offset)
            if buffer is None:
                break
            wanted = min(max_count - len(units), len(buffer) // CQ_STORE_UNIT_SIZE)
            view = memoryview(buffer)[:wanted * CQ_STORE_UNIT_SIZE]
            units.extend((offset, size, tags_code, queue_offset + i)
                         for i, (offset, size, tags_code) in enumerate(_UNIT.iter_unpack(view)))
            queue_offset += wanted
        return units

    def get_offset_in_queue_by_time(self, timestamp: int, store_time_of: StoreTimeOf,
                                    min_physic_offset: int = 0) -> int:
        """RocketMQ 4.9.8's getOffsetInQueueByTime: take the first file whose mtime (ms) is at or
        after ``timestamp`` (else the last file), then binary-search it by the records' store time
        and return the queue offset of the nearest unit (a tie goes to the earlier one). 0 for an empty
        queue or an unreadable record. ``min_physic_offset`` is the commitlog's min offset."""
        mapped = self._file_by_time(timestamp)
        if mapped is None or mapped.read_position <= 0:
            return 0
        return offset_in_file_by_time(mapped.buffer, mapped.file_from_offset, mapped.read_position,
                                      self.min_logic_offset, timestamp, store_time_of, min_physic_offset)

    def _file_by_time(self, timestamp: int) -> MappedFile | None:
        """MappedFileQueue.getMappedFileByTime: by file mtime, not by the data in the file."""
        files = self.mapped_file_queue.files
        if not files:
            return None
        for mapped in files:
            if last_modified_ms(mapped.path) >= timestamp:
                return mapped
        return files[-1]

    # -- lifecycle -----------------------------------------------------------------------------
    def destroy(self) -> None:
        """Delete every file of the queue and forget its offsets."""
        self.max_physic_offset = -1
        self.min_logic_offset = 0
        self._forget_page()
        self.mapped_file_queue.destroy()

    def shutdown(self) -> None:
        """Unmap every file, the last one once it has its mtime (``stamp_last_file``)."""
        self.stamp_last_file()
        self.mapped_file_queue.shutdown()


class _StoreTimes(Sequence[int]):
    """The store times of a queue's requests, read only where put_batch asks (a few per file)."""

    __slots__ = ("_requests",)

    def __init__(self, requests: Sequence[DispatchRequest]) -> None:
        self._requests = requests

    def __len__(self) -> int:
        return len(self._requests)

    @overload
    def __getitem__(self, index: int) -> int: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[int]: ...

    def __getitem__(self, index: int | slice) -> int | Sequence[int]:
        if isinstance(index, slice):
            return [r.store_timestamp for r in self._requests[index]]
        return self._requests[index].store_timestamp


def _queue_id_of(directory: Path) -> int | None:
    """A queue directory's id: canonical decimal only, since ConsumeQueue rebuilds its path from it."""
    name = directory.name
    if name.isdigit() and str(int(name)) == name:
        return int(name)
    return None


def _utf16_order(text: str) -> bytes:
    """Java String.compareTo order (UTF-16 code units), as RocketMQ's sorted listings use."""
    return text.encode("utf-16-be", "surrogatepass")


class ConsumeQueueStore:
    """All ConsumeQueues under one ``consumequeue`` root (DefaultMessageStore's consumeQueueTable)."""

    def __init__(self, root: Path, mapped_file_size: int = DEFAULT_MAPPED_FILE_SIZE, *,
                 columnar_min_records: int = COLUMNAR_MIN_RECORDS) -> None:
        self.root = root
        self.mapped_file_size = mapped_file_size
        self.columnar_min_records = columnar_min_records
        self._table: dict[str, dict[int, ConsumeQueue]] = {}
        self._lock = threading.Lock()
        #: Commitlog ranges the commitlog quarantined ([start, end), from GetStoreInfo): a queue gap across
        #: one is filled with filler units (put_batch).
        self.lost_ranges: tuple[tuple[int, int], ...] = ()
        #: store timestamp of the last record put into a queue: the checkpoint's logicsMsgTimestamp
        #: once the queues are flushed.
        self.logics_msg_timestamp = 0

    def find(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        return self._table.get(topic, {}).get(queue_id)

    def find_or_create(self, topic: str, queue_id: int) -> ConsumeQueue:
        """The queue, created in memory if new (its directory appears with its first unit)."""
        queue = self.find(topic, queue_id)
        if queue is not None:
            return queue
        with self._lock:
            queues = self._table.setdefault(topic, {})
            queue = queues.get(queue_id)
            if queue is None:
                queue = ConsumeQueue(self.root, topic, queue_id, self.mapped_file_size)
                queues[queue_id] = queue
            return queue

    def remove_topic(self, topic: str) -> list[ConsumeQueue]:
        """Takes every queue of ``topic`` out of the table (the caller destroys them): a later unit of
        the topic starts a new queue."""
        with self._lock:
            queues = self._table.pop(topic, {})
        return [queues[queue_id] for queue_id in sorted(queues)]

    def queues(self) -> list[ConsumeQueue]:
        """Every queue, topics in Java string order, queue ids ascending. A snapshot: the dispatcher
        may add queues meanwhile."""
        with self._lock:
            table = [(topic, dict(queues)) for topic, queues in self._table.items()]
        table.sort(key=lambda item: _utf16_order(item[0]))
        return [queues[queue_id] for _, queues in table for queue_id in sorted(queues)]

    # -- startup -------------------------------------------------------------------------------
    def load_all(self) -> None:
        """Map every queue found under the root (loadConsumeQueue). Directories whose name is not a
        queue id are skipped with a warning."""
        if not self.root.is_dir():
            return
        for topic_dir in sorted(p for p in self.root.iterdir() if p.is_dir()):
            for queue_dir in sorted(p for p in topic_dir.iterdir() if p.is_dir()):
                queue_id = _queue_id_of(queue_dir)
                if queue_id is None:
                    log.warning("skipping %s: not a queue id", queue_dir)
                    continue
                self.find_or_create(topic_dir.name, queue_id).load()

    def recover_all(self) -> int:
        """Recover every queue; returns the max commitlog offset + size they cover (-1: none)."""
        for queue in self.queues():
            queue.recover()
        return self.max_physic_offset()

    def correct_min_offset(self, commitlog_min_offset: int) -> None:
        for queue in self.queues():
            queue.correct_min_offset(commitlog_min_offset)

    def max_physic_offset(self) -> int:
        """Where dispatch resumes: the largest commitlog offset + size of any queue (-1: none)."""
        return max((queue.max_physic_offset for queue in self.queues()), default=-1)

    def truncate_dirty(self, commitlog_offset: int) -> None:
        """The commitlog now ends at ``commitlog_offset``: drop units pointing at or past it."""
        for queue in self.queues():
            queue.truncate_dirty_logic_files(commitlog_offset)

    def void_units(self, ranges: Sequence[tuple[int, int]]) -> int:
        """ConsumeQueue.void_units over every queue for every [start, end) of ``ranges``."""
        return sum(queue.void_units(start, end) for queue in self.queues() for start, end in ranges)

    # -- dispatch ------------------------------------------------------------------------------
    def dispatch_batch(self, requests: Iterable[DispatchRequest]) -> int:
        """Put the units of a chunk of records, in commitlog order (CommitLogDispatcherBuildConsumeQueue).
        BLANK and invalid requests, and PREPARED and ROLLBACK transaction records, are not queued.
        Returns the number of units written."""
        return self.dispatch_columns(DispatchColumns(requests))

    def _dispatch_records(self, requests: Iterable[DispatchRequest]) -> int:
        """dispatch_batch record by record: for chunks of a few records."""
        grouped: dict[tuple[str, int], list[DispatchRequest]] = {}
        last: DispatchRequest | None = None
        tx_mask, prepared, rollback = TRANSACTION_TYPE_MASK, TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE
        for request in requests:
            if not request.success or request.msg_size <= 0:
                continue
            tx = request.sys_flag & tx_mask
            if tx in (prepared, rollback):
                continue
            key = (request.topic, request.queue_id)
            queued = grouped.get(key)
            if queued is None:
                queued = grouped[key] = []
            queued.append(request)
            last = request
        written = 0
        for (topic, queue_id), queued in grouped.items():
            units = [(r.commitlog_offset, r.msg_size, r.tags_code, r.queue_offset) for r in queued]
            written += self.find_or_create(topic, queue_id).put_batch(units, _StoreTimes(queued), self.lost_ranges)
        if last is not None:
            self.logics_msg_timestamp = last.store_timestamp
        return written

    def dispatch_columns(self, columns: DispatchColumns) -> int:
        """:meth:`dispatch_batch` for a chunk already in columns. The whole chunk's units are packed
        with one numpy operation (queue by queue, each queue's in commitlog order) and each queue
        appends its slice, once per file (ConsumeQueue.put_packed), so the Python work per queue is
        a few calls whatever its number of units. A queue whose units are not each right after the
        one before (a gap, a re-dispatch) takes put_batch. Chunks of a few records take the
        per-record path, whose fixed cost is lower."""
        if columns.count < self.columnar_min_records:
            return self._dispatch_records(columns.requests)
        rows, bounds, queues = columns.queue_groups
        if not queues:
            return 0
        offsets, sizes = columns.commitlog_offset[rows], columns.msg_size[rows]
        tags_codes, queue_offsets = columns.tags_code[rows], columns.queue_offset[rows]
        timestamps = columns.store_timestamp[rows]
        ends = offsets + sizes
        packed = np.empty(rows.size, dtype=_UNIT_DTYPE)
        packed["offset"], packed["size"], packed["tags_code"] = offsets, sizes, tags_codes
        data = memoryview(packed.tobytes())
        # links between neighbours that break a run; counted so that a queue's share is a subtraction
        broken = np.zeros(rows.size, dtype=np.int64)
        np.cumsum((queue_offsets[1:] != queue_offsets[:-1] + 1) | (ends[1:] <= ends[:-1]), out=broken[1:])
        starts, lasts = bounds[:-1], [end - 1 for end in bounds[1:]]
        first_queue_offset, first_end = queue_offsets[starts].tolist(), ends[starts].tolist()
        last_end, breaks = ends[lasts].tolist(), (broken[lasts] - broken[starts]).tolist()
        written = 0
        for i, (topic, queue_id) in enumerate(queues):
            queue = self.find_or_create(topic, queue_id)
            start, end = starts[i], bounds[i + 1]
            if breaks[i] == 0 and first_end[i] > queue.max_physic_offset \
                    and queue.put_packed(data, start, end, first_queue_offset[i], last_end[i], timestamps):
                written += end - start
                continue
            units = list(zip(offsets[start:end].tolist(), sizes[start:end].tolist(), tags_codes[start:end].tolist(),
                             queue_offsets[start:end].tolist(), strict=True))
            written += queue.put_batch(units, timestamps[start:end].tolist(), self.lost_ranges)
        self.logics_msg_timestamp = int(columns.store_timestamp[int(rows.max())])
        return written

    # -- flush and shutdown --------------------------------------------------------------------
    def flush_all(self, least_pages: int) -> bool:
        """One flush round over every queue (FlushConsumeQueueService). True if anything was flushed."""
        flushed = False
        for queue in self.queues():
            flushed = queue.flush(least_pages) or flushed
        return flushed

    def flush_everything(self) -> None:
        """Make every unit written so far durable. A round of :meth:`flush_all` flushes one file per
        queue, so the units a queue wrote into a new file after the last round (past a roll) would stay
        in the page cache: a checkpoint that covers them must wait for this instead."""
        for queue in self.queues():
            self._flush_fully(queue)

    def shutdown(self) -> None:
        """Flush everything, then unmap every file."""
        for queue in self.queues():
            self._flush_fully(queue)
            queue.shutdown()

    @staticmethod
    def _flush_fully(queue: ConsumeQueue) -> None:
        while queue.flush(0):
            pass
