"""The commitlog's files, read by the indexer itself: RocketMQ's ReputMessageService reads the mapped
files of its own process; here the indexer shares the store volume with the commitlog service (one
pod per shard) and reads the same files, read-only.

What may be read comes from the commitlog service, never from the files: the readable end (a Tail
in ``positions_only`` mode: the committed position with a transient store pool, where bytes reach the
file only at commit) bounds every read, and the quarantined ranges come from GetStoreInfo. A chunk is
cut by the walk the commitlog's own ``tail_chunk`` uses (``services.store.formats.chunk_walk``: whole
records within one file; a BLANK ends it and moves to the next file's start; a quarantined range is
skipped, announced), with this reader's own checks of what the walk stopped at, so the indexer checks it
with the same ``tail_protocol`` rules as a chunk that came over the wire.

Reads use ``pread`` on file descriptors, not a mapping: a file someone shrank makes a ``pread`` come
back short (a Resync) where a mapping read would be a SIGBUS that kills the process (recovery's
``MappedFile.zero_from`` punches a hole and keeps the size, so this is a second line of defence). Descriptors are per
connection: a file that recovery deleted and the new incarnation created again under the same name is
opened afresh after the reconnect that follows every commitlog restart.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from services.store.formats.chunk_walk import ChunkStop, walk_chunk
from services.store.formats.mapped_file import file_name
from services.store.formats.record import END_FILE_MIN_BLANK_LENGTH, SIZE_AND_MAGIC


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
            size = SIZE_AND_MAGIC.unpack_from(data, 0)[0]
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
    length, whether a BLANK follows them). Bytes below the readable end that are no record, or a
    BLANK that does not reach its file's end, are a FilesMismatch."""
    walk = walk_chunk(data, 0, len(data), max_bytes)
    if walk.stop is ChunkStop.BLANK:
        size = SIZE_AND_MAGIC.unpack_from(data, walk.end)[0]
        if offset + walk.end + size != file_end:
            raise FilesMismatch(f"the BLANK at commitlog offset {offset + walk.end} has size {size}: it must reach "
                                f"its file's end, {file_end}")
    elif walk.stop is ChunkStop.NOT_A_RECORD:
        size, magic = SIZE_AND_MAGIC.unpack_from(data, walk.end)
        raise FilesMismatch(f"commitlog offset {offset + walk.end}: size {size} magic {magic:#010x} is no record "
                            "below the readable end")
    return walk.count, walk.end, walk.stop is ChunkStop.BLANK
