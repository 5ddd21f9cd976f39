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

Beyond RocketMQ, :meth:`IndexService.rewind` removes the entries of the records from a commitlog
offset on, in place, so that re-dispatch from that offset rebuilds exactly what was removed. With an
:class:`IndexState` taken after an msync (the indexer's dispatch checkpoint), it is how the indexer
recovers from a crash without dropping whole files: recovery costs what was dispatched since the
checkpoint, not the whole log.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, cast

import numpy as np

from services.store.disk_space import disk_full_error, disk_usage, unallocated_bytes
from services.store.formats.checkpoint import StoreCheckpoint
from services.store.formats.dispatch_columns import DispatchColumns
from services.store.formats.index_file import (
    DEFAULT_HASH_SLOT_NUM,
    DEFAULT_INDEX_NUM,
    HASH_SLOT_SIZE,
    INDEX_ENTRY_SIZE,
    IndexColumns,
    IndexFile,
    IndexHeader,
    IndexItem,
    index_file_name,
    is_index_file_name,
    next_index_file_name,
)
from services.store.formats.java_hash import (
    BASE31_HIGH_DIGIT,
    BASE31_LOW_DIGIT,
    MASK32,
    MAX_FAST_LENGTH,
    abs_java_ints,
    combine_u32,
    index_key_hash_fast,
    java_hash_u32,
    segment_hashes_u32,
    utf16_units,
)
from services.store.formats.mapped_file import OS_PAGE_SIZE
from services.store.formats.message import (
    KEY_SEPARATOR,
    TRANSACTION_ROLLBACK_TYPE,
    TRANSACTION_TYPE_MASK,
)
from services.store.formats.record import DispatchRequest
from services.store.store_root import make_dirs, remove_durably

log = logging.getLogger(__name__)

DEFAULT_MAX_MSGS_NUM_BATCH = 64
#: Chunks with fewer records are indexed record by record: numpy's fixed cost (~60 us a chunk) is more
#: than the per-record path's below ~30 records (measured with 1 and 3 keys a message).
COLUMNAR_MIN_RECORDS = 48  # MessageStoreConfig.maxMsgsNumBatch caps a key query


@functools.lru_cache(maxsize=4096)
def _topic_prefix_hash(topic: str) -> int:
    """``("topic#").hashCode()``, unsigned: every key of a topic starts with it."""
    return java_hash_u32(topic + "#")


class QueryOffsetResult(NamedTuple):
    """RocketMQ's QueryOffsetResult. The last-update fields are the newest file's end values whenever a
    file exists; DefaultMessageStore.queryMessage reports them only when some offset matched (else 0)."""

    phy_offsets: list[int]
    index_last_update_timestamp: int
    index_last_update_phy_offset: int


@dataclass(frozen=True, slots=True)
class IndexState:
    """The last index file's name and header at one moment (``file_name`` None: there was no file).
    Once that file has been msync'd, its entries below the header's indexCount are durable: a later
    :meth:`IndexService.rewind` trusts them, and treats files created after it as holding nothing older."""

    file_name: str | None
    header: IndexHeader | None


class IndexStateMismatch(ValueError):
    """The index files do not hold what an :class:`IndexState` describes (replaced or damaged)."""


class IndexRewind(NamedTuple):
    """What :meth:`IndexService.rewind` did: entries removed from the files it kept, whole files
    deleted, and hash slots that had to be recomputed (a chain through lost pages)."""

    removed_entries: int
    deleted_files: list[str]
    repaired_slots: int

    @property
    def changed(self) -> bool:
        return bool(self.removed_entries or self.deleted_files or self.repaired_slots)


class IndexService:
    """Owns ``index_dir``. Thread-safe: one lock serialises building, queries and file-list changes."""

    def __init__(self, index_dir: Path, hash_slot_num: int = DEFAULT_HASH_SLOT_NUM,
                 index_num: int = DEFAULT_INDEX_NUM, checkpoint: StoreCheckpoint | None = None, *,
                 max_msgs_num_batch: int = DEFAULT_MAX_MSGS_NUM_BATCH,
                 clock: Callable[[], float] = time.time,
                 columnar_min_records: int = COLUMNAR_MIN_RECORDS) -> None:
        self.index_dir = Path(index_dir)
        self.hash_slot_num = hash_slot_num
        self.index_num = index_num
        self.checkpoint = checkpoint
        self.max_msgs_num_batch = max_msgs_num_batch
        self._clock = clock
        self.columnar_min_records = columnar_min_records
        self._files: list[IndexFile] = []
        self._lock = threading.RLock()

    # -- loading -------------------------------------------------------------------------------
    def load(self, last_exit_ok: bool) -> list[str]:
        """Open the index files in name order. After an abnormal exit, delete those whose endTimestamp
        is newer than the checkpoint's indexMsgTimestamp (no checkpoint: all), as RocketMQ does; they
        hold entries that may not have reached the disk. A 0-byte file (a kill between its creation and
        its sizing) is deleted whatever the exit. Returns the names deleted."""
        make_dirs(self.index_dir)
        safe_until = self.checkpoint.index_msg_timestamp if self.checkpoint is not None else 0
        dropped: list[str] = []
        with self._lock:
            if self._files:
                raise RuntimeError(f"{self.index_dir}: index files already loaded")
            for path in sorted(self.index_dir.iterdir()):
                if not (path.is_file() and is_index_file_name(path.name)):
                    log.warning("ignoring %s: not an index file name", path)
                    continue
                if path.stat().st_size == 0:
                    # A crash between creating a file and sizing it (one ftruncate): it never held an entry.
                    log.warning("deleting %s: an empty index file, its creation was interrupted", path)
                    remove_durably(path)
                    dropped.append(path.name)
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

    def state(self) -> IndexState:
        """The last file's name and header now (see :class:`IndexState`)."""
        with self._lock:
            last = self._files[-1] if self._files else None
            return IndexState(last.name, last.header) if last is not None else IndexState(None, None)

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
        self.build_index_columns(DispatchColumns(requests))

    def build_index_columns(self, columns: DispatchColumns) -> None:
        """:meth:`build_index_batch` for a chunk already in columns. Chunks of a few records take the
        per-record path, whose fixed cost is lower than numpy's."""
        with self._lock:
            end_phy_offset = self._files[-1].end_phy_offset if self._files else 0
            if columns.count < self.columnar_min_records:
                items = self.collect_items(columns.requests, end_phy_offset)
                if items is not None:
                    self._check_room(len(items))
                    self._put(items)
                return
            arrays = self.collect_columns(columns, end_phy_offset)
            if arrays is not None:
                self._check_room(arrays.size)
                self._put_columns(arrays)

    def _check_room(self, entries: int) -> None:
        """Raise DiskFullError, before anything is written, when the disk may not have the blocks that
        ``entries`` entries take: index files are sparse and written through their mapping, where a
        full disk is a SIGBUS, not an error. At most, each entry takes its 20 bytes and a page of hash
        slots, and a new file its header page: bounded by what the files have not allocated yet."""
        last = self._files[-1] if self._files else None
        writable = last if last is not None and not last.is_write_full else None
        slot_table = self.hash_slot_num * HASH_SLOT_SIZE
        needed, left = 0, entries
        while left > 0:
            here = min(left, self.index_num - (writable.index_count if writable is not None else 1))
            bound = OS_PAGE_SIZE + here * INDEX_ENTRY_SIZE + min(here * OS_PAGE_SIZE, slot_table)
            if writable is not None:
                bound = min(bound, unallocated_bytes(writable.path, writable.file_size))
            needed += bound
            left -= here
            writable = None  # the rest goes into new files
        try:
            usage = disk_usage(self.index_dir)
        except OSError:
            return  # cannot tell: the write goes ahead
        if usage.available < needed:
            raise disk_full_error(self.index_dir, f"indexing {entries} keys (up to {needed} bytes of index files)")

    @staticmethod
    def collect_items(requests: Iterable[DispatchRequest], end_phy_offset: int) -> list[IndexItem] | None:
        """The entries to put, in order; None for no request at all. ``end_phy_offset`` follows what the
        last file's endPhyOffset would be after each message, so the skip test is the per-message one.
        The path for chunks of a few records (see build_index_columns); java_hash's ASCII fast path is
        inlined and lookups are hoisted (~0.4 us a key)."""
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

    @staticmethod
    def collect_columns(columns: DispatchColumns, end_phy_offset: int) -> IndexColumns | None:
        """:meth:`collect_items` for a whole chunk at once, as arrays (None for no request at all).

        The keys' text is joined into two strings (UNIQ_KEYs, KEYS), hashed in one numpy pass
        (java_hash.segment_hashes_u32), and each word's hash is combined with its topic's "topic#"
        hash. Chunks this cannot take exactly (commitlog offsets going backwards, where the skip rule
        depends on which messages had keys; characters outside the BMP, where code points and UTF-16
        units differ) take :meth:`collect_items`."""
        n = columns.count
        if n == 0:
            return None
        offsets = columns.commitlog_offset
        if n > 1 and bool((offsets[1:] < offsets[:-1]).any()):
            return IndexColumns.of(IndexService.collect_items(columns.requests, end_phy_offset) or [])
        # Offsets ascending: end_phy_offset only grows to an offset at or below the next one, so the
        # per-message skip test is against the starting value.
        keep = (offsets >= end_phy_offset) & (columns.transaction_type != TRANSACTION_ROLLBACK_TYPE)
        uniqs, keys, timestamps = columns.uniq_keys, columns.keys, columns.store_timestamp
        topic = columns.single_topic
        topics = columns.topics if topic is None else None
        if not keep.all():
            chosen = np.flatnonzero(keep)
            pick = chosen.tolist()
            uniqs, keys = [uniqs[i] for i in pick], [keys[i] for i in pick]
            if topics is not None:
                topics = [topics[i] for i in pick]
            offsets, timestamps = offsets[chosen], timestamps[chosen]
            n = len(pick)
            if n == 0:
                return IndexColumns.empty()
        # UNIQ_KEY: one word each, even empty ("topic#"); None: no word.
        has_uniq = np.array([u is not None for u in uniqs], dtype=np.bool_) if None in uniqs else None
        uniq_words = cast(list[str], uniqs if has_uniq is None else [u for u in uniqs if u is not None])
        key_words = cast(list[str], [k or "" for k in keys] if None in keys else keys)
        uniq_text, key_text = "".join(uniq_words), "".join(key_words)
        uniq_units, key_units = utf16_units(uniq_text), utf16_units(key_text)
        if uniq_units.size != len(uniq_text) or key_units.size != len(key_text):
            return IndexColumns.of(IndexService.collect_items(
                [columns.requests[i] for i in np.flatnonzero(keep).tolist()], end_phy_offset) or [])
        uniq_length = np.array(list(map(len, uniq_words)), dtype=np.int64)
        uniq_end = np.cumsum(uniq_length)
        uniq_hash = segment_hashes_u32(uniq_units, uniq_end - uniq_length, uniq_end)
        uniq_record = np.arange(n) if has_uniq is None else np.flatnonzero(has_uniq)
        if not key_text:  # no KEYS words (a producer that sets none): the UNIQ_KEYs in record order
            prefix_one: np.ndarray | int = _topic_prefix_hash(topic) if topic is not None else np.array(
                [_topic_prefix_hash(t) for t in cast(list[str], topics)], dtype=np.uint32)[uniq_record]
            return IndexColumns(abs_java_ints(combine_u32(prefix_one, uniq_hash, uniq_length)),
                                offsets[uniq_record], timestamps[uniq_record])
        # KEYS: the non-empty runs between separators, within each record's text.
        key_length = np.array(list(map(len, key_words)), dtype=np.int64)
        key_end = np.cumsum(key_length)
        separators = np.flatnonzero(key_units == ord(KEY_SEPARATOR))
        word_start = np.sort(np.concatenate((key_end - key_length, separators + 1)), kind="stable")
        word_end = np.sort(np.concatenate((key_end, separators)), kind="stable")
        nonempty = word_end > word_start
        word_start, word_end = word_start[nonempty], word_end[nonempty]
        word_hash = segment_hashes_u32(key_units, word_start, word_end)
        word_record = np.searchsorted(key_end, word_start, side="right")
        # Items in order: each record's UNIQ_KEY, then its words.
        uniq_count = np.zeros(n, dtype=np.int64)
        uniq_count[uniq_record] = 1
        word_count = np.bincount(word_record, minlength=n)
        per_record = uniq_count + word_count
        first_item = np.cumsum(per_record) - per_record
        first_word = np.cumsum(word_count) - word_count
        total = int(per_record.sum())
        hashes = np.empty(total, dtype=np.uint32)
        lengths = np.empty(total, dtype=np.int64)
        records = np.empty(total, dtype=np.int64)
        at = first_item[uniq_record]
        hashes[at], lengths[at], records[at] = uniq_hash, uniq_length, uniq_record
        at = first_item[word_record] + uniq_count[word_record] + np.arange(word_start.size) - first_word[word_record]
        hashes[at], lengths[at], records[at] = word_hash, word_end - word_start, word_record
        if topic is not None:
            prefix: np.ndarray | int = _topic_prefix_hash(topic)
        else:
            assert topics is not None
            prefix = np.array([_topic_prefix_hash(t) for t in topics], dtype=np.uint32)[records]
        return IndexColumns(abs_java_ints(combine_u32(prefix, hashes, lengths)), offsets[records], timestamps[records])

    def _put(self, items: list[IndexItem]) -> None:
        current = self._writable_file()
        pos = current.put_items(items, 0)
        while pos < len(items):
            current = self._writable_file()
            pos = current.put_items(items, pos)

    def _put_columns(self, items: IndexColumns) -> None:
        # RocketMQ gets a writable file for every message, keys or not: a full last file rolls here too.
        pos = self._writable_file().put_columns(items, 0)
        while pos < items.size:
            pos = self._writable_file().put_columns(items, pos)

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
        make_dirs(self.index_dir)
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
    def query_offset(self, topic: str, key: str, max_num: int, begin: int, end: int,
                     skip: int = 0) -> QueryOffsetResult:
        """Commitlog offsets indexed under ``topic#key`` with an index time in [begin, end], newest file
        first and each chain newest first, at most min(max_num, maxMsgsNumBatch), after the first
        ``skip`` (a walk's next page). Hash collisions are included: the caller compares the real key.
        RocketMQ's loop: only files whose time span meets [begin, end] are searched, and the walk stops
        at a file that began before ``begin``."""
        limit = skip + min(max_num, self.max_msgs_num_batch)
        key_hash = index_key_hash_fast(f"{topic}#{key}")
        offsets: list[int] = []
        last_ts = last_offset = 0
        with self._lock:
            if self._files:
                last_ts, last_offset = self._files[-1].end_timestamp, self._files[-1].end_phy_offset
            for f in reversed(self._files):
                if f.is_time_matched(begin, end):
                    f.select_by_hash(key_hash, limit, begin, end, offsets)
                if f.begin_timestamp < begin or len(offsets) >= limit:
                    break
        return QueryOffsetResult(offsets[skip:], last_ts, last_offset)

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

    def rewind(self, cut_offset: int, saved: IndexState | None = None) -> IndexRewind:
        """Remove every entry that points at or past ``cut_offset``, in place (:meth:`IndexFile.rewind`),
        so that re-dispatch from ``cut_offset`` (a record boundary) puts each of them back once: no
        entry lost, none doubled, and the files' bytes those of a build that never had them.

        Newest file first: a file left empty is deleted, the first one that keeps an entry ends the walk.
        With ``saved`` (taken after the msync of its file), files created after it are deleted unread
        (they can hold only records from its time on, and after a power loss not even a trustworthy
        header), and its file trusts the saved header rather than its own: entries past it may be
        missing or half written. ``cut_offset`` must not be past where dispatch stood when ``saved``
        was taken. Older files are complete (each was msync'd when it filled). Without ``saved`` each
        file trusts its own header (the process's own files, or a clean or checkpointed stop).

        Raises :class:`IndexStateMismatch`, changing nothing, when ``saved``'s file is gone or is not
        what it describes. The checkpoint's indexMsgTimestamp is lowered to the new last file's end, as
        :meth:`truncate` does."""
        with self._lock:
            saved_name = saved.file_name if saved is not None else None
            saved_file = next((f for f in self._files if f.name == saved_name), None)
            if saved is not None and saved_name is not None:
                if saved_file is None:
                    raise IndexStateMismatch(f"{self.index_dir}: the saved state's file {saved_name} is gone")
                self._check_state(saved_file, saved)
            removed = repaired = 0
            deleted: list[str] = []
            while self._files:
                f = self._files[-1]
                if saved is not None and (saved_name is None or f.name > saved_name):
                    deleted.append(self._delete_last())
                    continue
                trusted = saved.header if saved is not None and f is saved_file else None
                result = f.rewind(cut_offset, trusted, exact=trusted)
                removed += result.removed
                repaired += result.repaired_slots
                if f.index_count <= 1:
                    deleted.append(self._delete_last())
                    continue  # the file before may hold entries past the cut too
                if result.changed:
                    f.flush()
                break  # this file keeps an entry below the cut: every older one lies below it
            outcome = IndexRewind(removed, deleted, repaired)
            if outcome.changed and self.checkpoint is not None:
                last = self._files[-1] if self._files else None
                covered = last.end_timestamp if last is not None else 0
                if self.checkpoint.index_msg_timestamp > covered:
                    self.checkpoint.index_msg_timestamp = covered
                    self.checkpoint.flush()
        if outcome.changed:
            log.info("index rewound to commitlog offset %d: %d entries removed, files deleted %s%s", cut_offset,
                     removed, deleted, f", {repaired} hash slots recomputed (unreadable entries)" if repaired else "")
        return outcome

    @staticmethod
    def _check_state(f: IndexFile, saved: IndexState) -> None:
        header, stored = saved.header, f.header
        if header is None:
            raise IndexStateMismatch(f"{f.path}: the saved index state has a file name but no header")
        if stored.index_count < header.index_count or (header.index_count > 1 and (
                stored.begin_phy_offset, stored.begin_timestamp) != (header.begin_phy_offset, header.begin_timestamp)):
            raise IndexStateMismatch(
                f"{f.path}: holds {stored.index_count - 1} entries from commitlog offset {stored.begin_phy_offset}, "
                f"but the saved state has {header.index_count - 1} from {header.begin_phy_offset}")

    def _delete_last(self) -> str:
        f = self._files.pop()
        f.destroy()
        return f.name

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

