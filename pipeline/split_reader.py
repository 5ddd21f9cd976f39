"""Byte-range splits of a commitlog, so parallelism is not capped by the number of (1 GiB) files.

A split is a range ``[start, end)`` of one file. It owns every record that *starts* inside it: a split
that starts mid-file resynchronises to the first record boundary at or after ``start``, and its walk
goes on past ``end`` to finish the record that crosses it. A boundary is a candidate position with

* a message magic code at +4 and PHYSICALOFFSET equal to the position's own commitlog offset, and
  TOTALSIZE chaining to another record header, a BLANK that fills the file, or (for the last record
  of the data, followed by zeros) a record that decodes and passes its body CRC; or
* a BLANK magic code at +4 with TOTALSIZE equal to the bytes left in the file.

Resynchronisation is a pure function of the file's bytes, so neighbouring splits agree on where a
record starts and every record is read exactly once, whatever the split size. What is not a record is
reported as a :class:`Gap` with its commitlog offset: zeros (the unused tail of the last file, or a
hole) or corrupt bytes. Workers only need this module and ``services.store`` (struct, zlib, mmap).
"""

from __future__ import annotations

import errno
import mmap
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.fs import local_path
from services.store.formats.commitlog_walk import CommitLogFile, list_commitlog_files
from services.store.formats.record import (
    BLANK_MAGIC_CODE,
    END_FILE_MIN_BLANK_LENGTH,
    MESSAGE_MAGIC_CODE,
    MESSAGE_MAGIC_CODE_V2,
    MIN_RECORD_LENGTH,
    PHYSICAL_OFFSET_POS,
    SIZE_AND_MAGIC,
    check_record,
)

DEFAULT_SPLIT_SIZE = 64 * 1024 * 1024
HEADER_CHECK_LENGTH = PHYSICAL_OFFSET_POS + 8
# The first 3 bytes of both message magic codes (0xDAA320A7 and 0xDAA320AB), and the BLANK magic.
_MESSAGE_MAGIC_PREFIX = MESSAGE_MAGIC_CODE.to_bytes(4, "big")[:3]
_BLANK_MAGIC = BLANK_MAGIC_CODE.to_bytes(4, "big")
_MESSAGE_MAGICS = (MESSAGE_MAGIC_CODE, MESSAGE_MAGIC_CODE_V2)
# Module level, so workers build them on import: struct.Struct objects do not pickle into closures.
_PHYSICAL_OFFSET = struct.Struct(">q")
_HEAD_CHECK = struct.Struct(f">iI{PHYSICAL_OFFSET_POS - 8}xq")  # TOTALSIZE, MAGICCODE, PHYSICALOFFSET
_ZERO_CHUNK = 1024 * 1024
_ZEROS = bytes(_ZERO_CHUNK)

GAP_ZEROS = "zeros"
GAP_CORRUPT = "corrupt"


@dataclass(frozen=True, slots=True)
class Split:
    """Bytes ``[start, end)`` of the commitlog file at ``path`` (positions within the file)."""

    index: int
    path: str
    file_offset: int
    file_size: int
    start: int
    end: int

    @property
    def offset(self) -> int:
        """Commitlog offset of the split's first byte."""
        return self.file_offset + self.start


@dataclass(frozen=True, slots=True)
class Gap:
    """Bytes that are not records: ``kind`` is zeros (unused or a hole) or corrupt."""

    offset: int
    length: int
    kind: str
    reason: str


@dataclass(slots=True)
class SplitLayout:
    """What a split holds: runs of back-to-back records (file positions ``[start, end)``, the last
    record may cross the split's end), gaps, and the commitlog offset of a BLANK it owns."""

    runs: list[tuple[int, int]] = field(default_factory=list)
    gaps: list[Gap] = field(default_factory=list)
    blank_offset: int | None = None

    @property
    def record_bytes(self) -> int:
        return sum(end - start for start, end in self.runs)


def plan_splits(commitlog_dir: str | Path, split_size: int = DEFAULT_SPLIT_SIZE,
                from_offset: int = 0, files: list[CommitLogFile] | None = None) -> list[Split]:
    """Splits of every file from commitlog offset ``from_offset`` on (a record boundary, or the
    reader resynchronises to the next one), at most ``split_size`` bytes each, never across files."""
    if split_size <= 0:
        raise ValueError(f"split size {split_size} must be positive")
    splits: list[Split] = []
    for file in files if files is not None else list_commitlog_files(commitlog_dir):
        if file.end_offset <= from_offset:
            continue
        position = max(from_offset - file.start_offset, 0)
        while position < file.size:
            end = min(position + split_size, file.size)
            splits.append(Split(len(splits), str(file.path), file.start_offset, file.size, position, end))
            position = end
    return splits


def without_zero_tail(splits: list[Split]) -> list[Split]:
    """``splits`` (a plan of local files) up to the one holding the last non-zero byte of the
    commitlog. What lies after it (a preallocated file's unused tail, a wholly unused next file) holds
    no record and no hole, yet each split there would be a task that maps and compares zeros; the
    splits kept are a prefix of the plan, so every record is read by the same task as before."""
    ends: dict[str, int] = {}
    kept = len(splits)
    while kept:
        split = splits[kept - 1]
        if split.path not in ends:
            ends[split.path] = data_end(split.path, split.file_size)
        if split.start < ends[split.path]:
            break
        kept -= 1
    return splits[:kept]


def data_end(path: str | Path, size: int) -> int:
    """The position after the last non-zero byte among the file's first ``size`` bytes (0: none).
    Only the file's data extents are read, from the end: the holes of a sparse file (how RocketMQ and
    mqstore preallocate) cost nothing."""
    with open(path, "rb") as handle:
        extents = _data_extents(handle.fileno(), size)
        if not extents:
            return 0
        with mmap.mmap(handle.fileno(), size, access=mmap.ACCESS_READ) as mapped:
            for start, end in reversed(extents):
                while end > start:
                    chunk_start = max(end - _ZERO_CHUNK, start)
                    chunk = mapped[chunk_start:end]
                    if chunk != _ZEROS[:len(chunk)]:
                        return chunk_start + len(chunk.rstrip(b"\0"))
                    end = chunk_start
    return 0


def _data_extents(fd: int, size: int) -> list[tuple[int, int]]:
    """``[start, end)`` ranges of the file that may hold data (SEEK_DATA/SEEK_HOLE); the whole file
    where the file system cannot tell."""
    extents: list[tuple[int, int]] = []
    position = 0
    try:
        while position < size:
            start = os.lseek(fd, position, os.SEEK_DATA)
            if start >= size:
                break
            position = min(os.lseek(fd, start, os.SEEK_HOLE), size)
            extents.append((start, position))
    except OSError as exc:
        if exc.errno != errno.ENXIO:  # ENXIO: only a hole is left
            return [(0, size)] if size else []
    except AttributeError:  # no SEEK_DATA on this platform
        return [(0, size)] if size else []
    return extents


class MappedSplit:
    """A read-only mapping of a split's file, as a context manager that releases the view first."""

    def __init__(self, split: Split) -> None:
        self.split = split

    def __enter__(self) -> memoryview:
        with open(local_path(self.split.path, self.split.file_size), "rb") as handle:  # a URI: fetched
            self._map = mmap.mmap(handle.fileno(), self.split.file_size, access=mmap.ACCESS_READ)
        self._view = memoryview(self._map)
        return self._view

    def __exit__(self, *exc_info: object) -> None:
        self._view.release()
        self._map.close()


def _header_ok(view: memoryview, file_offset: int, file_size: int, position: int) -> bool:
    """A message header whose PHYSICALOFFSET names this position and whose size fits the file."""
    if position + HEADER_CHECK_LENGTH > file_size:
        return False
    size, magic = SIZE_AND_MAGIC.unpack_from(view, position)
    if magic not in _MESSAGE_MAGICS or not MIN_RECORD_LENGTH <= size <= file_size - position:
        return False
    return bool(_PHYSICAL_OFFSET.unpack_from(view, position + PHYSICAL_OFFSET_POS)[0] == file_offset + position)


def _blank_ok(view: memoryview, file_size: int, position: int) -> bool:
    """The BLANK record that ends a file: its TOTALSIZE is exactly the bytes left."""
    if position + END_FILE_MIN_BLANK_LENGTH > file_size:
        return False
    size, magic = SIZE_AND_MAGIC.unpack_from(view, position)
    return bool(magic == BLANK_MAGIC_CODE and size == file_size - position)


def _all_zero(view: memoryview, start: int, end: int) -> bool:
    """Whether ``[start, end)`` is all zero bytes (a bytes comparison is a memcmp: ~10 GB/s)."""
    for chunk_start in range(start, end, _ZERO_CHUNK):
        chunk = view[chunk_start:min(chunk_start + _ZERO_CHUNK, end)]
        if chunk.tobytes() != _ZEROS[:len(chunk)]:
            return False
    return True


def _zeros_end(mm: mmap.mmap, start: int, end: int) -> int:
    """The start of the first whole chunk from ``start`` that is not all zeros (or where fewer than a
    chunk is left before ``end``): a magic code cannot start before it. ``find`` crawls through the
    unused tail of a preallocated file at well under 1 GB/s; this compares at memory speed."""
    position = start
    while position + _ZERO_CHUNK <= end and mm[position:position + _ZERO_CHUNK] == _ZEROS:
        position += _ZERO_CHUNK
    return position


def is_boundary(view: memoryview, file_offset: int, file_size: int, position: int) -> bool:
    """Whether a record (or the file's BLANK) starts at ``position``: see the module docstring."""
    if _blank_ok(view, file_size, position):
        return True
    if not _header_ok(view, file_offset, file_size, position):
        return False
    following = position + SIZE_AND_MAGIC.unpack_from(view, position)[0]
    if _header_ok(view, file_offset, file_size, following) or _blank_ok(view, file_size, following):
        return True
    # The last record of the data is followed by zeros (or a torn successor): require it to be whole.
    return bool(check_record(view, position).success)


def resync(view: memoryview, file_offset: int, file_size: int, start: int, limit: int) -> int | None:
    """The first boundary at or after ``start`` and before ``limit`` (file positions), or None.
    Candidates are found with ``find`` on the magic bytes (C speed), then checked."""
    mm = view.obj
    assert isinstance(mm, mmap.mmap)
    position = start
    while position < limit:
        search_end = min(limit + 4 + 4, file_size)
        position = max(position, _zeros_end(mm, position + 4, search_end) - 4)
        if position >= limit:
            return None
        message = mm.find(_MESSAGE_MAGIC_PREFIX, position + 4, search_end)
        # A BLANK counts only before the first message candidate: search no further (a whole split's
        # bytes would be searched for every split that starts mid-file otherwise).
        blank = mm.find(_BLANK_MAGIC, position + 4, search_end if message < 0 else min(search_end, message + 4))
        candidates = [found - 4 for found in (message, blank) if found >= 0 and found - 4 < limit]
        if not candidates:
            return None
        candidate = min(candidates)
        if is_boundary(view, file_offset, file_size, candidate):
            return candidate
        position = candidate + 1
    return None


def scan_split(view: memoryview, split: Split) -> SplitLayout:
    """The layout of one split: walk from its first boundary, record by record, until a record starts
    at or past the split's end. A position that is not a record starts a gap that runs to the next
    boundary (looked for up to the end of the file, so the gap is whole even past the split's end)."""
    file_offset, file_size, end = split.file_offset, split.file_size, split.end
    layout = SplitLayout()
    position: int | None = split.start
    if split.start > 0:
        position = resync(view, file_offset, file_size, split.start, end)
    run_start = position
    while position is not None and position < end:
        position = _skip_records(view, file_offset, file_size, position, end)
        if position >= end:
            break
        if _is_record(view, file_offset, file_size, position):
            position += SIZE_AND_MAGIC.unpack_from(view, position)[0]
            continue
        position, run_start = _stop_run(view, split, layout, position, run_start)
        if layout.blank_offset is not None:
            return layout
    if position is not None and run_start is not None and position > run_start:
        layout.runs.append((run_start, position))
    # A walk that ends at or past the split's end where no record starts owns the gap from there:
    # the next split resynchronises past it and would not report it.
    if position is not None and end <= position < file_size \
            and not is_boundary(view, file_offset, file_size, position):
        _stop_run(view, split, layout, position, None)
    return layout


def _skip_records(view: memoryview, file_offset: int, file_size: int, position: int, end: int) -> int:
    """The walk's common case at a few hundred nanoseconds a record: follow TOTALSIZE from
    ``position`` while every header passes :func:`_header_ok`, inlined. A record whose successor's
    header passes is a record by :func:`is_boundary`'s rules, so the walk may skip it. Returns the
    last position whose header passed (its own successor unchecked: the careful walk takes it from
    there), or ``position`` if its header does not pass; stops at the first one at or past ``end``."""
    unpack = _HEAD_CHECK.unpack_from
    limit = file_size - HEADER_CHECK_LENGTH
    magics = _MESSAGE_MAGICS
    confirmed = p = position
    while p <= limit:
        size, magic, physical = unpack(view, p)
        if magic not in magics or size < MIN_RECORD_LENGTH or size > file_size - p or physical != file_offset + p:
            break
        confirmed = p
        if p >= end:
            break
        p += size
    return confirmed


def _is_record(view: memoryview, file_offset: int, file_size: int, position: int) -> bool:
    """A message (not the BLANK) starts at ``position``, by :func:`is_boundary`'s rules."""
    return _header_ok(view, file_offset, file_size, position) and is_boundary(view, file_offset, file_size, position)


def _stop_run(view: memoryview, split: Split, layout: SplitLayout, position: int,
              run_start: int | None) -> tuple[int | None, int | None]:
    """Close the run at ``position`` (no record there): note a BLANK, or a gap up to the next boundary.
    Returns where the walk goes on (None: nowhere in this file) as (position, new run start)."""
    if run_start is not None and position > run_start:
        layout.runs.append((run_start, position))
    if _blank_ok(view, split.file_size, position):
        layout.blank_offset = split.file_offset + position
        return None, None
    following = resync(view, split.file_offset, split.file_size, position + 1, split.file_size)
    gap_end = split.file_size if following is None else following
    layout.gaps.append(_gap(view, split.file_offset, position, gap_end, following is None))
    return following, following


def _gap(view: memoryview, file_offset: int, start: int, end: int, to_file_end: bool) -> Gap:
    if _all_zero(view, start, end):
        reason = "zero bytes to the end of the file" if to_file_end else "zero bytes before a record (a hole)"
        return Gap(file_offset + start, end - start, GAP_ZEROS, reason)
    size, magic = SIZE_AND_MAGIC.unpack_from(view, start) if start + 8 <= len(view) else (0, 0)
    if magic in _MESSAGE_MAGICS:
        reason = f"record header (size {size}) that does not chain to a record: torn or garbled"
    else:
        reason = f"bytes that are not a record (magic {magic:#010x})"
    return Gap(file_offset + start, end - start, GAP_CORRUPT, reason)


def iter_record_positions(view: memoryview, runs: list[tuple[int, int]]) -> Iterator[int]:
    """File positions of every record of the runs, in order."""
    unpack = SIZE_AND_MAGIC.unpack_from
    for start, end in runs:
        position = start
        while position < end:
            yield position
            position += unpack(view, position)[0]
