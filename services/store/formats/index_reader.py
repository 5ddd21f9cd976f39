"""Key lookups in the indexer's IndexFiles from another process (the query service reads the files).

The same query as :meth:`IndexService.query_offset` (RocketMQ's queryOffset), over read-only
mappings: files newest first, only those whose time span meets [begin, end], each slot chain newest
first, stopping at a file that began before ``begin``. The indexer writes an entry, then its slot,
then the header (``index_file.py``), so a chain followed here only meets complete entries; each lookup
re-reads every header it uses. The file list is read again when the directory changes (a new file,
files deleted by expiry, a rewind after a crash); a file still being created (not yet its full size)
is left for the next lookup.
"""

from __future__ import annotations

import os
from pathlib import Path

from services.store.formats.index_file import IndexFile, IndexFileError, index_file_size, is_index_file_name
from services.store.formats.index_service import QueryOffsetResult
from services.store.formats.java_hash import index_key_hash_fast


class IndexReader:
    """Read-only IndexFile lookups. Not thread-safe (one event loop)."""

    def __init__(self, index_dir: Path, hash_slot_num: int, index_num: int, max_msgs_num_batch: int) -> None:
        self.index_dir = index_dir
        self.hash_slot_num = hash_slot_num
        self.index_num = index_num
        self.max_msgs_num_batch = max_msgs_num_batch
        self._file_size = index_file_size(hash_slot_num, index_num)
        self._files: list[IndexFile] = []
        self._listed_mtime_ns = -1
        self._complete = True

    def query_offset(self, topic: str, key: str, max_num: int, begin: int, end: int,
                     skip: int = 0) -> QueryOffsetResult:
        """Commitlog offsets indexed under ``topic#key`` with an index time in [begin, end] (hash
        collisions included), after the first ``skip``."""
        self._refresh()
        limit = skip + min(max_num, self.max_msgs_num_batch)
        key_hash = index_key_hash_fast(f"{topic}#{key}")
        offsets: list[int] = []
        last_ts = last_offset = 0
        files = self._files
        if files:
            files[-1].reload_header()
            last_ts, last_offset = files[-1].end_timestamp, files[-1].end_phy_offset
        for position in range(len(files) - 1, -1, -1):
            f = files[position]
            if position != len(files) - 1:
                f.reload_header()
            if f.is_time_matched(begin, end):
                f.select_by_hash(key_hash, limit, begin, end, offsets)
            if f.begin_timestamp < begin or len(offsets) >= limit:
                break
        return QueryOffsetResult(offsets[skip:], last_ts, last_offset)

    def _refresh(self) -> None:
        try:
            mtime = os.stat(self.index_dir).st_mtime_ns
        except FileNotFoundError:
            mtime = 0
        if mtime == self._listed_mtime_ns and self._complete:
            return
        self._listed_mtime_ns = mtime
        try:
            names = sorted(n for n in os.listdir(self.index_dir) if is_index_file_name(n))
        except FileNotFoundError:
            names = []
        kept = {f.name: f for f in self._files}
        files: list[IndexFile] = []
        complete = True
        for name in names:
            f = kept.pop(name, None)
            if f is None:
                path = self.index_dir / name
                try:
                    if os.stat(path).st_size != self._file_size:
                        complete = False  # being created: opened, not yet sized
                        continue
                    f = IndexFile(path, self.hash_slot_num, self.index_num, read_only=True)
                except (OSError, IndexFileError):
                    complete = False
                    continue
            files.append(f)
        for gone in kept.values():
            gone.close()
        self._files = files
        self._complete = complete

    def close(self) -> None:
        for f in self._files:
            f.close()
        self._files = []
