"""MappedFile: one fixed-size, memory-mapped store file named by its 20-digit start offset.

Three positions describe how far the file is done (RocketMQ's names):
``wrote_position`` (appended), ``committed_position`` (moved from the transient pool buffer into
the file; equals wrote when no pool is used) and ``flushed_position`` (made durable by fdatasync).
Readers see bytes up to the read position (committed with a pool, else wrote).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import mmap
import os
import threading
from collections.abc import Callable
from pathlib import Path

from services.store.disk_space import disk_full_error, is_disk_full
from services.store.store_root import created_durably, remove_durably

log = logging.getLogger(__name__)

OS_PAGE_SIZE = 4096
FILE_NAME_DIGITS = 20
MADV_POPULATE_READ = 22  # Linux >= 5.14; Python's mmap module has no name for it
# Each step holds the process's mmap lock (a writer's mmap/munmap, e.g. the allocator's arenas,
# waits for it: ~20 ms stalls with 64 MiB steps) and, between steps, waits for the GIL (up to the
# 5 ms switch interval while a producer runs): 16 MiB keeps both short, ~1 s per GiB prefaulted.
PREFAULT_STEP = 16 * 1024 * 1024
#: How far ahead of the writer a file's page cache is mapped: a fast producer's next second or so,
#: asked for again once the writer is half way there. Not the whole file: a 1 GiB file is 262,144 pages,
#: 1 to 10 s of one core to map (a VM's first touch of its memory is the slow part), which every
#: replica of a shard spent at once at a start, and a GiB of idle page cache per file held.
PREFAULT_AHEAD = 64 * 1024 * 1024
_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
_libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
_libc.fallocate.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long)
FALLOC_FL_KEEP_SIZE = 0x01
FALLOC_FL_PUNCH_HOLE = 0x02
ZERO_STEP = 1024 * 1024


def punch_zeros(fd: int, start: int, length: int) -> bool:
    """Deallocate [start, start + length) so it reads as zeros, keeping the file's size. False when the
    file system cannot punch holes (the caller writes zeros instead)."""
    return bool(_libc.fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, start, length) == 0)


def file_name(offset: int) -> str:
    return f"{offset:0{FILE_NAME_DIGITS}d}"


def parse_file_name(path: Path) -> int:
    """Start offset from a 20-digit name; ValueError for anything else."""
    name = path.name
    if len(name) != FILE_NAME_DIGITS or not name.isdigit():
        raise ValueError(f"{path} is not a store file (its name must be 20 digits)")
    return int(name)


class MappedFile:
    """A store file mapped into memory. Not thread-safe for writers: the owner serialises appends."""

    def __init__(self, path: Path, file_size: int, write_buffer: mmap.mmap | None = None,
                 create: bool = True, reserve_step: int = 0) -> None:
        """``reserve_step`` 0: a new file is allocated whole at creation. Else the file is sparse (it
        takes space as it fills, RocketMQ's way) and blocks are reserved (fallocate) ``reserve_step``
        bytes at a time ahead of the writes (:meth:`reserve`), the first step at creation."""
        self.path = path
        self.file_size = file_size
        self.file_from_offset = parse_file_name(path)
        self.reserve_step = reserve_step
        #: Bytes from the file's start known to have blocks: writes below it never meet a full disk.
        self.reserved_position = 0
        self.wrote_position = 0
        self.committed_position = 0
        self.flushed_position = 0
        flags = os.O_RDWR | (os.O_CREAT if create else 0)
        self._fd = os.open(path, flags, 0o644)
        allocating = False
        try:
            actual = os.fstat(self._fd).st_size
            if actual == 0 and create:
                # Reserve the blocks now: writes into a sparse file allocate on every page fault,
                # which makes appends ~10x slower; it also surfaces a full disk at creation.
                allocating = True
                if reserve_step:
                    os.ftruncate(self._fd, file_size)
                    self._allocate(min(reserve_step, file_size))
                else:
                    os.posix_fallocate(self._fd, 0, file_size)
                    self.reserved_position = file_size
                # The file's size and its name are durable before any data goes in: an fdatasync of
                # appended data does not make a new name durable, and a file whose name is lost at a
                # power cut loses every acknowledged record in it.
                created_durably(self._fd, path)
            elif actual != file_size:
                raise ValueError(f"{path} is {actual} bytes, but store files here are {file_size} bytes")
            self._mm = mmap.mmap(self._fd, file_size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(self._fd)
            if allocating:
                # A file this call began (empty, or partly allocated when the disk filled up) holds no
                # data: remove it, so no half-created file is left for the next attempt or a restart.
                remove_durably(path)
            raise
        self.write_buffer = write_buffer
        self._prefault_lock = threading.Lock()
        #: Bytes from the file's start a prefault was asked for (by the thread that appends).
        self.prefault_end = 0
        # Store time of the last record appended: the checkpoint takes it once that data is flushed.
        self.store_timestamp = 0

    # -- positions ---------------------------------------------------------------------------
    @property
    def file_tail_offset(self) -> int:
        return self.file_from_offset + self.file_size

    @property
    def read_position(self) -> int:
        return self.wrote_position if self.write_buffer is None else self.committed_position

    @property
    def remaining(self) -> int:
        return self.file_size - self.wrote_position

    @property
    def is_full(self) -> bool:
        return self.wrote_position == self.file_size

    def set_positions(self, position: int) -> None:
        self.wrote_position = self.committed_position = self.flushed_position = position

    # -- writing -----------------------------------------------------------------------------
    def append(self, data: bytes | bytearray | memoryview) -> None:
        """Write ``data`` at the wrote position (into the pool buffer when there is one)."""
        start = self.wrote_position
        end = start + len(data)
        if end > self.file_size:
            raise ValueError(f"append of {len(data)} bytes overflows {self.path.name} at {start}")
        if end > self.reserved_position:
            self.reserve(end)
        target = self._mm if self.write_buffer is None else self.write_buffer
        target[start:end] = data
        self.wrote_position = end

    def reserve(self, end: int) -> None:
        """Make sure bytes [wrote position, ``end``) have blocks before anything is written there: a
        write through the mapping into a hole of a full disk is a SIGBUS that kills the process, not
        an error. Reserves up to ``reserve_step`` past ``end`` (capped at the file's end). Raises
        DiskFullError with nothing written; a writer that copies into :meth:`append_buffer` calls
        this first."""
        if end <= self.reserved_position:
            return
        step = self.reserve_step or self.file_size
        try:
            self._allocate(min(self.file_size, max(end, self.wrote_position) + step))
        except OSError as exc:
            if is_disk_full(exc):
                raise disk_full_error(self.path.parent, f"reserving space in {self.path}", exc) from None
            raise

    def _allocate(self, end: int) -> None:
        start = max(self.reserved_position, self.wrote_position - self.wrote_position % OS_PAGE_SIZE)
        if end > start:
            os.posix_fallocate(self._fd, start, end - start)  # within the file's size: it keeps its size
        self.reserved_position = end

    def append_buffer(self) -> mmap.mmap:
        """Where appends go: the pool buffer when there is one, else the file's mapping. For a writer
        that copies records straight in at ``wrote_position`` (one copy per record, no staging buffer)
        and then publishes them by advancing ``wrote_position``: readers never look past it."""
        return self._mm if self.write_buffer is None else self.write_buffer

    def commit(self, least_pages: int) -> int:
        """Move pooled bytes into the file (a write into the page cache). Returns the committed position."""
        if self.write_buffer is None:
            self.committed_position = self.wrote_position
            return self.committed_position
        wrote = self.wrote_position
        if self._enough_pages(wrote, self.committed_position, least_pages):
            start = self.committed_position
            view = memoryview(self.write_buffer)[start:wrote]
            try:
                os.pwrite(self._fd, view, start)
            finally:
                view.release()
            self.committed_position = wrote
        return self.committed_position

    def flush(self, least_pages: int) -> int:
        """Make everything readable durable with fdatasync. Returns the flushed position."""
        target = self.read_position
        if self._enough_pages(target, self.flushed_position, least_pages):
            os.fdatasync(self._fd)
            self.flushed_position = target
        return self.flushed_position

    def _enough_pages(self, ahead: int, behind: int, least_pages: int) -> bool:
        if ahead == behind:
            return False
        if ahead == self.file_size or least_pages <= 0:
            return True
        return ahead // OS_PAGE_SIZE - behind // OS_PAGE_SIZE >= least_pages

    def prefault(self, position: int = 0, should_stop: Callable[[], bool] = lambda: False,
                 end: int | None = None) -> bool:
        """Map the page cache of [position, ``end`` or the file's end) ahead of the writer
        (MADV_POPULATE_READ), so appends
        take cheap minor faults instead of allocating pages on the put path. Called from a background
        thread: the madvise runs through ctypes, which releases the GIL, in steps so that a shutdown
        (``should_stop``) waits for one step at most. Clean pages only: nothing is written to disk and
        the kernel may reclaim them under memory pressure. False if unsupported or stopped."""
        start = position - position % OS_PAGE_SIZE
        stop = self.file_size if end is None else min(end, self.file_size)
        while start < stop:
            if should_stop():
                return False
            length = min(PREFAULT_STEP, stop - start)
            with self._prefault_lock:  # close() waits for the step: never unmapped under the madvise
                if self._mm.closed:
                    return False
                anchor = ctypes.c_char.from_buffer(self._mm)
                try:
                    failed = _libc.madvise(ctypes.addressof(anchor) + start, length, MADV_POPULATE_READ) != 0
                finally:
                    del anchor  # releases the buffer export, so the mapping can be closed
            if failed:
                log.debug("madvise(MADV_POPULATE_READ) failed on %s: errno %d", self.path, ctypes.get_errno())
                return False
            start += length
        return True

    # -- reading -----------------------------------------------------------------------------
    def read(self, position: int, size: int) -> bytes:
        """Bytes [position, position+size) if readable; ValueError otherwise."""
        if position < 0 or size < 0 or position + size > self.read_position:
            raise ValueError(f"{self.path.name}: [{position}, {position + size}) is not readable "
                             f"(read position {self.read_position})")
        return self._mm[position:position + size]

    @property
    def buffer(self) -> mmap.mmap:
        """The mapping itself, for zero-copy parsing (recovery, tail). Read-only by convention."""
        return self._mm

    def zero_from(self, position: int) -> None:
        """Punch the bytes past ``position`` back to zeros, so stale records after a truncation can
        never be mistaken for new ones by a later recovery."""
        end = self.file_size
        if position >= end:
            return
        page = -(-position // OS_PAGE_SIZE) * OS_PAGE_SIZE
        if any(self._mm[position:min(page, end)]):  # never write into a hole (a SIGBUS on a full disk)
            self._mm[position:min(page, end)] = bytes(min(page, end) - position)
        self.reserved_position = min(self.reserved_position, page)  # punched pages have no blocks
        if page < end and not punch_zeros(self._fd, page, end - page):
            # No hole punching here: zeros written in place. Never shrink the file and grow it back:
            # a reader in another process (the query service, the indexer) with the file mapped
            # would get SIGBUS on a page past the shrunk end.
            for start in range(page, end, ZERO_STEP):
                self._mm[start:min(start + ZERO_STEP, end)] = bytes(min(ZERO_STEP, end - start))
        os.fdatasync(self._fd)

    # -- lifecycle ---------------------------------------------------------------------------
    def close(self) -> None:
        with self._prefault_lock:  # a prefault step in progress (the allocator thread) ends first
            if not self._mm.closed:
                self._mm.close()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def destroy(self) -> None:
        """Close and delete the file, durably: a deletion the directory does not remember can bring
        the file back after a power cut (stale records past a truncated end, or an expired file)."""
        self.close()
        remove_durably(self.path)

    def __repr__(self) -> str:
        return (f"MappedFile({self.path.name}, wrote={self.wrote_position}, "
                f"committed={self.committed_position}, flushed={self.flushed_position})")
