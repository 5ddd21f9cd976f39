"""IndexService: the list of IndexFiles of a store's ``index/`` directory, built from dispatch.

RocketMQ 4.9.8 semantics (IndexService.java), which the reference fixtures confirm:

- Every message gets one entry for ``topic#UNIQ_KEY`` (when the property is present) and then one per
  non-empty space-separated word of ``KEYS``. TRANSACTION_ROLLBACK messages are not indexed; prepared
  ones are.
- A message whose commitlog offset is *below* the last file's endPhyOffset is skipped. The test is
  strict (``<``): the message *at* endPhyOffset is indexed again when re-dispatched, so abnormal
  recovery duplicates the keys of that one message (the crash fixture's dump shows
  ``[1954001, 1954001]`` for its UNIQ_KEY). We keep that rule for byte compatibility.
- A full file (indexCount == indexNum) rolls to a new one that starts from its end values; the full
  file is flushed and, being complete, its endTimestamp becomes the checkpoint's indexMsgTimestamp.
- On load after an abnormal exit, files whose endTimestamp is newer than indexMsgTimestamp are deleted;
  the caller re-dispatches from :attr:`IndexService.end_phy_offset` to rebuild them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import NamedTuple

from services.store.checkpoint import StoreCheckpoint
from services.store.index_file import (
    DEFAULT_HASH_SLOT_NUM,
    DEFAULT_INDEX_NUM,
    IndexFile,
    IndexItem,
    index_file_name,
    is_index_file_name,
    next_index_file_name,
)
from services.store.java_hash import (
    BASE31_HIGH_DIGIT,
    BASE31_LOW_DIGIT,
    MASK32,
    MAX_FAST_LENGTH,
    index_key_hash_fast,
)
from services.store.message import (
    KEY_SEPARATOR,
    TRANSACTION_ROLLBACK_TYPE,
    TRANSACTION_TYPE_MASK,
)
from services.store.record import DispatchRequest

log = logging.getLogger(__name__)

DEFAULT_MAX_MSGS_NUM_BATCH = 64  # MessageStoreConfig.maxMsgsNumBatch caps a key query


class QueryOffsetResult(NamedTuple):
    """RocketMQ's QueryOffsetResult. The last-update fields are the newest file's end values whenever a
    file exists; DefaultMessageStore.queryMessage reports them only when some offset matched (else 0)."""

    phy_offsets: list[int]
    index_last_update_timestamp: int
    index_last_update_phy_offset: int


class IndexService:
    """Owns ``index_dir``. Thread-safe: one lock serialises building, queries and file-list changes."""

    def __init__(self, index_dir: Path, hash_slot_num: int = DEFAULT_HASH_SLOT_NUM,
                 index_num: int = DEFAULT_INDEX_NUM, checkpoint: StoreCheckpoint | None = None, *,
                 max_msgs_num_batch: int = DEFAULT_MAX_MSGS_NUM_BATCH,
                 clock: Callable[[], float] = time.time) -> None:
        self.index_dir = Path(index_dir)
        self.hash_slot_num = hash_slot_num
        self.index_num = index_num
        self.checkpoint = checkpoint
        self.max_msgs_num_batch = max_msgs_num_batch
        self._clock = clock
        self._files: list[IndexFile] = []
        self._lock = threading.RLock()

    # -- loading -------------------------------------------------------------------------------
    def load(self, last_exit_ok: bool) -> list[str]:
        """Open the index files in name order. After an abnormal exit, delete those whose endTimestamp
        is newer than the checkpoint's indexMsgTimestamp (no checkpoint: all), as RocketMQ does; they
        hold entries that may not have reached the disk. Returns the names deleted."""
        self.index_dir.mkdir(parents=True, exist_ok=True)
        safe_until = self.checkpoint.index_msg_timestamp if self.checkpoint is not None else 0
        dropped: list[str] = []
        with self._lock:
            if self._files:
                raise RuntimeError(f"{self.index_dir}: index files already loaded")
            for path in sorted(self.index_dir.iterdir()):
                if not (path.is_file() and is_index_file_name(path.name)):
                    log.warning("ignoring %s: not an index file name", path)
                    continue
                f = IndexFile(path, self.hash_slot_num, self.index_num)
                if not last_exit_ok and f.end_timestamp > safe_until:
                    f.destroy()
                    dropped.append(path.name)
                    continue
                self._files.append(f)
        if dropped:
            log.info("abnormal exit: dropped index files %s (newer than indexMsgTimestamp %d)",
                     dropped, safe_until)
        return dropped

    @property
    def files(self) -> list[IndexFile]:
        """A snapshot of the files, oldest first."""
        with self._lock:
            return list(self._files)

    @property
    def end_phy_offset(self) -> int:
        """Where re-dispatch must start to complete the index: the last file's endPhyOffset (0 without
        files). Messages below it are indexed; the one at it is indexed again (RocketMQ's ``<`` rule)."""
        with self._lock:
            return self._files[-1].end_phy_offset if self._files else 0

    # -- building ------------------------------------------------------------------------------
    def build_index(self, request: DispatchRequest) -> None:
        """RocketMQ's buildIndex for one dispatched message."""
        self.build_index_batch((request,))

    def build_index_batch(self, requests: Iterable[DispatchRequest]) -> None:
        """buildIndex for each request in order, with one lock round and one header write per file."""
        with self._lock:
            items = self.collect_items(requests, self._files[-1].end_phy_offset if self._files else 0)
            if items is not None:
                self._put(items)

    @staticmethod
    def collect_items(requests: Iterable[DispatchRequest], end_phy_offset: int) -> list[IndexItem] | None:
        """The entries to put, in order; None for no request at all. ``end_phy_offset`` follows what the
        last file's endPhyOffset would be after each message, so the skip test is the per-message one.
        Hot path: java_hash's ASCII fast path is inlined and lookups are hoisted (~0.4 us a key)."""
        items: list[IndexItem] = []
        append, slow_hash = items.append, index_key_hash_fast
        rollback, tx_mask, sep = TRANSACTION_ROLLBACK_TYPE, TRANSACTION_TYPE_MASK, KEY_SEPARATOR
        high, low, mask, max_fast = BASE31_HIGH_DIGIT, BASE31_LOW_DIGIT, MASK32, MAX_FAST_LENGTH
        seen = False
        for req in requests:
            seen = True
            offset = req.commitlog_offset
            if offset < end_phy_offset or req.sys_flag & tx_mask == rollback:
                continue
            uniq, keys = req.uniq_key, req.keys
            words = [uniq] if uniq is not None else []  # an empty UNIQ_KEY is still indexed, as "topic#"
            if keys:
                words.extend(filter(None, keys.split(sep)))  # empty KEYS words are not
            if not words:
                continue
            prefix, ts = req.topic + "#", req.store_timestamp
            for word in words:
                key = prefix + word
                if key.isascii() and len(key) <= max_fast:
                    data = key.encode("ascii")
                    u = (31 * int(data.translate(high), 31) + int(data.translate(low), 31)) & mask
                    # abs() of the Java int, Integer.MIN_VALUE -> 0
                    append((u if u < 0x8000_0000 else (0x1_0000_0000 - u) & 0x7FFF_FFFF, offset, ts))
                else:
                    append((slow_hash(key), offset, ts))
            end_phy_offset = offset
        return items if seen else None

    def _put(self, items: list[IndexItem]) -> None:
        current = self._writable_file()
        pos = current.put_items(items, 0)
        while pos < len(items):
            current = self._writable_file()
            pos = current.put_items(items, pos)

    def _writable_file(self) -> IndexFile:
        """The last file, or a new one when there is none or it is full (getAndCreateLastIndexFile)."""
        last = self._files[-1] if self._files else None
        if last is not None and not last.is_write_full:
            return last
        new = IndexFile(self.index_dir / self._new_file_name(last), self.hash_slot_num, self.index_num,
                        create=True,
                        prev_end_phy_offset=last.end_phy_offset if last is not None else 0,
                        prev_end_timestamp=last.end_timestamp if last is not None else 0)
        self._files.append(new)
        if last is not None:
            self._flush_full(last)
        return new

    def _new_file_name(self, last: IndexFile | None) -> str:
        """Creation time, but never a name already taken nor one sorting before the last file: the
        load order is the name order, and two files created in one millisecond would collide."""
        self.index_dir.mkdir(parents=True, exist_ok=True)
        name = index_file_name(int(self._clock() * 1000))
        if last is not None and name <= last.name:
            name = next_index_file_name(last.name)
        while (self.index_dir / name).exists():
            name = next_index_file_name(name)
        return name

    def _flush_full(self, f: IndexFile) -> None:
        """IndexService.flush: msync the file; a full file's end is durable, so checkpoint it."""
        f.flush()
        if f.is_write_full and f.end_timestamp > 0 and self.checkpoint is not None:
            self.checkpoint.index_msg_timestamp = f.end_timestamp
            self.checkpoint.flush()

    # -- querying ------------------------------------------------------------------------------
    def query_offset(self, topic: str, key: str, max_num: int, begin: int, end: int) -> QueryOffsetResult:
        """Commitlog offsets indexed under ``topic#key`` with store time in [begin, end], newest file
        first and each chain newest first, at most min(max_num, maxMsgsNumBatch). Hash collisions are
        included: the caller compares the real key. RocketMQ's loop: only files whose time span meets
        [begin, end] are searched, and the walk stops at a file that began before ``begin``."""
        max_num = min(max_num, self.max_msgs_num_batch)
        key_hash = index_key_hash_fast(f"{topic}#{key}")
        offsets: list[int] = []
        last_ts = last_offset = 0
        with self._lock:
            if self._files:
                last_ts, last_offset = self._files[-1].end_timestamp, self._files[-1].end_phy_offset
            for f in reversed(self._files):
                if f.is_time_matched(begin, end):
                    f.select_by_hash(key_hash, max_num, begin, end, offsets)
                if f.begin_timestamp < begin or len(offsets) >= max_num:
                    break
        return QueryOffsetResult(offsets, last_ts, last_offset)

    # -- maintenance ---------------------------------------------------------------------------
    def flush(self) -> int:
        """msync the last file (the periodic index flush). Returns its endTimestamp: the caller may
        record it as indexMsgTimestamp once this returns (RocketMQ itself only checkpoints full files)."""
        with self._lock:
            last = self._files[-1] if self._files else None
            if last is None:
                return 0
            last.flush()
            return last.end_timestamp

    def truncate(self, max_phy_offset: int) -> int:
        """The commitlog now ends at ``max_phy_offset``: delete, newest first, every file whose
        endPhyOffset is at or past it (it holds an entry pointing past the log; an empty successor
        inherits that value and goes too). Files are dropped whole, as abnormal recovery does, rather
        than rewound: a rewound file's endTimestamp could not be restored exactly. indexMsgTimestamp is
        lowered to the new last file's end, so a crash during the rebuild cannot keep a file the
        checkpoint covered only by its dropped predecessor. Returns :attr:`end_phy_offset`, where
        re-dispatch must start to rebuild what was dropped."""
        with self._lock:
            dropped = False
            while self._files and self._files[-1].end_phy_offset >= max_phy_offset:
                self._files.pop().destroy()
                dropped = True
            last = self._files[-1] if self._files else None
            if dropped and self.checkpoint is not None:
                if last is not None:
                    last.flush()
                covered = last.end_timestamp if last is not None else 0
                self.checkpoint.index_msg_timestamp = min(self.checkpoint.index_msg_timestamp, covered)
                self.checkpoint.flush()
            return last.end_phy_offset if last is not None else 0

    def delete_expired(self, min_phy_offset: int) -> list[str]:
        """RocketMQ's deleteExpiredFile: delete the oldest files, never the last one, while their whole
        content lies below ``min_phy_offset`` (the commitlog's new min offset). Returns the names."""
        deleted: list[str] = []
        with self._lock:
            while len(self._files) > 1 and self._files[0].end_phy_offset < min_phy_offset:
                f = self._files.pop(0)
                deleted.append(f.name)
                f.destroy()
        return deleted

    def destroy(self) -> None:
        """Delete every index file."""
        with self._lock:
            for f in self._files:
                f.destroy()
            self._files.clear()

    def close(self) -> None:
        """Flush and unmap every file (a clean shutdown)."""
        with self._lock:
            for f in self._files:
                f.flush()
                f.close()
            self._files.clear()

