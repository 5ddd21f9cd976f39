"""RocketMQ's DefaultMessageStore: the store's lifecycle around its CommitLog.

The store owns what outlives one put: the lock and abort files, the checkpoint, recovery at start
(normal or abnormal, the missing-log and flush-loss checks, the quarantine), the topic table, the
queue table's snapshot, and the services that run beside the log: the checkpoint service and the
cleaner (``clean_commitlog.py``). The log itself (the put path, the flush hand-off, reads and tails)
is ``commit_log.py``; the store answers the MessageStore calls by handing them to it.
"""

from __future__ import annotations

import logging
import shutil
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from services.commitlog import metrics
from services.commitlog.clean_commitlog import CleanCommitLogService, CommitLogCleaner
from services.commitlog.commit_log import CommitLog, TailChunk
from services.commitlog.disk_guard import DiskGuard
from services.commitlog.ha.metadata_apply import TopicChangeLog
from services.commitlog.indexer_headroom import IndexerHeadroom
from services.commitlog.put_result import PutMessageResult
from services.commitlog.recovery import (
    MissingLogError,
    RecoveryResult,
    consumed_beyond,
    describe_unclean_async_stop,
    find_flush_loss,
    find_missing_log,
    read_dispatch_witness,
    read_dispatched_end,
    recover_abnormally,
    recover_normally,
)
from services.commitlog.topic_config import TopicConfigManager
from services.commitlog.topic_discovery import discover_queue_nums
from services.commitlog.topic_queue_table import (
    QueueKey,
    QueueOffsetSnapshot,
    QueueOffsetStore,
    keep_lost_queue_offsets,
    replay_queue_offsets,
)
from services.store.config import MessageStoreConfig
from services.store.disk_space import is_disk_full
from services.store.errors import StoreError
from services.store.formats.checkpoint import StoreCheckpoint
from services.store.formats.consumer_offsets_file import offsets_file_candidates, read_offset_table
from services.store.formats.index_file import index_file_size
from services.store.formats.message import Message, parse_delay_levels
from services.store.formats.quarantine import QUARANTINE, QuarantineTable
from services.store.formats.record import SIZE_AND_MAGIC
from services.store.formats.store_layout import INDEXER_DIR
from services.store.formats.topics_file import FILE_NAME as TOPICS_FILE
from services.store.invariants import broken
from services.store.metadata_log import METADATA_TOPIC, replicates_metadata
from services.store.rules.topics import TopicConfig
from services.store.service_thread import ServiceThread
from services.store.store_root import AbortFile, StoreLock

log = logging.getLogger(__name__)


@dataclass(slots=True, frozen=True)
class StoreStats:
    min_offset: int
    max_offset: int
    flushed_offset: int
    committed_offset: int
    mapped_file_count: int
    disk_total_bytes: int
    disk_used_bytes: int
    recovered_offset: int


class MessageStore:
    """One store root: its CommitLog, recovered on start, and the services that keep its state.
    Thread-safe as the CommitLog is; ``start`` and ``shutdown`` are called once each."""

    def __init__(self, config: MessageStoreConfig, store_root: str | Path) -> None:
        config.validate()
        self.config = config
        self.root = Path(store_root)
        self._delay_levels_ms = parse_delay_levels(config.message_delay_level)
        self._lock_file = StoreLock(self.root)
        self._abort = AbortFile(self.root)
        index_bytes = index_file_size(config.max_hash_slot_num, config.max_index_num) \
            if config.message_index_enable else 0
        headroom = IndexerHeadroom(self.root, self.root / "commitlog", self._live_queues,
                                   config.mapped_file_size_consume_queue, index_bytes)
        # What a commitlog file's creation or a reservation ahead of the writer takes at once.
        reserve_step = min(config.reserve_ahead_commit_log or config.mapped_file_size_commit_log,
                           config.mapped_file_size_commit_log)
        self.disk = DiskGuard(self.root / "commitlog", config.disk_space_warning_level_ratio,
                              reserve_step, headroom)
        self.topics = TopicConfigManager(self.root / "config" / TOPICS_FILE, config.default_topic_queue_nums,
                                         len(self._delay_levels_ms))
        self.quarantine = QuarantineTable(self.root)
        self.commit_log = CommitLog(config, self.root, self.topics, self.disk, self.quarantine, reserve_step)
        self.commit_log.truncation_listener = self._after_truncation
        if replicates_metadata(config):
            self.topics.log_change = TopicChangeLog(self.commit_log)
        self.cleaner = CommitLogCleaner(config, self.commit_log.mfq, self.disk, self.root)
        self._queue_offset_store = QueueOffsetStore(self.root / "config" / "queue_offsets.json")
        self.incarnation = ""
        self._checkpoint: StoreCheckpoint | None = None
        self._services: list[ServiceThread] = []
        self.last_exit_ok = True
        self.recovered_offset = 0
        self.recovery = RecoveryResult(0, 0, 0)  # what the last start's recovery found

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        self._lock_file.acquire()
        try:
            self._start_locked()
        except BaseException:
            self._lock_file.release()
            raise

    def _start_locked(self) -> None:
        started = time.monotonic()
        self.last_exit_ok = not self._abort.exists()
        self._checkpoint = StoreCheckpoint(self.root / "checkpoint")
        mfq = self.commit_log.mfq
        mfq.load()
        self.disk.refresh()
        cfg = self.config
        walk_started = time.monotonic()
        quarantine = cfg.recover_corruption_mode == QUARANTINE
        self.quarantine.load()
        snapshot = self._queue_offset_store.load()
        recorded_end = None if snapshot is None else snapshot.commitlog_offset  # a clean stop's: the write position
        if self.last_exit_ok:
            self.recovery = recover_normally(mfq, cfg.check_crc_on_recover, self._delay_levels_ms, quarantine,
                                             recorded_end)
        else:
            log.warning("abort file found in %s: the last stop was not clean, recovering abnormally", self.root)
            self.recovery = recover_abnormally(mfq, self._checkpoint, cfg.check_crc_on_recover,
                                               cfg.message_index_enable and cfg.message_index_safe,
                                               self._delay_levels_ms, quarantine, recorded_end)
        end = self.recovery.end
        accepted_loss = self._check_missing_log(recorded_end)
        self._check_cut(recorded_end, accepted_loss)
        self.quarantine.reconcile(self.recovery.quarantined, mfq.min_offset, end)
        for bad in self.quarantine.ranges:
            log.warning("commitlog offsets %s are QUARANTINED: reads of them answer DATA_LOSS", bad.describe())
        metrics.observe_recovery(self.recovery, time.monotonic() - walk_started)
        metrics.COMMITLOG_QUARANTINED_BYTES.set(self.quarantine.total_bytes)
        mfq.truncate_dirty_files(end)
        mfq.prefault_last_file()
        self.recovered_offset = end
        self.topics.load()
        self._restore_queue_table(end, snapshot)
        if not self.last_exit_ok and not self.commit_log.sync_flush:
            self._report_flush_loss()
        if accepted_loss:  # the evidence now describes the log as it is: the next start finds nothing missing
            self._save_queue_offsets(self.commit_log.queue_offset_snapshot())
        self._discover_topics()
        if self.topics.log_change is not None:  # before a change is logged under the table's lock
            self.topics.get_or_create(METADATA_TOPIC)
        self._abort.create()
        self.incarnation = uuid.uuid4().hex
        self._start_services()
        log.info("commitlog ready in %.2fs: offsets [%d, %d), %d queues, incarnation %s",
                 time.monotonic() - started, self.min_offset, self.max_offset, len(self.commit_log.queue_table),
                 self.incarnation)

    def _check_missing_log(self, recorded_end: int | None) -> bool:
        """A silent loss becomes a loud one: when the store's records say the log reached further than
        recovery found it, log an ERROR naming what is missing and (refuseStartOnMissingLog) refuse to
        start, before anything is truncated. True when an operator accepted the loss (the setting off)."""
        assert self._checkpoint is not None
        dispatched = read_dispatched_end(self.root / INDEXER_DIR / "config" / "dispatch_checkpoint.json")
        missing = find_missing_log(self.recovery, self._checkpoint.physic_msg_timestamp, recorded_end, dispatched)
        metrics.observe_missing_log(missing)
        if missing is None:
            return False
        if not missing.durable_evidence and not self.commit_log.sync_flush:
            log.warning("recovery: %s; under ASYNC_FLUSH records are durable only once flushed, so this is the "
                        "loss the flush policy allows (%d bytes)", missing.describe(missing.dispatched_evidence),
                        missing.dispatched_missing_bytes)
            return False
        evidence = missing.describe(missing.durable_evidence + missing.dispatched_evidence)
        if self.config.refuse_start_on_missing_log:
            log.error("recovery found LESS LOG than the store's records say existed: %s. Refusing to start; nothing "
                      "was changed. Look for the missing files (a restore, a disk, a power cut under a file system "
                      "that lost them), then start once with refuseStartOnMissingLog=false "
                      "(MQSTORE_REFUSE_START_ON_MISSING_LOG=false) to accept the loss", evidence)
            raise MissingLogError(evidence)
        log.error("recovery found LESS LOG than the store's records say existed: %s. Starting anyway "
                  "(refuseStartOnMissingLog=false): the loss is accepted and the records are reset to the log found",
                  evidence)
        self._checkpoint.physic_msg_timestamp = self.recovery.last_timestamp
        self._checkpoint.flush()
        return True

    def _check_cut(self, recorded_end: int | None, accepted_loss: bool) -> None:
        """Recovery's cut, before anything is truncated: at a record boundary (a file's start, or the end
        of the last record the walk found) within the mapped files, and never below the end the store
        recorded as durable unless the missing-log check refused to start (it raised) or the loss was
        accepted (refuseStartOnMissingLog off)."""
        result, mfq = self.recovery, self.commit_log.mfq
        end, files = result.end, mfq.files
        low, high = (files[0].file_from_offset, files[-1].file_tail_offset) if files else (0, 0)
        if not low <= end <= high:
            broken("recovery cuts within the mapped files", f"the cut at offset {end} is outside the files' "
                   f"[{low}, {high}]")
        if end % self.config.mapped_file_size_commit_log and self._last_record_end() != end:
            broken("recovery cuts at a record boundary", f"the cut at offset {end} is not the end of the last "
                   f"record found (at offset {result.last_record_offset}, ending at {self._last_record_end()})")
        explained = end + (result.damage.dropped_bytes if result.damage is not None else 0)
        if recorded_end is not None and recorded_end > explained and not accepted_loss:
            broken("recovery never cuts below the durable end without the refusal path",
                   f"the cut at offset {end} is below {recorded_end}, where the queue-offset snapshot says the "
                   "log was durable, and the missing-log check neither refused nor accepted it")

    def _last_record_end(self) -> int:
        """Where the last record recovery found ends (-1: it found none)."""
        offset = self.recovery.last_record_offset
        mapped = self.commit_log.mfq.find_by_offset(offset) if offset >= 0 else None
        if mapped is None:
            return -1
        size: int = SIZE_AND_MAGIC.unpack_from(mapped.buffer, offset - mapped.file_from_offset)[0]
        return offset + size

    def _report_flush_loss(self) -> None:
        """Under ASYNC_FLUSH an unclean stop loses what was not yet flushed: after every one a WARNING names
        the range that may be lost (:func:`describe_unclean_async_stop`) and a counter counts it; gauges say
        what every durable witness shows of it (the checkpoint, the dispatch checkpoint, consumer offsets)."""
        assert self._checkpoint is not None
        try:
            offsets = read_offset_table(offsets_file_candidates(self.root)[0])
        except (FileNotFoundError, ValueError):
            offsets = {}
        loss = find_flush_loss(self.recovery, self._checkpoint.physic_msg_timestamp,
                               read_dispatch_witness(self.root / INDEXER_DIR / "config" / "dispatch_checkpoint.json"),
                               consumed_beyond(offsets, self.commit_log.queue_table))
        metrics.observe_flush_loss(loss)
        log.warning("recovery under ASYNC_FLUSH after an unclean stop: %s",
                    describe_unclean_async_stop(self.recovery, self.config.flush_interval_commit_log, loss))

    def _restore_queue_table(self, end: int, snapshot: QueueOffsetSnapshot | None) -> None:
        mfq = self.commit_log.mfq
        start = mfq.min_offset
        table: dict[QueueKey, int] = {}
        if snapshot is not None and mfq.min_offset <= snapshot.commitlog_offset <= end:
            start, table = snapshot.commitlog_offset, dict(snapshot.next_offsets)
        elif snapshot is not None:
            log.warning("queue offset snapshot at %d is outside the log [%d, %d]: rebuilding from the log",
                        snapshot.commitlog_offset, mfq.min_offset, end)
        replayed = replay_queue_offsets(mfq, start, end, table,
                                        [(r.start, r.end) for r in self.quarantine.ranges])
        keep_lost_queue_offsets(mfq, self.quarantine.ranges, table)
        log.info("queue offsets restored: snapshot at %d, %d records replayed", start, replayed)
        self.commit_log.queue_table = table
        self._queue_offset_store.save(QueueOffsetSnapshot(end, dict(table)))

    def _discover_topics(self) -> None:
        """Topics the store's data holds but topics.json lacks (a RocketMQ store, a lost file) join the
        table, so reads of them route without a CreateTopic (``topic_discovery.py``)."""
        found = discover_queue_nums(self.root, self.commit_log.queue_table)
        for config in self.topics.merge_discovered(found):
            log.info("topic %s found in the store's data: %d queues", config.topic, config.write_queue_nums,
                     extra={"topic": config.topic})

    def _start_services(self) -> None:
        """The log's commit and flush services first, then the store's: the checkpoint service and the
        cleaner (RocketMQ's FlushConsumeQueueService checkpoint round and CleanCommitLogService)."""
        assert self._checkpoint is not None
        self.commit_log.start()
        cfg = self.config
        self._services = [
            CheckpointService(self, self._checkpoint),
            CleanCommitLogService(self.cleaner, self.disk, cfg.flush_interval_consume_queue / 1000,
                                  cfg.clean_resource_interval / 1000),
        ]
        for service in self._services:
            service.start()

    def shutdown(self) -> None:
        """Clean stop: drain puts, commit and flush everything, write the checkpoint, remove abort."""
        self.commit_log.shutdown()  # puts refused, committed and flushed: the checkpoint covers it all
        for service in self._services:
            service.stop()
        self._services = []
        mfq = self.commit_log.mfq
        if self._checkpoint is not None:
            if mfq.store_timestamp:
                self._checkpoint.physic_msg_timestamp = mfq.store_timestamp
            self._checkpoint.close()
            self._checkpoint = None
        self._save_queue_offsets(self.commit_log.queue_offset_snapshot())
        self.commit_log.close()
        self.topics.close()
        self._abort.remove()
        self._lock_file.release()
        log.info("commitlog stopped cleanly at offset %d", self.max_offset)

    @property
    def disk_full(self) -> bool:
        """Writes are refused because the disk is too full (``disk_guard.py``)."""
        return self.disk.full

    def _after_truncation(self, end: int, table: dict[QueueKey, int]) -> None:
        """A replica cut its log at ``end`` (``CommitLog.after_truncation``, under the put lock): the
        queue table's snapshot and the checkpoint's store time describe the log as it is now (a restart
        finds no "missing" log), and a new incarnation makes the indexer drop what it built past ``end``."""
        assert self._checkpoint is not None
        self._checkpoint.physic_msg_timestamp = 0
        self._checkpoint.flush()
        self._save_queue_offsets(QueueOffsetSnapshot(end, dict(table)))
        self.recovered_offset = end
        self.incarnation = uuid.uuid4().hex

    def _live_queues(self) -> dict[QueueKey, int]:
        """The queue table's queues of topics in the topic table (a deleted topic's queues keep their
        next offsets here, but the indexer writes nothing more for them)."""
        topics = self.topics
        return {key: end for key, end in dict(self.commit_log.queue_table).items() if topics.get(key[0]) is not None}

    # -- the MessageStore calls the log answers ---------------------------------------------
    def put_message(self, msg: Message) -> PutMessageResult:
        return self.commit_log.put_message(msg)

    def put_messages(self, messages: Sequence[Message]) -> list[PutMessageResult]:
        return self.commit_log.put_messages(messages)

    def put_each(self, messages: Sequence[Message]) -> list[PutMessageResult | StoreError]:
        return self.commit_log.put_each(messages)

    def read(self, offset: int, size: int) -> bytes:
        return self.commit_log.read(offset, size)

    def tail_chunk(self, offset: int, max_bytes: int) -> TailChunk:
        return self.commit_log.tail_chunk(offset, max_bytes)

    def wait_for_data(self, offset: int, timeout_s: float) -> bool:
        return self.commit_log.wait_for_data(offset, timeout_s)

    @property
    def min_offset(self) -> int:
        return self.commit_log.min_offset

    @property
    def max_offset(self) -> int:
        return self.commit_log.max_offset

    # -- info and admin ----------------------------------------------------------------------
    def stats(self) -> StoreStats:
        usage = shutil.disk_usage(self.root)
        mfq = self.commit_log.mfq
        committed = mfq.committed_where if self.commit_log.pool_enabled else mfq.max_wrote_offset
        return StoreStats(self.min_offset, self.max_offset, mfq.flushed_where, committed,
                          len(mfq.files), usage.total, usage.used, self.recovered_offset)

    def create_topic(self, config: TopicConfig) -> TopicConfig:
        return self.topics.create(config)

    def update_topic(self, config: TopicConfig) -> TopicConfig:
        return self.topics.update(config)

    def delete_topic(self, topic: str) -> int:
        """Takes the topic out of the topic table; returns the max offset once it is out (every record of
        the deleted topic lies below it). The queue table keeps the topic's next queue offsets: a topic
        created again continues them, so no record written before or after can share a queue offset with
        another, whatever order the indexer sees the deletion and the records in."""
        self.topics.delete(topic)
        return self.commit_log.queue_offset_snapshot().commitlog_offset

    def clean_expired_files(self, disk_used_ratio: float) -> list[Path]:
        """One round of RocketMQ's CleanCommitLogService at ``disk_used_ratio`` (``clean_commitlog.py``):
        expired files at the ``deleteWhen`` hour or above ``diskMaxUsedSpaceRatio``, the oldest files
        even if not expired above diskSpaceCleanForciblyRatio (each a WARNING naming the consumer
        groups that lose messages; held instead under ``protectUnconsumedData``)."""
        return [mapped.path for mapped in self.cleaner.run(disk_used_ratio)]

    def flush_and_snapshot(self) -> None:
        """Persist the queue offset table at a point the flushed log covers."""
        snapshot = self.commit_log.queue_offset_snapshot()
        mfq = self.commit_log.mfq
        while mfq.commit(0):
            pass
        mfq.flush_until(snapshot.commitlog_offset)
        if mfq.flushed_where >= snapshot.commitlog_offset:
            self._save_queue_offsets(snapshot)

    def _save_queue_offsets(self, snapshot: QueueOffsetSnapshot) -> None:
        """On a full disk the previous snapshot stays: it is behind, never ahead, and start-up replays
        the log from it, so a stop or a round on a full disk loses nothing."""
        try:
            self._queue_offset_store.save(snapshot)
        except OSError as exc:
            if not is_disk_full(exc):
                raise
            log.warning("queue offset snapshot at %d not saved, the disk is full (%s): the previous one stays",
                        snapshot.commitlog_offset, exc)


#: How often the checkpoint service looks for the first flushed record of a start (then it waits
#: flushIntervalConsumeQueue between rounds, as RocketMQ's FlushConsumeQueueService).
FIRST_CHECKPOINT_POLL_S = 0.02


class CheckpointService(ServiceThread):
    """Every ``flushIntervalConsumeQueue``: checkpoint the store time the flushed log covers (RocketMQ's
    FlushConsumeQueueService writes physicMsgTimestamp on the same round). Every
    ``flushCommitLogThoroughInterval``: persist the queue offset snapshot at a flushed point."""

    name = "store-checkpoint"

    def __init__(self, store: MessageStore, checkpoint: StoreCheckpoint) -> None:
        super().__init__()
        self._store = store
        self._checkpoint = checkpoint
        self._interval_s = store.config.flush_interval_consume_queue / 1000
        self._snapshot_interval_s = store.config.flush_commit_log_thorough_interval / 1000
        self._last_snapshot = time.monotonic()
        self._checkpointed = False

    def run_once(self) -> None:
        # Until this start's first flushed record is checkpointed, look every FIRST_CHECKPOINT_POLL_S:
        # a log lost soon after a start (a power cut on a file system that dropped its bytes or its
        # file's name) must leave durable word that flushed records existed, or the missing-log check
        # has nothing to go by and the next start serves the empty log without a word.
        self._stopped.wait(self._interval_s if self._checkpointed else min(self._interval_s, FIRST_CHECKPOINT_POLL_S))
        if self.stopped:
            return
        stamp = self._store.commit_log.mfq.store_timestamp
        if stamp and stamp != self._checkpoint.physic_msg_timestamp:
            self._checkpoint.physic_msg_timestamp = stamp
            self._checkpoint.flush()
            self._checkpointed = True
        if time.monotonic() - self._last_snapshot >= self._snapshot_interval_s:
            self._last_snapshot = time.monotonic()
            self._store.flush_and_snapshot()
