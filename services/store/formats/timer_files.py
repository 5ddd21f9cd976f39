"""The scheduler's timer store under ``<scheduler store>/timer/``: a time-bucketed log on disk.

Three files (RocketMQ 5's TimerMessageStore keeps the same three: timerlog, timerwheel, timercheck):

* ``timerlog``: append-only, one fixed 56-byte unit per timer message taken in (``>iqqqqiqq``: magic,
  the second it is filed under, deliver ms, enqueue ms, commitlog offset, size, rmq_sys_wheel_timer
  queue offset, position of the previous unit of the same second or -1). The units of one second form
  a list, newest first. A unit is filed under its deliver second, or under the next second to deliver
  when that one has passed already (overdue on arrival).
* ``timerwheel``: ``slots`` fixed 24-byte slots (``>qqq``: the second it holds, position of its newest
  unit or -1, unit count); second ``s`` lives in slot ``s % slots``. A slot holding another second is
  reused: the store never takes in a second ``slots`` or more ahead of the delivered-up-to second,
  so a reused slot always held a second already delivered.
* ``timercheck``: JSON, written atomically after both files are fsynced: the next queue offset to take
  in (``enqueueOffset``), the timerlog length covering exactly the units of the offsets below it
  (``timerLogPos``), the first second not yet wholly delivered (``deliveredSecond``), the timerlog
  positions of the units of that second or later already delivered (``donePositions``), ``slots``,
  and the commitlog offset from which re-puts not counted yet may lie (``scanFromOffset``).

Recovery (:meth:`TimerFiles.open`) undoes the units past ``timerLogPos`` (taken in after the last
checkpoint, taken in again from ``enqueueOffset``): newest first, each is unlinked from its slot when
the slot still points at it, then the log is cut at ``timerLogPos``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import json
import logging
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from services.store.store_root import fsync_dir, make_dirs, read_with_backup, write_atomically

log = logging.getLogger(__name__)

TIMER_DIR = "timer"
LOG_NAME = "timerlog"
WHEEL_NAME = "timerwheel"
CHECK_NAME = "timercheck"

UNIT_MAGIC = 0x54494D31  # "TIM1"
_UNIT = struct.Struct(">iqqqqiqq")
UNIT_SIZE = _UNIT.size
_SLOT = struct.Struct(">qqq")
SLOT_SIZE = _SLOT.size
_READ_BLOCK = 1024 * UNIT_SIZE
#: units per chunk of the timerlog whose disk space is given back once all its seconds are delivered
CHUNK_UNITS = 1 << 20
_FALLOC_FL_KEEP_SIZE = 0x01
_FALLOC_FL_PUNCH_HOLE = 0x02


def _punch_hole(fd: int, offset: int, length: int) -> bool:
    """Give ``length`` bytes at ``offset`` back to the file system (Linux fallocate PUNCH_HOLE): the file
    keeps its size and reads of the range give zeros. False where that is not supported."""
    fallocate = _fallocate()
    return fallocate is not None and fallocate(fd, _FALLOC_FL_KEEP_SIZE | _FALLOC_FL_PUNCH_HOLE, offset, length) == 0


@functools.cache
def _fallocate() -> Any:
    libc_name = ctypes.util.find_library("c")
    fallocate = getattr(ctypes.CDLL(libc_name, use_errno=True), "fallocate", None) if libc_name else None
    if fallocate is not None:
        fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong]
    return fallocate


class TimerUnit(NamedTuple):
    position: int
    second: int
    deliver_ms: int
    enqueue_ms: int
    commitlog_offset: int
    size: int
    queue_offset: int
    prev: int


class Slot(NamedTuple):
    second: int
    last: int
    units: int


@dataclass(slots=True)
class TimerCheckpoint:
    enqueue_offset: int = 0
    timer_log_pos: int = 0
    delivered_second: int = 0
    slots: int = 0
    done_positions: list[int] = field(default_factory=list)
    #: per timerlog chunk not given back yet (index -> the latest second filed in it)
    chunk_seconds: dict[int, int] = field(default_factory=dict)
    #: a commitlog offset at or below every re-put this checkpoint does not count (None: not recorded)
    scan_from: int | None = None
    #: the enqueue offset when ``delivered_second`` began: every unit before it was filed under an earlier
    #: second unless its own second is this one or later (a replicated shard's TimerProgress needs it)
    second_enqueue_offset: int = 0

    def to_json(self) -> bytes:
        doc: dict[str, Any] = {"enqueueOffset": self.enqueue_offset, "timerLogPos": self.timer_log_pos,
                               "deliveredSecond": self.delivered_second, "slots": self.slots,
                               "donePositions": self.done_positions,
                               "chunkSeconds": {str(k): v for k, v in sorted(self.chunk_seconds.items())}}
        if self.scan_from is not None:
            doc["scanFromOffset"] = self.scan_from
        if self.second_enqueue_offset:
            doc["secondEnqueueOffset"] = self.second_enqueue_offset
        return json.dumps(doc).encode()

    @classmethod
    def parse(cls, data: bytes) -> TimerCheckpoint:
        doc = json.loads(data)
        if not isinstance(doc, dict):
            raise ValueError("not a JSON object")
        check = cls(int(doc["enqueueOffset"]), int(doc["timerLogPos"]), int(doc["deliveredSecond"]),
                    int(doc["slots"]), [int(p) for p in doc.get("donePositions", [])],
                    {int(k): int(v) for k, v in doc.get("chunkSeconds", {}).items()},
                    None if doc.get("scanFromOffset") is None else int(doc["scanFromOffset"]),
                    int(doc.get("secondEnqueueOffset", 0)))
        if min(check.enqueue_offset, check.timer_log_pos, check.delivered_second, check.scan_from or 0) < 0 \
                or check.slots <= 0 or check.timer_log_pos % UNIT_SIZE:
            raise ValueError(f"impossible values {check}")
        return check


def read_checkpoint(path: Path) -> TimerCheckpoint | None:
    """The checkpoint in ``path`` or its ``.bak``; None when neither exists; ValueError when neither reads."""
    return read_with_backup(path, TimerCheckpoint.parse)


class TimerFiles:
    """The timerlog and timerwheel files (positioned reads and writes) and the checkpoint."""

    def __init__(self, directory: Path, checkpoint: TimerCheckpoint, chunk_units: int = CHUNK_UNITS) -> None:
        self.directory = directory
        self.checkpoint = checkpoint
        self.slots = checkpoint.slots
        self._chunk_bytes = chunk_units * UNIT_SIZE
        self._chunk_seconds = dict(checkpoint.chunk_seconds)
        self._log = os.open(directory / LOG_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        self._wheel = os.open(directory / WHEEL_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        fsync_dir(directory)  # the names of files just created: their fsyncs do not cover them
        self.log_end = os.fstat(self._log).st_size // UNIT_SIZE * UNIT_SIZE
        # Write-behind (flush_writes): the units appended since, from position _written, and the slots
        # changed since, by slot index. Reads see them.
        self._written = self.log_end
        self._pending = bytearray()
        self._dirty_slots: dict[int, Slot] = {}

    @classmethod
    def open(cls, store: Path, slots: int, chunk_units: int = CHUNK_UNITS) -> TimerFiles:
        """Open (or create) ``store/timer``; a new store gets ``slots`` slots, an existing one keeps its
        count. ValueError when the checkpoint is unreadable."""
        directory = store / TIMER_DIR
        make_dirs(directory)
        checkpoint = read_checkpoint(directory / CHECK_NAME)
        fresh = checkpoint is None
        files = cls(directory, checkpoint or TimerCheckpoint(slots=slots), chunk_units)
        if fresh:
            os.ftruncate(files._log, 0)
            os.ftruncate(files._wheel, 0)
            files.log_end = 0
        files._recover()
        return files

    def _recover(self) -> None:
        keep = self.checkpoint.timer_log_pos
        if self.log_end < keep:
            raise ValueError(f"{self.directory / LOG_NAME} is {self.log_end} bytes, shorter than the "
                             f"checkpoint's timerLogPos {keep}: the timer store is damaged")
        position = self.log_end - UNIT_SIZE
        while position >= keep:
            unit = self.unit(position)
            slot = self.slot_at(unit.second)
            if slot.second == unit.second and slot.last == position:
                self.write_slot(slot._replace(last=unit.prev, units=max(0, slot.units - 1)))
            position -= UNIT_SIZE
        self.flush_writes()
        os.ftruncate(self._log, keep)
        self.log_end = self._written = keep

    # -- units ---------------------------------------------------------------------------------
    def unit(self, position: int) -> TimerUnit:
        if position >= self._written:
            data = bytes(self._pending[position - self._written:position - self._written + UNIT_SIZE])
        else:
            data = os.pread(self._log, UNIT_SIZE, position)
        return self._decode(position, data)

    @staticmethod
    def _decode(position: int, data: bytes | memoryview) -> TimerUnit:
        if len(data) < UNIT_SIZE:
            raise ValueError(f"timerlog unit at {position} is cut short")
        magic, *fields = _UNIT.unpack_from(data)
        if magic != UNIT_MAGIC:
            raise ValueError(f"timerlog unit at {position} has magic {magic:#x}")
        return TimerUnit(position, *fields)

    def append(self, second: int, deliver_ms: int, enqueue_ms: int, commitlog_offset: int, size: int,
               queue_offset: int) -> TimerUnit:
        """File a unit under ``second`` (the caller keeps it within ``slots`` of the delivered second)."""
        slot = self.slot(second)
        position = self.log_end
        unit = TimerUnit(position, second, deliver_ms, enqueue_ms, commitlog_offset, size, queue_offset, slot.last)
        self._pending += _UNIT.pack(UNIT_MAGIC, *unit[1:])
        self.log_end = position + UNIT_SIZE
        chunk = position // self._chunk_bytes
        if self._chunk_seconds.get(chunk, -1) < second:
            self._chunk_seconds[chunk] = second
        self._dirty_slots[second % self.slots] = Slot(second, position, slot.units + 1)
        return unit

    def flush_writes(self) -> None:
        """Write the units and slots appended since the last call (one write for the units, one per
        slot changed): the scheduler calls it after each round of taking in."""
        if self._pending:
            os.pwrite(self._log, self._pending, self._written)
            self._written += len(self._pending)
            self._pending = bytearray()
        for slot in self._dirty_slots.values():
            os.pwrite(self._wheel, _SLOT.pack(*slot), (slot.second % self.slots) * SLOT_SIZE)
        self._dirty_slots.clear()

    def units_of(self, second: int) -> list[TimerUnit]:
        """The units filed under ``second``, oldest first. The list is walked newest first through
        blocks of the log (a second's units mostly lie close together); a unit of another second ends
        the walk (a slot left pointing past the log by a power loss)."""
        self.flush_writes()
        slot = self.slot(second)
        found: list[TimerUnit] = []
        position = slot.last
        block_start, block = 0, b""
        while 0 <= position < self.log_end and len(found) < slot.units:
            if not block_start <= position <= block_start + len(block) - UNIT_SIZE:
                block_start = max(0, position + UNIT_SIZE - _READ_BLOCK)
                block = os.pread(self._log, position + UNIT_SIZE - block_start, block_start)
            unit = self._decode(position, memoryview(block)[position - block_start:])
            if unit.second != second:
                break
            found.append(unit)
            position = unit.prev
        found.reverse()
        return found

    # -- slots ---------------------------------------------------------------------------------
    def slot_at(self, second: int) -> Slot:
        """The raw slot ``second`` maps to (whatever second it holds)."""
        dirty = self._dirty_slots.get(second % self.slots)
        if dirty is not None:
            return dirty
        data = os.pread(self._wheel, SLOT_SIZE, (second % self.slots) * SLOT_SIZE)
        if len(data) < SLOT_SIZE or data == bytes(SLOT_SIZE):
            return Slot(-1, -1, 0)
        return Slot(*_SLOT.unpack(data))

    def slot(self, second: int) -> Slot:
        """The slot of ``second``: empty when it holds another second (or nothing)."""
        slot = self.slot_at(second)
        return slot if slot.second == second else Slot(second, -1, 0)

    def write_slot(self, slot: Slot) -> None:
        self._dirty_slots[slot.second % self.slots] = slot

    # -- checkpoint ----------------------------------------------------------------------------
    def save(self, enqueue_offset: int, delivered_second: int, done_positions: list[int],
             log_pos: int | None = None, scan_from: int | None = None, second_enqueue_offset: int = 0) -> None:
        """Make the units and slots so far durable, then record how far both sides got. ``log_pos``:
        the timerlog length that goes with ``enqueue_offset`` (default: the length now); ``scan_from``:
        the commitlog offset from which re-puts not counted here may lie. The writes must have been
        flushed (:meth:`flush_writes`, in the thread that appends)."""
        log_pos = self.log_end if log_pos is None else log_pos
        if log_pos > self._written:
            raise ValueError(f"checkpoint at timerlog position {log_pos}, past what was written ({self._written})")
        os.fsync(self._log)
        os.fsync(self._wheel)
        chunks = {chunk: second for chunk, second in list(self._chunk_seconds.items())
                  if chunk * self._chunk_bytes < log_pos}
        # Whole chunks below log_pos whose every second is delivered: nothing will read them again.
        spent = [chunk for chunk, second in chunks.items()
                 if second < delivered_second and (chunk + 1) * self._chunk_bytes <= log_pos]
        for chunk in spent:
            del chunks[chunk]
        self.checkpoint = TimerCheckpoint(enqueue_offset, log_pos, delivered_second, self.slots, done_positions,
                                          chunks, scan_from, second_enqueue_offset)
        write_atomically(self.directory / CHECK_NAME, self.checkpoint.to_json(), keep_backup=True)
        for chunk in spent:  # after the checkpoint that no longer lists them
            self._chunk_seconds.pop(chunk, None)
            if not _punch_hole(self._log, chunk * self._chunk_bytes, self._chunk_bytes):
                log.debug("timerlog chunk %d could not be given back (no hole punching here)", chunk)

    def close(self) -> None:
        self.flush_writes()
        os.close(self._log)
        os.close(self._wheel)
