"""The indexer's store: ConsumeQueues and IndexFiles built from the commitlog, and the reput offset.

It owns its own root (``consumequeue/``, ``index/``, ``checkpoint``, ``abort``, ``lock``,
``config/reput.json``) and never writes the commitlog. Dispatch, truncation and reads of the file
lists are serialised by one lock; dispatch is called with whole Tail chunks, so that lock is taken
once per chunk, not per record.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from services.store.checkpoint import StoreCheckpoint
from services.store.config import MessageStoreConfig
from services.store.consume_queue import ConsumeQueue, ConsumeQueueStore
from services.store.index_service import IndexService, QueryOffsetResult
from services.store.message import TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE, transaction_type
from services.store.record import DispatchRequest
from services.store.service_thread import LeastPages, ServiceThread
from services.store.store_root import AbortFile, StoreLock, write_atomically

log = logging.getLogger(__name__)

QueueKey = tuple[str, int]
ArrivalListener = Callable[[dict[QueueKey, int]], None]


@dataclass(slots=True, frozen=True)
class ReputState:
    """What the indexer last knew of the commitlog it follows (config/reput.json)."""

    commitlog_incarnation: str


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
        self._lock = threading.RLock()
        self.reput_offset = 0
        self.last_dispatched_store_timestamp = 0
        self.dispatched_records = 0
        self.last_exit_ok = True
        self._listeners: list[ArrivalListener] = []
        self._flush_service: IndexerFlushService | None = None

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
        """RocketMQ's load + recover for the logic files: torn ConsumeQueue tails are cut, index
        files newer than the checkpoint are dropped after a crash; dispatch resumes from the lowest
        point either of them still needs."""
        self.last_exit_ok = not self._abort.exists()
        self._checkpoint = StoreCheckpoint(self.root / "checkpoint")
        self.consume_queues.load_all()
        cq_end = self.consume_queues.recover_all()
        if self.config.message_index_enable:
            self.index = IndexService(self.root / "index", self.config.max_hash_slot_num, self.config.max_index_num,
                                      self._checkpoint)
            self.index.load(self.last_exit_ok)
        self.reput_offset = self._resume_offset(cq_end)
        log.info("indexer recovered (%s stop): %d queues, reput offset %d",
                 "clean" if self.last_exit_ok else "crashed", len(self.consume_queues.queues()), self.reput_offset)

    def _resume_offset(self, cq_end: int) -> int:
        if cq_end < 0:
            return 0
        if self.index is None:
            return cq_end
        files = self.index.files
        # Without index files the index is rebuilt from the start; otherwise re-dispatch from the
        # last indexed record (the index skips what it has, the ConsumeQueue is idempotent).
        return min(cq_end, self.index.end_phy_offset) if files else 0

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
                    self.index.close()
                self._checkpoint.close()
                self._checkpoint = None
        self._abort.remove()
        self._lock_file.release()

    # -- dispatch ----------------------------------------------------------------------------
    def add_arrival_listener(self, listener: ArrivalListener) -> None:
        self._listeners.append(listener)

    def dispatch(self, requests: Sequence[DispatchRequest], next_offset: int) -> None:
        """Build the ConsumeQueue and the index for a chunk of records (in commitlog order), then move
        the reput offset to ``next_offset``."""
        with self._lock:
            if requests:
                self.consume_queues.dispatch_batch(requests)
                if self.index is not None:
                    self.index.build_index_batch(requests)
                self.last_dispatched_store_timestamp = requests[-1].store_timestamp
                self.dispatched_records += len(requests)
            self.reput_offset = next_offset
        if requests and self._listeners:
            arrivals = _arrivals(requests)
            for listener in self._listeners:
                listener(arrivals)

    def skip_to(self, offset: int) -> None:
        """Move the reput offset without dispatching (a BLANK end of file, or files deleted below it)."""
        with self._lock:
            self.reput_offset = offset

    def truncate(self, commitlog_offset: int) -> None:
        """The commitlog now ends at ``commitlog_offset`` (a crash recovery cut it): drop every unit and
        index file that points at or past it, and resume dispatch from what is left."""
        with self._lock:
            log.warning("commitlog truncated to %d under the indexer (reput offset %d): dropping what was "
                        "built from the lost records", commitlog_offset, self.reput_offset)
            self.consume_queues.truncate_dirty(commitlog_offset)
            cq_end = self.consume_queues.max_physic_offset()
            if self.index is not None:
                self.index.truncate(commitlog_offset)
            self.reput_offset = min(self._resume_offset(cq_end) if cq_end >= 0 else 0, commitlog_offset)

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

    def query_by_key(self, topic: str, key: str, max_num: int, begin: int, end: int) -> QueryOffsetResult:
        if self.index is None:
            return QueryOffsetResult([], 0, 0)
        return self.index.query_offset(topic, key, max_num, begin, end)

    # -- flush -------------------------------------------------------------------------------
    def flush(self, least_pages: int) -> None:
        """Flush the ConsumeQueues and the index, then checkpoint the store times they now cover."""
        logics_stamp = self.consume_queues.logics_msg_timestamp
        self.consume_queues.flush_all(least_pages)
        index_stamp = self.index.flush() if self.index is not None else 0
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


def _arrivals(requests: Sequence[DispatchRequest]) -> dict[QueueKey, int]:
    """(topic, queue id) -> new max queue offset, for the queues a chunk added units to."""
    newest: dict[QueueKey, int] = {}
    for r in requests:
        if transaction_type(r.sys_flag) not in (TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE):
            newest[(r.topic, r.queue_id)] = r.queue_offset + 1
    return newest


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
