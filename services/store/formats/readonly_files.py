"""Read-only mappings of another process's store files: a directory of fixed-size files named by the
20-digit offset of their first byte (commitlog, one ConsumeQueue).

The writer (the commitlog service, the indexer) owns the files; a reader here maps them read-only
(``PROT_READ``, never a byte written) and finds a file by the offset it wants. The directory is
listed again only when an offset is not covered by what was listed: a new file appeared (a roll) or
the file is gone (deleted by expiry: the data is gone, the caller says so). A mapping of a file that
was deleted since stays valid (Linux keeps the pages until the last unmap); :meth:`forget_below`
unmaps files wholly below a min offset the writer has announced. A file whose size is not the
configured one (being created: opened, not yet allocated) is not mapped yet.

Bounds are the caller's business: a file's bytes past what the writer has published may be half
written. Nothing here decides what is readable.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path

from services.store.formats.mapped_file import parse_file_name


class ReadOnlyFiles:
    """The files of one directory, mapped read-only on first use. Not thread-safe (one event loop)."""

    def __init__(self, directory: Path, file_size: int) -> None:
        self.directory = directory
        self.file_size = file_size
        self._starts: list[int] = []
        self._maps: dict[int, mmap.mmap] = {}

    def find(self, offset: int) -> tuple[int, mmap.mmap] | None:
        """(first offset, mapping) of the file holding ``offset``, listing the directory again if the
        last listing did not cover it; None when no file holds it (never written, or deleted)."""
        start = offset - offset % self.file_size
        mapped = self._maps.get(start)
        if mapped is not None:
            return start, mapped
        if start not in self._starts:
            self.relist()
        if start not in self._starts:
            return None
        mapped = self._map(start)
        return None if mapped is None else (start, mapped)

    def first_start(self) -> int | None:
        """The first offset of the lowest file now on disk (a fresh listing), None without files."""
        self.relist()
        return self._starts[0] if self._starts else None

    def starts(self, covering: int) -> list[int]:
        """First offsets of the files, ascending; listed again unless the last listing already reaches
        ``covering`` (files appear only at the end; one deleted at the front is found missing on use)."""
        if not self._starts or self._starts[-1] + self.file_size < covering:
            self.relist()
        return self._starts

    def path_of(self, start: int) -> Path:
        return self.directory / f"{start:020d}"

    def relist(self) -> None:
        starts: list[int] = []
        try:
            entries = os.listdir(self.directory)
        except FileNotFoundError:
            entries = []
        for name in entries:
            try:
                starts.append(parse_file_name(Path(name)))
            except ValueError:
                continue
        starts.sort()
        self._starts = starts
        present = set(starts)
        for gone in [s for s in self._maps if s not in present]:
            self._maps.pop(gone).close()

    def forget_below(self, offset: int) -> None:
        """Unmap files that end at or below ``offset`` (the writer's min offset: they are expired)."""
        for start in [s for s in self._maps if s + self.file_size <= offset]:
            self._maps.pop(start).close()

    def _map(self, start: int) -> mmap.mmap | None:
        try:
            fd = os.open(self.path_of(start), os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            if os.fstat(fd).st_size != self.file_size:
                return None  # being created (or not a store file of this geometry): not readable yet
            mapped = mmap.mmap(fd, self.file_size, access=mmap.ACCESS_READ)
        finally:
            os.close(fd)
        self._maps[start] = mapped
        return mapped

    def close(self) -> None:
        for mapped in self._maps.values():
            mapped.close()
        self._maps.clear()
