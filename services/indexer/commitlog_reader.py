"""The commitlog's files, read by the indexer itself: RocketMQ's ReputMessageService reads the mapped
files of its own process; here the indexer shares the store volume with the commitlog service (one
pod per shard) and reads the same files, read-only.

What may be read comes from the commitlog service, never from the files: the readable end (a Tail
in ``positions_only`` mode: the committed position with a transient store pool, where bytes reach the
file only at commit) bounds every read, and the quarantined ranges come from GetStoreInfo. A chunk is
cut as the commitlog's own ``tail_chunk`` cuts one (whole records within one file; a BLANK ends it and
moves to the next file's start; a quarantined range is skipped, announced), so the indexer checks it
with the same ``tail_protocol`` rules as a chunk that came over the wire.

Reads use ``pread`` on file descriptors, not a mapping: a file someone shrank makes a ``pread`` come
back short (a Resync) where a mapping read would be a SIGBUS that kills the process (recovery's
``MappedFile.zero_from`` punches a hole and keeps the size, so this is a second line of defence). Descriptors are per
connection: a file that recovery deleted and the new incarnation created again under the same name is
opened afresh after the reconnect that follows every commitlog restart.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from services.store.formats.mapped_file import file_name
from services.store.formats.record import BLANK_MAGIC_CODE, END_FILE_MIN_BLANK_LENGTH

_SIZE_MAGIC = struct.Struct(">iI")
#: Smallest possible message record (header, empty body, topic and properties): a size below it is garbage.
_MIN_RECORD = 90


class FilesMismatch(Exception):
    """The files do not hold what the commitlog service says (missing, short, or not whole records
    up to the readable end): resynchronise with the service."""


@dataclass(slots=True, frozen=True)
class FileChunk:
    """As the commitlog's TailChunk: whole records from ``start_offset`` back to back in ``data``, and
    where the next chunk starts (their end, the next file's start after a BLANK, or a quarantined
    range's end). No records and ``next_offset == start_offset``: nothing readable yet."""

    start_offset: int
    data: bytes
    next_offset: int
    record_count: int


class CommitLogFiles:
    """Read-only access to ``<store root>/commitlog`` of a commitlog service on the same volume."""

    def __init__(self, directory: Path, file_size: int, quarantined: Sequence[tuple[int, int]] = ()) -> None:
        self.directory = directory
        self.file_size = file_size
        self._quarantined = tuple(sorted(quarantined))
        self._fds: dict[int, int] = {}  # file start offset -> descriptor

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def __enter__(self) -> CommitLogFiles:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- reads -------------------------------------------------------------------------------
    def pread(self, offset: int, size: int) -> bytes:
        """Bytes [offset, offset + size) of the file holding ``offset`` (fewer at its end)."""
        start = offset - offset % self.file_size
        return os.pread(self._fd(start), min(size, start + self.file_size - offset), offset - start)

    def _fd(self, start: int) -> int:
        fd = self._fds.get(start)
        if fd is None:
            path = self.directory / file_name(start)
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError as exc:
                raise FilesMismatch(f"commitlog file {path} cannot be opened: {exc}") from None
            for old in [s for s in self._fds if s < start]:  # dispatch only moves forward
                os.close(self._fds.pop(old))
            self._fds[start] = fd
        return fd

    def chunk(self, offset: int, readable_end: int, max_bytes: int) -> FileChunk:
        """Whole records from ``offset`` (a record boundary) below ``readable_end``, up to
        ``max_bytes`` (at least one record), within one file; see :class:`FileChunk`."""
        for low, high in self._quarantined:
            if low <= offset < high:  # never a record boundary: skip it, announced
                return FileChunk(offset, b"", high, 0)
        file_start = offset - offset % self.file_size
        file_end = file_start + self.file_size
        end = min(readable_end, file_end)
        for low, _ in self._quarantined:
            if offset < low < end:
                end = low
        if end - offset < END_FILE_MIN_BLANK_LENGTH:
            return FileChunk(offset, b"", offset, 0)
        # 8 bytes more than max_bytes: a BLANK right after the last record ends the chunk there, as
        # the commitlog's own tail_chunk does (it looks at the next header before the size limit).
        data = self.pread(offset, min(max_bytes + END_FILE_MIN_BLANK_LENGTH, end - offset))
        count, pos, blank = _walk(data, offset, file_end, max_bytes)
        if not count and not blank:
            size = _SIZE_MAGIC.unpack_from(data, 0)[0]
            if offset + size <= end:  # one record larger than max_bytes: read it whole
                data = self.pread(offset, min(size + END_FILE_MIN_BLANK_LENGTH, end - offset))
                count, pos, blank = _walk(data, offset, file_end, size)
            elif end < readable_end:  # below the readable end, yet the record does not fit its file
                raise FilesMismatch(f"the record at commitlog offset {offset} (size {size}) crosses {end}: "
                                    "the end of its file or the start of a quarantined range")
        if count == 0 and not blank:
            return FileChunk(offset, b"", offset, 0)
        return FileChunk(offset, data[:pos] if pos < len(data) else data,
                         file_end if blank else offset + pos, count)


def _walk(data: bytes, offset: int, file_end: int, max_bytes: int) -> tuple[int, int, bool]:
    """(whole records at the start of ``data`` within ``max_bytes``, at least one if whole, their byte
    length, whether a BLANK follows them)."""
    unpack = _SIZE_MAGIC.unpack_from
    limit = len(data)
    pos = count = 0
    while pos + 8 <= limit:
        size, magic = unpack(data, pos)
        if magic == BLANK_MAGIC_CODE:
            if offset + pos + size != file_end:
                raise FilesMismatch(f"the BLANK at commitlog offset {offset + pos} has size {size}: it must reach "
                                    f"its file's end, {file_end}")
            return count, pos, True
        if size < _MIN_RECORD:
            raise FilesMismatch(f"commitlog offset {offset + pos}: size {size} magic {magic:#010x} is no record "
                                "below the readable end")
        if pos + size > limit or (count and pos + size > max_bytes):
            break
        pos += size
        count += 1
    return count, pos, False
