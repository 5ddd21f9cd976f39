"""The indexer's store: ConsumeQueues and IndexFiles built from the commitlog, and the reput offset.

It owns its own root (``consumequeue/``, ``index/``, ``checkpoint``, ``abort``, ``lock``,
``config/reput.json``, ``config/dispatch_checkpoint.json``) and never writes the commitlog. Dispatch,
truncation and reads of the file lists are serialised by one lock; dispatch is called with whole Tail
chunks, so that lock is taken once per chunk, not per record.

Recovery is bounded by the dispatch checkpoint (``dispatch_checkpoint.py``), taken every flush round
and at a clean stop: the index is rewound to it and dispatch resumes from its reput offset, so a
restart re-reads what was dispatched since the last flush round, whatever the size of the log.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from services.indexer.dispatch_checkpoint import DispatchCheckpoint, DispatchCheckpointFile
from services.store.config import MessageStoreConfig
from services.store.formats.checkpoint import StoreCheckpoint
from services.store.formats.consume_queue import COLUMNAR_MIN_RECORDS, ConsumeQueue, ConsumeQueueStore
from services.store.formats.dispatch_columns import DispatchColumns
from services.store.formats.index_service import IndexRewind, IndexService, IndexStateMismatch, QueryOffsetResult
from services.store.formats.message import TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE, TRANSACTION_TYPE_MASK
from services.store.formats.record import DispatchRequest
from services.store.invariants import broken
from services.store.service_thread import LeastPages, ServiceThread
from services.store.store_root import AbortFile, StoreLock, remove_durably, write_atomically

log = logging.getLogger(__name__)

QueueKey = tuple[str, int]
#: Topics whose deletion by dispatch is remembered for DeleteTopic's answer. A follower's indexer is
#: never asked, so the oldest are forgotten past this many (their answer is then that of a deletion now).
DISPATCH_DELETIONS_KEPT = 1024


@dataclass(slots=True, frozen=True)
class ArrivalBatch:
    """What one dispatch step published: the new max offset of each queue it added units to, and the
    reput offset after it (the dispatch bound a reader of the store files trusts). ``truncated``: the
    commitlog was cut under the indexer, ``maxima`` holds every queue's new (possibly lower) max."""

    maxima: dict[QueueKey, int]
    reput_offset: int
    truncated: bool = False
    #: A topic whose queues were deleted (``IndexerStore.delete_topic``): readers forget them.
    deleted: str = ""


ArrivalListener = Callable[[ArrivalBatch], None]


@dataclass(slots=True, frozen=True)
class ReputState:
    """What the indexer last knew of the commitlog it follows (config/reput.json)."""

    commitlog_incarnation: str


@dataclass(slots=True, frozen=True)
class RecoveryReport:
    """How the last start-up recovered: the reput offset dispatch resumed from, the dispatch
    checkpoint's (-1: none was used), what the index rewind removed, and how long it all took."""

    clean: bool
    resume_offset: int
    checkpoint_offset: int
    rewound_entries: int
    deleted_index_files: tuple[str, ...]
    seconds: float


class IndexerStore:
    def __init__(self, config: MessageStoreConfig, root: str | Path) -> None:
        self.config = config
        self.root = Path(root)
        self.consume_queues = ConsumeQueueStore(self.root / "consumequeue", config.mapped_file_size_consume_queue)
        self._checkpoint: StoreCheckpoint | None = None
        self.index: IndexService | None = None
        self._lock_file = StoreLock(self.root)
        self._abort = AbortFile(self.root)
        self._reput_state_path = self.root / "config" / "reput.json"
        self._dispatch_checkpoint_file = DispatchCheckpointFile(self.root / "config" / "dispatch_checkpoint.json")
        #: the last dispatch checkpoint saved; a rewind never goes past its reput offset's state
        self.dispatch_checkpoint: DispatchCheckpoint | None = None
        #: bumped by every rewind: a flush round's snapshot taken before one must not be saved after it
        self._rewinds = 0
        self._save_lock = threading.Lock()
        #: held by a flush round's ConsumeQueue flush and by a topic deletion (no flush of a deleted file)
        self._flush_lock = threading.RLock()
        self.recovery: RecoveryReport | None = None
        self._lock = threading.RLock()
        self.reput_offset = 0
        self.last_dispatched_store_timestamp = 0
        self.dispatched_records = 0
        self.last_exit_ok = True
        self._listeners: list[ArrivalListener] = []
        self._flush_service: IndexerFlushService | None = None
        #: topic -> queues dispatch removed at its last deletion record, until DeleteTopic takes it
        self._dispatch_deletions: dict[str, int] = {}

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        self._lock_file.acquire()
        try:
            self._recover()
        except BaseException:
            self._lock_file.release()
            raise
        self._abort.create()
        self._flush_service = IndexerFlushService(self)
        self._flush_service.start()

    def _recover(self) -> None:
        """RocketMQ's load + recover for the logic files (torn ConsumeQueue tails are cut), then the
        index is rewound to where dispatch resumes: the dispatch checkpoint's reput offset, or without
        one RocketMQ's rule (index files newer than indexMsgTimestamp dropped after a crash) and the
        lower of the ConsumeQueues' end and the index's endPhyOffset."""
        started = time.monotonic()
        self.last_exit_ok = not self._abort.exists()
        self._checkpoint = StoreCheckpoint(self.root / "checkpoint")
        self.consume_queues.load_all()
        cq_end = self.consume_queues.recover_all()
        saved: DispatchCheckpoint | None = None
        rewind = IndexRewind(0, [], 0)
        if self.config.message_index_enable:
            saved, resume, rewind = self._recover_index(cq_end)
        else:
            resume = max(cq_end, 0)
        self.reput_offset = resume
        self._save_dispatch_checkpoint(after_rewind=True)
        self.recovery = RecoveryReport(self.last_exit_ok, resume, saved.reput_offset if saved is not None else -1,
                                       rewind.removed_entries, tuple(rewind.deleted_files),
                                       time.monotonic() - started)
        how = "clean" if self.last_exit_ok else "crashed"
        source = f"dispatch checkpoint at {saved.reput_offset}" if saved is not None else "no dispatch checkpoint"
        log.info("indexer recovered (%s stop): %d queues, reput offset %d (%s; index rewind removed %d entries, "
                 "deleted files %s) in %.3f s", how, len(self.consume_queues.queues()), resume, source,
                 rewind.removed_entries, rewind.deleted_files, self.recovery.seconds,
                 extra={"resume_offset": resume, "checkpoint_offset": self.recovery.checkpoint_offset,
                        "rewound_entries": rewind.removed_entries, "last_exit": how})

    def _recover_index(self, cq_end: int) -> tuple[DispatchCheckpoint | None, int, IndexRewind]:
        """(the dispatch checkpoint used, the reput offset to resume from, what the rewind did)."""
        saved = self._dispatch_checkpoint_file.load()
        if saved is not None and saved.index is not None:
            resume = saved.reput_offset
            if cq_end < saved.consume_queue_end:
                # The ConsumeQueues lost units they had at the checkpoint (they are not msync'd with it:
                # a power loss): re-dispatch from their end, and rewind the index as far.
                log.warning("the ConsumeQueues end at %d, below the %d they had at the dispatch checkpoint: "
                            "resuming from there", cq_end, saved.consume_queue_end)
                resume = max(cq_end, 0)
            index = self._open_index(last_exit_ok=True)
            try:
                return saved, resume, index.rewind(resume, saved.index)
            except IndexStateMismatch as exc:
                log.warning("the dispatch checkpoint does not describe the index files (%s): recovering without "
                            "it", exc)
                index.close()
        index = self._open_index(self.last_exit_ok)
        # Re-dispatch from the last indexed record; the rewind takes its entries out first, so the
        # index holds it once (RocketMQ indexes it a second time).
        resume = min(cq_end, index.end_phy_offset) if cq_end >= 0 and index.files else 0
        return None, resume, index.rewind(resume)

    def _open_index(self, last_exit_ok: bool) -> IndexService:
        assert self._checkpoint is not None
        self.index = IndexService(self.root / "index", self.config.max_hash_slot_num, self.config.max_index_num,
                                  self._checkpoint)
        self.index.load(last_exit_ok)
        return self.index

    def shutdown(self) -> None:
        if self._flush_service is not None:
            self._flush_service.stop()
            self._flush_service = None
        with self._lock:
            self.consume_queues.shutdown()
            if self._checkpoint is not None:
                if self.consume_queues.logics_msg_timestamp:
                    self._checkpoint.logics_msg_timestamp = self.consume_queues.logics_msg_timestamp
                if self.index is not None:
                    stamp = self.index.flush()
                    if stamp:
                        self._checkpoint.index_msg_timestamp = stamp
                    self._save_dispatch_checkpoint()  # a clean restart resumes exactly here
                    self.index.close()
                self._checkpoint.close()
                self._checkpoint = None
        self._abort.remove()
        self._lock_file.release()

    # -- dispatch ----------------------------------------------------------------------------
    def add_arrival_listener(self, listener: ArrivalListener) -> None:
        self._listeners.append(listener)

    def dispatch(self, requests: Sequence[DispatchRequest], next_offset: int, deleted_topic: str = "") -> None:
        """Build the ConsumeQueue and the index for a chunk of records (in commitlog order), then move
        the reput offset to ``next_offset``.

        ``deleted_topic``: the chunk ends with that topic's deletion record (``topic_deletion.py``), so
        its queues are removed right there, as every replica of the shard removes them. The move and the
        removal are one step under the dispatch lock: a DeleteTopic call that sees the reput offset past
        its deletion point finds the removal done (``take_dispatch_deletion``)."""
        columns = DispatchColumns(requests)  # read once, shared by the ConsumeQueues and the index
        deletion: ArrivalBatch | None = None
        with self._lock:
            if requests:
                _check_dispatch_order(columns, self.reput_offset, next_offset)
                self.consume_queues.dispatch_columns(columns)
                if self.index is not None:
                    self.index.build_index_columns(columns)
                self.last_dispatched_store_timestamp = requests[-1].store_timestamp
                self.dispatched_records += len(requests)
            self.reput_offset = next_offset
            if deleted_topic:
                removed, deletion = self._remove_topic(deleted_topic)
                self._dispatch_deletions.pop(deleted_topic, None)  # the newest last: the oldest go first
                self._dispatch_deletions[deleted_topic] = removed
                while len(self._dispatch_deletions) > DISPATCH_DELETIONS_KEPT:
                    del self._dispatch_deletions[next(iter(self._dispatch_deletions))]
        if self._listeners:
            if requests:  # the records first, then the deletion: readers end without the topic's queues
                self._publish(ArrivalBatch(_arrivals(columns), next_offset))
            if deletion is not None:
                self._publish(deletion)

    def _publish(self, batch: ArrivalBatch) -> None:
        for listener in self._listeners:
            listener(batch)

    def skip_to(self, offset: int) -> None:
        """Move the reput offset without dispatching (a BLANK end of file, or files deleted below it)."""
        with self._lock:
            self.reput_offset = offset

    def built_past(self, commitlog_offset: int) -> bool:
        """Whether a ConsumeQueue unit points at or past ``commitlog_offset``. The reput offset resumes
        from the dispatch checkpoint, which can be behind the queues' files (their pages flushed after
        it): units past it that point at records a power cut took are there too."""
        return any(q.max_physic_offset > commitlog_offset for q in self.consume_queues.queues())

    def truncate(self, commitlog_offset: int) -> None:
        """The commitlog now ends at ``commitlog_offset`` (a crash recovery cut it): drop every unit that
        points at or past it, rewind the index to it (or to the dispatch checkpoint, if that is lower:
        the rewind then lands on a state it knows exactly) and resume dispatch from there."""
        with self._lock:
            log.warning("commitlog truncated to %d under the indexer (reput offset %d): dropping what was "
                        "built from the lost records", commitlog_offset, self.reput_offset)
            self.consume_queues.truncate_dirty(commitlog_offset)
            resume = commitlog_offset
            saved = self.dispatch_checkpoint
            if self.index is not None:
                with self._save_lock:
                    self._rewinds += 1
                    try:
                        if saved is not None and saved.reput_offset <= commitlog_offset:
                            self.index.rewind(saved.reput_offset, saved.index)
                            resume = saved.reput_offset
                    except IndexStateMismatch as exc:  # its file expired meanwhile: the files are ours anyway
                        log.info("rewinding to the commitlog's end instead of the dispatch checkpoint: %s", exc)
                    self.index.rewind(resume)
            self.reput_offset = min(self.reput_offset, resume)
            self._save_dispatch_checkpoint(after_rewind=True)
            batch = ArrivalBatch({(q.topic, q.queue_id): q.max_offset_in_queue for q in self.consume_queues.queues()},
                                 self.reput_offset, truncated=True)
        if self._listeners:
            # Readers of the files bound their reads by the max offsets published before: lower them.
            self._publish(batch)

    def delete_topic(self, topic: str) -> int:
        """RocketMQ's deleteTopics for one topic, now: its ConsumeQueues' files removed, the queues
        forgotten (a later record of the topic starts new ones), followers told (an arrival with
        ``deleted``). The index keeps its entries: they expire with their files. Returns how many queues
        went. (On a replicated shard dispatch removes them at the deletion record instead: ``dispatch``.)"""
        with self._lock:
            removed, batch = self._remove_topic(topic)
        if self._listeners:
            self._publish(batch)
        return removed

    def take_dispatch_deletion(self, topic: str) -> int | None:
        """How many queues dispatch removed at the topic's last deletion record, once (the entry is
        taken, so a second DeleteTopic answers as a second deletion would: nothing left); None when
        dispatch removed none of its queues at such a record, as far as this process knows. Under the
        dispatch lock: a deletion whose reput offset a caller saw is complete."""
        with self._lock:
            return self._dispatch_deletions.pop(topic, None)

    def _remove_topic(self, topic: str) -> tuple[int, ArrivalBatch]:
        """Remove the topic's queues and save a dispatch checkpoint past them (the caller holds the
        dispatch lock and publishes the returned arrival after it)."""
        with self._flush_lock:
            queues = self.consume_queues.remove_topic(topic)
            for queue in queues:
                queue.destroy()
            with contextlib.suppress(OSError):  # gone already, or holds something that is not ours
                (self.consume_queues.root / topic).rmdir()
            try:
                self._save_dispatch_checkpoint()  # a restart resumes past the deleted records
            except OSError as exc:  # the queues are gone all the same; the next flush round saves it
                log.warning("dispatch checkpoint not saved after deleting topic %s: %s", topic, exc)
        log.info("topic %s deleted at reput offset %d: %d ConsumeQueues removed", topic, self.reput_offset,
                 len(queues), extra={"topic": topic})
        return len(queues), ArrivalBatch({}, self.reput_offset, deleted=topic)

    def correct_min_offset(self, commitlog_min_offset: int) -> None:
        with self._lock:
            self.consume_queues.correct_min_offset(commitlog_min_offset)
            if self.index is not None:
                self.index.delete_expired(commitlog_min_offset)

    # -- reput state -------------------------------------------------------------------------
    def load_reput_state(self) -> ReputState | None:
        try:
            return ReputState(json.loads(self._reput_state_path.read_text())["commitlogIncarnation"])
        except (OSError, ValueError, KeyError):
            return None

    def save_reput_state(self, state: ReputState) -> None:
        body = json.dumps({"commitlogIncarnation": state.commitlog_incarnation}).encode()
        write_atomically(self._reput_state_path, body)

    # -- reads -------------------------------------------------------------------------------
    def queue(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        return self.consume_queues.find(topic, queue_id)

    def query_by_key(self, topic: str, key: str, max_num: int, begin: int, end: int,
                     skip: int = 0) -> QueryOffsetResult:
        if self.index is None:
            return QueryOffsetResult([], 0, 0)
        return self.index.query_offset(topic, key, max_num, begin, end, skip)

    # -- flush -------------------------------------------------------------------------------
    def flush(self, least_pages: int) -> None:
        """Flush the ConsumeQueues and the index, then checkpoint: the store times they now cover, and
        (the index msync'd first) the dispatch checkpoint a crash restart will resume from."""
        logics_stamp = self.consume_queues.logics_msg_timestamp
        with self._flush_lock:
            self.consume_queues.flush_all(least_pages)
        with self._lock:
            snapshot, rewinds = self._dispatch_snapshot(), self._rewinds
        if snapshot != self.dispatch_checkpoint:
            # Every unit below the snapshot's reput offset durable before it is saved, whatever the least
            # pages and in every file (a queue that rolled since the last round has units in two): a
            # restart checks only the largest ConsumeQueue end, so a queue whose units a power cut took
            # would be resumed past them.
            with self._flush_lock:
                self.consume_queues.flush_everything()
        index_stamp = self.index.flush() if self.index is not None else 0
        if snapshot != self.dispatch_checkpoint:
            with self._save_lock:
                if rewinds == self._rewinds:  # else a rewind since the snapshot saved its own state
                    self._dispatch_checkpoint_file.save(snapshot)
                    self.dispatch_checkpoint = snapshot
        checkpoint = self._checkpoint
        if checkpoint is None:
            return
        changed = False
        if logics_stamp and logics_stamp != checkpoint.logics_msg_timestamp:
            checkpoint.logics_msg_timestamp = logics_stamp
            changed = True
        if index_stamp and index_stamp != checkpoint.index_msg_timestamp:
            checkpoint.index_msg_timestamp = index_stamp
            changed = True
        if changed:
            checkpoint.flush()

    def _dispatch_snapshot(self) -> DispatchCheckpoint:
        """Where dispatch stands now (under the dispatch lock, so the three agree)."""
        return DispatchCheckpoint(self.reput_offset, self.consume_queues.max_physic_offset(),
                                  self.index.state() if self.index is not None else None)

    def _save_dispatch_checkpoint(self, after_rewind: bool = False) -> None:
        """msync the index, then save where dispatch stands (the caller holds the dispatch lock or runs
        alone: start-up, shutdown). ``after_rewind``: the index may now be behind the saved checkpoint,
        which would then describe entries that are gone; if the new one cannot be saved (a full disk),
        the old one is deleted, and a crash restart recovers without one."""
        if self.index is None:
            return
        with self._flush_lock:  # every unit the checkpoint covers durable first
            self.consume_queues.flush_everything()
        with self._save_lock:
            self.index.flush()
            snapshot = self._dispatch_snapshot()
            try:
                self._dispatch_checkpoint_file.save(snapshot)
            except OSError:
                if after_rewind:
                    remove_durably(self._dispatch_checkpoint_file.path)
                    self.dispatch_checkpoint = None
                raise
            self.dispatch_checkpoint = snapshot


def _arrivals(columns: DispatchColumns) -> dict[QueueKey, int]:
    """(topic, queue id) -> new max queue offset, for the queues a chunk added units to."""
    requests = columns.requests
    if columns.count >= COLUMNAR_MIN_RECORDS and columns.all_success and bool((columns.msg_size > 0).all()):
        # the ConsumeQueues' grouping (already made): the same records, each queue's last one
        queue_offsets = columns.queue_offset
        return {(topic, queue_id): int(queue_offsets[rows[-1]]) + 1 for topic, queue_id, rows in columns.queue_rows}
    mask, skipped = TRANSACTION_TYPE_MASK, (TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE)
    # In commitlog order a queue's last record has its highest queue offset: the last one wins.
    return {(r.topic, r.queue_id): r.queue_offset + 1 for r in requests if r.sys_flag & mask not in skipped}


class IndexerFlushService(ServiceThread):
    """FlushConsumeQueueService: every ``flushIntervalConsumeQueue`` ms flush queues with at least
    ``flushConsumeQueueLeastPages`` dirty pages (all of them every ``flushConsumeQueueThoroughInterval``)."""

    name = "flush-consumequeue"

    def __init__(self, store: IndexerStore) -> None:
        super().__init__()
        self._store = store
        cfg = store.config
        self._interval_s = cfg.flush_interval_consume_queue / 1000
        self._least_pages = LeastPages(cfg.flush_consume_queue_least_pages, cfg.flush_consume_queue_thorough_interval)

    def run_once(self) -> None:
        self._stopped.wait(self._interval_s)
        self._store.flush(self._least_pages.now())


def _check_dispatch_order(columns: DispatchColumns, reput_offset: int, next_offset: int) -> None:
    """The reput's contract with the files it builds: a chunk's records start at or past the reput
    offset, each past the end of the one before, and the next reput offset is at or past their end.
    A ConsumeQueue skips a unit it believes built already, so a record dispatched out of order would be
    lost from its queue silently."""
    offsets = columns.commitlog_offset
    ends = offsets + columns.msg_size
    invariant = "dispatched commitlog offsets increase"
    if offsets[0] < reput_offset:
        broken(invariant, f"a chunk's first record is at offset {offsets[0]}, below the reput offset {reput_offset}")
    if offsets.size > 1:
        behind = np.flatnonzero(offsets[1:] < ends[:-1])
        if behind.size:
            i = int(behind[0]) + 1
            broken(invariant, f"the record at offset {offsets[i]} starts before the end {ends[i - 1]} of the one "
                   "dispatched before it")
    if next_offset < ends[-1]:
        broken(invariant, f"the next reput offset {next_offset} is below the end {ends[-1]} of the chunk dispatched")
