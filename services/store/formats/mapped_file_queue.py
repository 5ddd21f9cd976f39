"""MappedFileQueue: the ordered list of a log's mapped files, addressed by global offset.

The next file is created in the background as soon as the current one is taken into use, so a
roll-over on the put path rarely waits for file creation.

A file that cannot be created because the disk is full (the owner's ``space_check`` refuses it, or
the allocation itself fails with ENOSPC) raises :class:`DiskFullError` and leaves no file behind. A
writer about to roll calls :meth:`MappedFileQueue.prepare_next_files` before it writes anything, so
a refused roll refuses the whole write, never half of it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from services.store.config import ConfigError
from services.store.disk_space import disk_full_error, is_disk_full
from services.store.formats.mapped_file import PREFAULT_AHEAD, MappedFile, file_name, parse_file_name
from services.store.formats.transient_store_pool import TransientStorePool
from services.store.store_root import make_dirs, remove_durably

#: Asked before an old file is deleted, with the file and whether it is past its reserved time: False keeps it.
MayDelete = Callable[[MappedFile, bool], bool]
#: Called before a file is created; raises DiskFullError to refuse it. Its argument says whether a
#: writer waits for the file (a roll) rather than a background pre-allocation wanting it.
SpaceCheck = Callable[[bool], None]

log = logging.getLogger(__name__)


class MappedFileQueue:
    def __init__(self, store_path: Path, mapped_file_size: int,
                 pool: TransientStorePool | None = None, preallocate: bool = True, prefault: bool = False,
                 space_check: SpaceCheck | None = None, reserve_step: int = 0) -> None:
        """``reserve_step``: 0 allocates each new file whole; else files are sparse and take blocks that
        many bytes at a time ahead of the writer (MappedFile.reserve)."""
        self.store_path = store_path
        self.mapped_file_size = mapped_file_size
        self.reserve_step = reserve_step
        self.pool = pool
        self._space_check = space_check
        # Files created ahead of a roll (prepare_next_files), by start offset; not yet in the log.
        self._ready: dict[int, MappedFile] = {}
        # Copy-on-write: readers take the current list without a lock.
        self._files: list[MappedFile] = []
        self._files_lock = threading.Lock()
        # Commit and flush may be called from several services (and shutdown) at once.
        self._flush_lock = threading.Lock()
        self.flushed_where = 0
        self.committed_where = 0
        # Store time of the data the last flush covered (RocketMQ's MappedFileQueue.storeTimestamp).
        self.store_timestamp = 0
        self._allocator = ThreadPoolExecutor(max_workers=1, thread_name_prefix="allocate-mapped-file") \
            if preallocate else None
        self._next: tuple[int, Future[MappedFile]] | None = None
        # Prefault files in the allocator thread (MappedFile.prefault), off the put path.
        self._prefault = prefault and preallocate
        self._closing = threading.Event()

    # -- loading -----------------------------------------------------------------------------
    def load(self) -> None:
        """Map every file of the directory. A last file that is shorter than the file size and holds no
        data (its creation was cut short: data is written only into fully created files) is removed;
        any other wrong-sized file means the store was written with another file size, and nothing is
        touched (:class:`FileSizeMismatchError`)."""
        make_dirs(self.store_path)
        paths = sorted(p for p in self.store_path.iterdir() if p.is_file() and not p.name.startswith("."))
        self._check_file_sizes(paths)
        files: list[MappedFile] = []
        for i, path in enumerate(paths):
            offset = parse_file_name(path)
            size = path.stat().st_size
            if size != self.mapped_file_size and i == len(paths) - 1:
                log.warning("removing %s: %d bytes instead of %d and no data (its creation was cut short)",
                            path, size, self.mapped_file_size)
                remove_durably(path)
                continue
            if files and offset != files[-1].file_tail_offset:
                raise ValueError(f"{path} does not follow {files[-1].path.name}: a file is missing")
            mapped = MappedFile(path, self.mapped_file_size, create=False, reserve_step=self.reserve_step)
            mapped.set_positions(self.mapped_file_size)
            files.append(mapped)
        self._files = files

    def _check_file_sizes(self, paths: list[Path]) -> None:
        """Refuse (before anything is changed) files written with another file size."""
        size_setting = self.mapped_file_size
        for i, path in enumerate(paths):
            size = path.stat().st_size
            offset = parse_file_name(path)
            if size == size_setting and offset % size_setting == 0:
                continue
            if i == len(paths) - 1 and size < size_setting and offset % size_setting == 0 and _holds_no_data(path):
                continue  # a creation cut short: load() removes it
            written = _file_size_written(paths)
            hint = f"start it with a file size of {written} bytes" if written else "check the file size setting"
            raise FileSizeMismatchError(
                f"{self.store_path} was written with another file size: {path.name} is {size} bytes and starts at "
                f"{offset}, but the file size setting is {size_setting} bytes; nothing was changed: {hint} "
                f"(mappedFileSizeCommitLog / mappedFileSizeConsumeQueue, as when the store was written)")

    # -- lookup ----    # -- lookup ------------------------------------------------------------------------------
    @property
    def files(self) -> list[MappedFile]:
        return self._files

    def last_file(self) -> MappedFile | None:
        files = self._files
        return files[-1] if files else None

    def find_by_offset(self, offset: int, return_first_on_not_found: bool = False) -> MappedFile | None:
        files = self._files
        if not files:
            return None
        first = files[0]
        index = (offset - first.file_from_offset) // self.mapped_file_size
        if 0 <= index < len(files) and files[index].file_from_offset <= offset < files[index].file_tail_offset:
            return files[index]
        return first if return_first_on_not_found else None

    @property
    def min_offset(self) -> int:
        files = self._files
        return files[0].file_from_offset if files else 0

    @property
    def max_offset(self) -> int:
        """End of the readable data. With a transient store pool, bytes become readable only once
        committed into their file, in order, so the committed offset is the end."""
        if self.pool is not None:
            return self.committed_where
        last = self.last_file()
        return last.file_from_offset + last.wrote_position if last else 0

    @property
    def max_wrote_offset(self) -> int:
        last = self.last_file()
        return last.file_from_offset + last.wrote_position if last else 0

    # -- growing -----------------------------------------------------------------------------
    def last_file_for_append(self, start_offset: int = 0) -> MappedFile:
        """The file to append to, rolling to a new one when the last is full."""
        files = self._files  # (no helper calls: this runs on every put)
        last = files[-1] if files else None
        if last is not None and last.wrote_position != last.file_size:
            if last.prefault_end - last.wrote_position < PREFAULT_AHEAD // 2 and self._prefault:
                self._prefault_ahead(last)
            return last
        offset = last.file_tail_offset if last is not None else start_offset - start_offset % self.mapped_file_size
        mapped = self._take_or_create(offset)
        with self._files_lock:
            self._files = [*self._files, mapped]
        if self._files[-1] is mapped and len(self._files) == 1:
            self.prefault_last_file()  # a first file was made on the put path: warm it ahead of the writer
        self._request_next(offset + self.mapped_file_size)
        return mapped

    def prepare_next_files(self, count: int) -> None:
        """Make sure the ``count`` files after the last one exist, before a write that rolls into them
        puts its first byte anywhere: if one cannot be created (DiskFullError, OSError), nothing of
        the write is in the log yet. Files made here wait for :meth:`last_file_for_append`."""
        last = self.last_file()
        if last is None:
            return
        for k in range(count):
            offset = last.file_tail_offset + k * self.mapped_file_size
            if offset not in self._ready:
                self._ready[offset] = self._take_or_create(offset)

    def reserve_for_append(self, mapped: MappedFile, size: int) -> None:
        """Before ``size`` bytes are copied in from ``mapped``'s wrote position (rolling into the files
        :meth:`prepare_next_files` made): reserve their blocks, asking ``space_check`` before each
        reservation that takes new space. DiskFullError, nothing written, when the disk has no room."""
        targets = [(mapped, mapped.wrote_position + size)]
        rest = mapped.wrote_position + size - mapped.file_size
        offset = mapped.file_tail_offset
        while rest > 0 and offset in self._ready:  # a roll: at most all of it in each file it reaches
            targets.append((self._ready[offset], size))
            rest -= self.mapped_file_size
            offset += self.mapped_file_size
        for target, end in targets:
            end = min(end, target.file_size)
            if end <= target.reserved_position:
                continue
            if self._space_check is not None:
                self._space_check(True)
            target.reserve(end)

    def _create(self, offset: int, needed: bool = True) -> MappedFile:
        path = self.store_path / file_name(offset)
        if self._space_check is not None:
            self._space_check(needed)
        buffer = self.pool.borrow() if self.pool is not None else None
        try:
            return MappedFile(path, self.mapped_file_size, write_buffer=buffer, reserve_step=self.reserve_step)
        except BaseException as exc:  # MappedFile removed what it began; the buffer goes back
            if buffer is not None and self.pool is not None:
                self.pool.give_back(buffer)
            if isinstance(exc, OSError) and is_disk_full(exc):
                raise disk_full_error(self.store_path, f"creating {path}", exc) from None
            raise

    def _take_or_create(self, offset: int) -> MappedFile:
        ready = self._ready.pop(offset, None)
        if ready is not None:
            return ready
        pending, self._next = self._next, None
        if pending is not None:
            pending_offset, future = pending
            try:
                mapped = future.result()
            except Exception as exc:  # noqa: BLE001 - stale by now: the disk may have room again
                log.info("the background creation of %s failed (%s); creating it now",
                         file_name(pending_offset), exc)
            else:
                if pending_offset == offset:
                    return mapped
                self._discard(mapped)
        return self._create(offset)

    def _request_next(self, offset: int) -> None:
        if self._allocator is not None and offset not in self._ready:
            created = self._allocator.submit(self._create, offset, False)
            self._next = (offset, created)
            if self._prefault:
                # A task of its own after the creation (one allocator thread, tasks in order): a roll
                # waits for the file to exist, never for its page cache; the prefault keeps ahead of
                # the writer from the file's start.
                self._allocator.submit(self._prefault_created, created)

    def _prefault_created(self, created: Future[MappedFile]) -> None:
        try:
            mapped = created.result()
        except Exception:  # noqa: BLE001 - the roll that takes the file reports the failure
            return
        mapped.prefault_end = PREFAULT_AHEAD  # not in the log yet: no writer reads it meanwhile
        mapped.prefault(0, self._closing.is_set, PREFAULT_AHEAD)  # stops at once if discarded meanwhile

    def _prefault_ahead(self, mapped: MappedFile) -> None:
        """Ask the allocator thread to map ``mapped``'s page cache up to PREFAULT_AHEAD past its write
        position (the writer's thread: it alone moves ``prefault_end`` of a file in the log)."""
        if self._allocator is None or mapped.prefault_end >= mapped.file_size:
            return
        start = max(mapped.prefault_end, mapped.wrote_position)
        mapped.prefault_end = min(mapped.file_size, mapped.wrote_position + PREFAULT_AHEAD)
        self._allocator.submit(mapped.prefault, start, self._closing.is_set, mapped.prefault_end)

    def prefault_last_file(self) -> None:
        """Prefault the current file ahead of its write position in the background (after a start)."""
        last = self.last_file()
        if last is not None and self._prefault:
            self._prefault_ahead(last)

    def _discard(self, mapped: MappedFile) -> None:
        if mapped.write_buffer is not None and self.pool is not None:
            self.pool.give_back(mapped.write_buffer)
        mapped.destroy()

    # -- commit and flush --------------------------------------------------------------------
    def commit(self, least_pages: int) -> bool:
        """Commit pooled bytes of the file at committed_where. True if something moved."""
        with self._flush_lock:
            return self._commit(least_pages)

    def _commit(self, least_pages: int) -> bool:
        mapped = self.find_by_offset(self.committed_where, return_first_on_not_found=self.committed_where == 0)
        if mapped is None:
            return False
        before = self.committed_where
        position = mapped.commit(least_pages)
        self.committed_where = mapped.file_from_offset + position
        if mapped.write_buffer is not None and position == mapped.file_size and self.pool is not None:
            buffer, mapped.write_buffer = mapped.write_buffer, None
            self.pool.give_back(buffer)
        return self.committed_where != before

    def flush(self, least_pages: int) -> bool:
        """fdatasync the file at flushed_where. True if the flushed offset moved."""
        with self._flush_lock:
            return self._flush(least_pages)

    def _flush(self, least_pages: int) -> bool:
        mapped = self.find_by_offset(self.flushed_where, return_first_on_not_found=self.flushed_where == 0)
        if mapped is None:
            return False
        timestamp = mapped.store_timestamp
        before = self.flushed_where
        position = mapped.flush(least_pages)
        self.flushed_where = mapped.file_from_offset + position
        if self.flushed_where != before and timestamp:
            self.store_timestamp = timestamp
        return self.flushed_where != before

    def flush_until(self, offset: int) -> None:
        """Flush file after file until ``offset`` is durable or nothing is left to flush."""
        while self.flushed_where < offset and self.flush(0):
            pass

    # -- truncation --------------------------------------------------------------------------
    def truncate_dirty_files(self, offset: int) -> None:
        """Make ``offset`` the end of the log: later files go, the file holding it is cut there."""
        kept: list[MappedFile] = []
        for mapped in self._files:
            if mapped.file_tail_offset <= offset:
                kept.append(mapped)
            elif mapped.file_from_offset <= offset:
                position = offset - mapped.file_from_offset
                mapped.zero_from(position)
                mapped.set_positions(position)
                kept.append(mapped)
            else:
                log.info("deleting %s: it lies past the recovered end of the log %d", mapped.path, offset)
                self._discard(mapped)
        with self._files_lock:
            self._files = kept
        self.flushed_where = self.committed_where = offset

    def delete_expired_files(self, expired_before_s: float, clean_at_once: bool, max_files: int,
                             may_delete: MayDelete | None = None) -> list[MappedFile]:
        """Delete the oldest files last modified before ``expired_before_s`` (any old file when
        ``clean_at_once``), never the last file and never data that is not yet flushed; at most
        ``max_files``. ``may_delete(file, expired)`` is asked in order, outside the files lock (it may
        read other files), and may keep a file: deleting stops there. Returns the deleted files
        (unmapped)."""
        chosen: list[MappedFile] = []
        for mapped in self._files[:-1]:
            if len(chosen) >= max_files or mapped.file_tail_offset > self.flushed_where:
                break
            expired = mapped.path.stat().st_mtime < expired_before_s
            if not (expired or clean_at_once) or (may_delete is not None and not may_delete(mapped, expired)):
                break
            chosen.append(mapped)
        with self._files_lock:
            files = self._files
            count = 0  # the chosen files that are still the oldest ones (nothing else removes them)
            while count < min(len(chosen), len(files) - 1) and files[count] is chosen[count]:
                count += 1
            removed, self._files = files[:count], files[count:]
        for mapped in removed:
            self._discard(mapped)
        return removed

    def delete_last_file(self) -> None:
        """Drop the newest file (a ConsumeQueue truncated below its start)."""
        with self._files_lock:
            if not self._files:
                return
            *kept, last = self._files
            self._files = kept
        log.info("deleting %s: it holds only data past the truncation point", last.path)
        self._discard(last)

    def destroy(self) -> None:
        """Delete every file and the directory itself if it is then empty."""
        with self._files_lock:
            files, self._files = self._files, []
        for mapped in [*files, *self._take_unused()]:
            self._discard(mapped)
        self.flushed_where = self.committed_where = 0
        with contextlib.suppress(OSError):  # missing, or holds something that is not ours: leave it
            self.store_path.rmdir()

    # -- shutdown ----------------------------------------------------------------------------
    def _take_unused(self) -> list[MappedFile]:
        """The files created ahead and never taken into the log (waits for a pending creation)."""
        unused, self._ready = list(self._ready.values()), {}
        pending, self._next = self._next, None
        if pending is not None:
            with contextlib.suppress(Exception):  # a failed creation left nothing to delete
                unused.append(pending[1].result())
        return unused

    def shutdown(self) -> None:
        """Close every file. Files created ahead, never written, are deleted."""
        self._closing.set()
        for mapped in self._take_unused():
            self._discard(mapped)
        if self._allocator is not None:
            self._allocator.shutdown(wait=True)
        for mapped in self._files:
            if mapped.write_buffer is not None and self.pool is not None:
                self.pool.give_back(mapped.write_buffer)
                mapped.write_buffer = None
            mapped.close()


class FileSizeMismatchError(ConfigError):
    """The files of a store were written with a file size other than the configured one."""


def _holds_no_data(path: Path) -> bool:
    """True if the file's first page is zeros: where a record or a BLANK would begin."""
    with open(path, "rb") as file:
        return not file.read(4096).strip(b"\0")


def _file_size_written(paths: list[Path]) -> int | None:
    """The size most files have: the store's real file size, to suggest."""
    sizes = [p.stat().st_size for p in paths[:-1]] or [p.stat().st_size for p in paths]
    common = max(set(sizes), key=sizes.count) if sizes else None
    return common or None
