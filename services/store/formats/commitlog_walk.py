"""Offline, read-only walk over a commitlog directory (mqstore's or RocketMQ's).

The walk follows the rules of RocketMQ's recovery: records one after another from the start of a
file, a BLANK record ends a file's data (the walk moves to the next file), and the first position
that is not a valid record (zeros of a preallocated file, a torn write) is the end of the data.
Where that end is not zero bytes, the walk's ``end`` also says what lies past it (a torn tail, or a
damaged record with intact records after it: services.store.formats.record_scan). Files are mapped
read-only, so walking a 1 GiB file does not read it into memory.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import re
import struct
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from pathlib import Path

from services.store.formats.message import MessageRecord
from services.store.formats.record import (
    BLANK_MAGIC_CODE,
    END_FILE_MIN_BLANK_LENGTH,
    MESSAGE_MAGIC_CODE,
    MESSAGE_MAGIC_CODE_V2,
    PHYSICAL_OFFSET_POS,
    DispatchRequest,
    check_record,
    decode_record,
    read_size_and_magic,
)
from services.store.formats.record_scan import Damage, FileView, diagnose, survey

FILE_NAME_DIGITS = 20
_FILE_NAME = re.compile(r"[0-9]{20}")
_I64 = struct.Struct(">q")


class CommitLogError(Exception):
    """A commitlog directory, file or start offset that cannot be walked; the message says why."""


def commitlog_file_name(offset: int) -> str:
    """A commitlog file is named by the commitlog offset of its first byte, zero-padded to 20 digits."""
    return f"{offset:0{FILE_NAME_DIGITS}d}"


@dataclass(frozen=True, slots=True)
class CommitLogFile:
    path: Path
    start_offset: int
    size: int

    @property
    def end_offset(self) -> int:
        """Commitlog offset just past this file (the next file's name)."""
        return self.start_offset + self.size


def list_commitlog_files(directory: str | os.PathLike[str],
                         file_size: int | None = None) -> list[CommitLogFile]:
    """The files of a commitlog directory in offset order, checked to form one contiguous log.

    ``file_size`` is the mapped file size (mappedFileSizeCommitLog); by default it is taken from the
    first file, since every file of a RocketMQ commitlog is preallocated to exactly that size.
    Raises CommitLogError for a missing directory, a stray file name, a wrong size or a gap.
    """
    root = Path(directory)
    if not root.is_dir():
        raise CommitLogError(f"{root}: no such directory")
    starts: list[tuple[int, Path]] = []
    for path in root.iterdir():
        if not _FILE_NAME.fullmatch(path.name) or not path.is_file():
            raise CommitLogError(
                f"{path}: not a commitlog file (expected regular files named by a 20-digit offset)")
        starts.append((int(path.name), path))
    starts.sort()
    if not starts:
        return []
    if file_size is None:
        file_size = starts[0][1].stat().st_size
    if file_size <= END_FILE_MIN_BLANK_LENGTH:
        raise CommitLogError(f"{starts[0][1]}: file size {file_size} is too small for a commitlog file")
    files: list[CommitLogFile] = []
    for start, path in starts:
        size = path.stat().st_size
        if size != file_size:
            raise CommitLogError(f"{path}: size {size} differs from the mapped file size {file_size}")
        if start % file_size:
            raise CommitLogError(f"{path}: offset {start} is not a multiple of the file size {file_size}")
        if files and start != files[-1].end_offset:
            raise CommitLogError(
                f"{path}: expected the next file at offset {files[-1].end_offset}, the log has a gap")
        files.append(CommitLogFile(path, start, size))
    return files


@dataclass(frozen=True, slots=True)
class RecordEntry:
    """A message record at ``offset``, with what dispatch would make of it (checkMessageAndReturnSize)."""

    offset: int
    record: MessageRecord
    dispatch: DispatchRequest

    @property
    def size(self) -> int:
        return self.record.store_size


@dataclass(frozen=True, slots=True)
class BlankEntry:
    """The BLANK record that ends a file's data: ``size`` (its TOTALSIZE) is the bytes left in the file."""

    offset: int
    size: int
    magic: int  # unsigned, BLANK_MAGIC_CODE


CommitLogEntry = RecordEntry | BlankEntry


@dataclass(frozen=True, slots=True)
class WalkEnd:
    """Where and why a walk stopped, so a tool can tell a clean end from a torn record. ``damage`` is
    None for a clean end (zero bytes, a final BLANK); else what lies past the bad record: nothing valid
    (a torn tail) or intact records that a recovery would drop with it (record_scan.survey)."""

    offset: int
    reason: str
    damage: Damage | None = None


class CommitLogWalk(Iterator[CommitLogEntry]):
    """The entries of a walk; ``end`` is set once the walk is exhausted."""

    def __init__(self, files: list[CommitLogFile], index: int, position: int, check_crc: bool) -> None:
        self.end: WalkEnd | None = None
        self._entries = self._walk(files, index, position, check_crc)

    def __iter__(self) -> CommitLogWalk:
        return self

    def __next__(self) -> CommitLogEntry:
        return next(self._entries)

    def close(self) -> None:
        """Unmap the current file early (a consumer that stops before the end)."""
        self._entries.close()

    def _walk(self, files: list[CommitLogFile], first: int, position: int,
              check_crc: bool) -> Generator[CommitLogEntry, None, None]:
        if first >= len(files):
            self.end = WalkEnd(position, "no commitlog files")
            return
        for index in range(first, len(files)):
            file = files[index]
            mapped = _MappedFile(file)
            with mapped as view:
                while True:
                    offset = file.start_offset + position
                    if position + END_FILE_MIN_BLANK_LENGTH > file.size:
                        self.end = _stopped_at(files, index, mapped, position, check_crc,
                                               f"file {file.path.name} ends without a BLANK record")
                        return
                    dispatch = check_record(view, position, check_crc)
                    if not dispatch.success:
                        self.end = _stopped_at(files, index, mapped, position, check_crc)
                        return
                    if dispatch.msg_size == 0:
                        size, magic = read_size_and_magic(view, position)
                        yield BlankEntry(offset, size, magic)
                        break
                    yield RecordEntry(offset, decode_record(view, position), dispatch)
                    position += dispatch.msg_size
            position = 0
        self.end = WalkEnd(files[-1].end_offset, "the last file ends with a BLANK record")


class _MappedFile:
    """A read-only mapping of one file as a memoryview; releases the view before unmapping."""

    def __init__(self, file: CommitLogFile) -> None:
        self._file = file

    def __enter__(self) -> memoryview:
        try:
            with open(self._file.path, "rb") as handle:
                self.map = mmap.mmap(handle.fileno(), self._file.size, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as exc:  # ValueError: the file shrank below its listed size
            raise CommitLogError(f"{self._file.path}: cannot map {self._file.size} bytes ({exc})") from None
        self._view = memoryview(self.map)
        return self._view

    def __exit__(self, *exc_info: object) -> None:
        self._view.release()
        self.map.close()


def _stopped_at(files: list[CommitLogFile], index: int, mapped: _MappedFile, position: int, check_crc: bool,
                reason: str | None = None) -> WalkEnd:
    """The end of a walk at ``position`` of ``files[index]`` (``mapped``): why, and what lies past it."""
    file = files[index]
    stop = diagnose(mapped.map, position, file.start_offset, check_crc)
    damage = survey(stop, _searchable(files, index, mapped), check_crc)
    return WalkEnd(stop.offset, reason or stop.reason, damage)


def _searchable(files: list[CommitLogFile], index: int, first: _MappedFile) -> Iterator[FileView]:
    """``files[index]`` (already mapped as ``first``), then each later file mapped in turn; each with
    a descriptor of its own, so the survey skips holes."""
    for file in files[index:]:
        mapped = first if file is files[index] else _MappedFile(file)
        with contextlib.ExitStack() as stack:
            if mapped is not first:
                stack.enter_context(mapped)
            fd = os.open(file.path, os.O_RDONLY)
            stack.callback(os.close, fd)
            yield FileView(file.start_offset, mapped.map, fd)


def iter_commitlog(directory: str | os.PathLike[str], from_offset: int | None = None, *,
                   check_crc: bool = True, file_size: int | None = None) -> CommitLogWalk:
    """Walk a commitlog directory in offset order, yielding RecordEntry and BlankEntry items.

    ``from_offset`` must be a record boundary: a message whose PHYSICALOFFSET field equals it, or a
    BLANK record. The directory and the start offset are checked here, before the first item, so a
    caller can report a bad argument before it prints anything. ``check_crc`` follows recovery
    (checkCRCOnRecover): a record whose body fails its CRC ends the data.
    """
    files = list_commitlog_files(directory, file_size)
    if from_offset is None:
        return CommitLogWalk(files, 0, 0, check_crc)
    index, position = _locate_boundary(files, from_offset)
    return CommitLogWalk(files, index, position, check_crc)


def _locate_boundary(files: list[CommitLogFile], offset: int) -> tuple[int, int]:
    if not files:
        raise CommitLogError(f"offset {offset}: the commitlog has no files")
    first = files[0]
    index = (offset - first.start_offset) // first.size
    if offset < first.start_offset or index >= len(files):
        raise CommitLogError(
            f"offset {offset} is outside the commitlog files [{first.start_offset}, {files[-1].end_offset})")
    file = files[index]
    position = offset - file.start_offset
    with open(file.path, "rb") as handle:
        head = os.pread(handle.fileno(), PHYSICAL_OFFSET_POS + 8, position)
    if len(head) < END_FILE_MIN_BLANK_LENGTH:
        raise CommitLogError(f"offset {offset} is not a record boundary: too close to the end of its file")
    size, magic = read_size_and_magic(head, 0)
    if magic == BLANK_MAGIC_CODE and size == file.size - position:
        return index, position
    if magic not in (MESSAGE_MAGIC_CODE, MESSAGE_MAGIC_CODE_V2):
        hint = " (all zero: past the end of data?)" if size == 0 and magic == 0 else ""
        raise CommitLogError(
            f"offset {offset} is not a record boundary: magic code {magic:#010x} is not a message{hint}")
    if len(head) < PHYSICAL_OFFSET_POS + 8:
        raise CommitLogError(f"offset {offset} is not a record boundary: too close to the end of its file")
    stored = _I64.unpack_from(head, PHYSICAL_OFFSET_POS)[0]
    if stored != offset:
        raise CommitLogError(
            f"offset {offset} is not a record boundary: the record there says its offset is {stored}")
    return index, position
