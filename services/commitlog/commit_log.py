"""The CommitLog engine: one sequential log of every message, recovered on start, flushed by policy.

Usable in-process (tests, benchmarks) and behind the gRPC servicer. Thread-safe: appends are
serialised by the put lock; reads and tails run concurrently with them.
"""

from __future__ import annotations

import logging
import shutil
import struct
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from services.commitlog import metrics
from services.commitlog.clean_commitlog import CommitLogCleaner
from services.commitlog.disk_guard import DiskGuard
from services.commitlog.flush import CommitRealTimeService, FlushRealTimeService, GroupCommitService
from services.commitlog.indexer_headroom import IndexerHeadroom
from services.commitlog.message_encoder import EncodedMessage, MessageEncoder
from services.commitlog.put_result import PutMessageError, PutMessageResult, PutMessageStatus
from services.commitlog.recovery import (
    MissingLogError,
    RecoveryResult,
    consumed_beyond,
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
    advances_queue,
    replay_queue_offsets,
)
from services.server import tracing
from services.store.config import SYNC_FLUSH, MessageStoreConfig
from services.store.disk_space import is_disk_full
from services.store.errors import (
    DataLossError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    OutOfRangeError,
    ResourceExhaustedError,
    StoreError,
    UnavailableError,
)
from services.store.formats.checkpoint import StoreCheckpoint
from services.store.formats.chunk_walk import ChunkStop, walk_chunk
from services.store.formats.consume_queue import CQ_STORE_UNIT_SIZE, starts_page
from services.store.formats.consumer_offsets_file import offsets_file_candidates, read_offset_table
from services.store.formats.index_file import index_file_size
from services.store.formats.mapped_file import MappedFile
from services.store.formats.mapped_file_queue import MappedFileQueue
from services.store.formats.message import SCHEDULE_TOPIC, Message, parse_delay_levels
from services.store.formats.quarantine import QUARANTINE, QuarantinedRange, QuarantineTable
from services.store.formats.record import (
    BLANK_MAGIC_CODE,
    END_FILE_MIN_BLANK_LENGTH,
    MESSAGE_MAGIC_CODE,
    MESSAGE_MAGIC_CODE_V2,
    PHYSICAL_OFFSET_POS,
    QUEUE_OFFSET_POS,
    SIZE_AND_MAGIC,
    RecordError,
    decode_record,
    encode_blank,
)
from services.store.formats.store_layout import INDEXER_DIR
from services.store.formats.transient_store_pool import TransientStorePool
from services.store.rules.names import check_topic_name
from services.store.rules.timer_message import TIMER_TOPIC
from services.store.rules.topics import PERM_WRITE, TopicConfig
from services.store.rules.transaction_records import TRANSACTION_TOPICS
from services.store.service_thread import ServiceThread
from services.store.store_root import AbortFile, StoreLock

log = logging.getLogger(__name__)

_I64 = struct.Struct(">q")
_OFFSETS = struct.Struct(">qq")  # QUEUEOFFSET, PHYSICALOFFSET: adjacent in the record
MAX_READ_BYTES = 64 * 1024 * 1024
_PENDING = StoreError("placeholder for a message not yet appended")
PUT_OK = PutMessageStatus.PUT_OK


@dataclass(slots=True, frozen=True)
class TailChunk:
    """Whole records from ``start_offset``; the next chunk starts at ``next_offset``.

    Four kinds: records (``record_count`` > 0; ``next_offset`` is their end, or the next file's start
    when they reach a BLANK); a BLANK skip (no records, ``next_offset`` is the next file's start:
    ``start_offset`` is a BLANK end of file, or a file BLANK from its first byte); a quarantine skip
    (no records, ``start_offset`` inside a quarantined range, ``next_offset`` its end: see
    ``services/store/formats/quarantine.py``); the end of the log (no records, ``next_offset == start_offset``).
    Records chunks stop at a quarantined range's start."""

    start_offset: int
    data: bytes
    next_offset: int
    record_count: int

    @property
    def skips_blank(self) -> bool:
        """The chunk ends at a BLANK or is a quarantine skip: ``next_offset`` jumps over bytes that hold
        no record (the rest of a file, or a quarantined range)."""
        return self.next_offset != self.start_offset + len(self.data)


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


class CommitLog:
    def __init__(self, config: MessageStoreConfig, store_root: str | Path) -> None:
        config.validate()
        self.config = config
        self.root = Path(store_root)
        self.sync_flush = config.flush_disk_type == SYNC_FLUSH
        # RocketMQ uses the pool only for an async-flushing master.
        self.pool_enabled = config.transient_store_pool_enable and not self.sync_flush
        self._delay_levels_ms = parse_delay_levels(config.message_delay_level)
        self._lock_file = StoreLock(self.root)
        self._abort = AbortFile(self.root)
        self.pool = TransientStorePool(config.transient_store_pool_size, config.mapped_file_size_commit_log) \
            if self.pool_enabled else None
        self.queue_table: dict[QueueKey, int] = {}
        index_bytes = index_file_size(config.max_hash_slot_num, config.max_index_num) \
            if config.message_index_enable else 0
        headroom = IndexerHeadroom(self.root, self.root / "commitlog", self._live_queues,
                                   config.mapped_file_size_consume_queue, index_bytes)
        # What a commitlog file's creation or a reservation ahead of the writer takes at once.
        reserve_step = min(config.reserve_ahead_commit_log or config.mapped_file_size_commit_log,
                           config.mapped_file_size_commit_log)
        self.disk = DiskGuard(self.root / "commitlog", config.disk_space_warning_level_ratio,
                              reserve_step, headroom)
        #: ConsumeQueue units per file: a message whose queue offset is a multiple starts a new file.
        self._queue_units_per_file = max(1, config.mapped_file_size_consume_queue // CQ_STORE_UNIT_SIZE)
        self.mfq = MappedFileQueue(self.root / "commitlog", config.mapped_file_size_commit_log, self.pool,
                                   prefault=config.prefault_mapped_file and not self.pool_enabled,
                                   space_check=self.disk.check_new_file, reserve_step=reserve_step)
        self.cleaner = CommitLogCleaner(config, self.mfq, self.disk, self.root)
        self.topics = TopicConfigManager(self.root / "config" / "topics.json", config.default_topic_queue_nums,
                                         len(self._delay_levels_ms))
        self._queue_offset_store = QueueOffsetStore(self.root / "config" / "queue_offsets.json")
        self.quarantine = QuarantineTable(self.root)
        self.encoder = MessageEncoder(config.store_host, config.max_message_size,
                                      config.mapped_file_size_commit_log, len(self._delay_levels_ms),
                                      config.timer_max_delay_sec)
        self._put_lock = threading.Lock()
        # RocketMQ's beginTimeInLock: when the put holding the lock started (0 = none), for isOSPageCacheBusy.
        self._begin_time_in_lock = 0.0
        self._busy_timeout_s = config.os_page_cache_busy_time_out_mills / 1000
        self._new_data = threading.Condition()
        self._tail_waiters = 0
        self._running = False
        self.incarnation = ""
        self._checkpoint: StoreCheckpoint | None = None
        self._services: list[ServiceThread] = []
        self._group_commit: GroupCommitService | None = None
        self._flush_service: ServiceThread | None = None
        self._wake_flush_service = False
        self._state_service: StoreStateService | None = None
        self.last_exit_ok = True
        self.recovered_offset = 0
        self.recovery = RecoveryResult(0, 0, 0)  # what the last start's recovery found
        # Replication (services/commitlog/ha/): under SYNC_MASTER, a put also waits until enough
        # followers hold its end offset (raises UnavailableError otherwise); a follower refuses every
        # put with this reason (FAILED_PRECONDITION naming its leader).
        self.wait_for_replicas: Callable[[int], None] | None = None
        self.write_refusal: str | None = None

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
        self.mfq.load()
        self.disk.refresh()
        cfg = self.config
        walk_started = time.monotonic()
        quarantine = cfg.recover_corruption_mode == QUARANTINE
        self.quarantine.load()
        snapshot = self._queue_offset_store.load()
        recorded_end = None if snapshot is None else snapshot.commitlog_offset  # a clean stop's: the write position
        if self.last_exit_ok:
            self.recovery = recover_normally(self.mfq, cfg.check_crc_on_recover, self._delay_levels_ms, quarantine,
                                             recorded_end)
        else:
            log.warning("abort file found in %s: the last stop was not clean, recovering abnormally", self.root)
            self.recovery = recover_abnormally(self.mfq, self._checkpoint, cfg.check_crc_on_recover,
                                               cfg.message_index_enable and cfg.message_index_safe,
                                               self._delay_levels_ms, quarantine, recorded_end)
        end = self.recovery.end
        accepted_loss = self._check_missing_log(recorded_end)
        self.quarantine.reconcile(self.recovery.quarantined, self.mfq.min_offset, end)
        for bad in self.quarantine.ranges:
            log.warning("commitlog offsets %s are QUARANTINED: reads of them answer DATA_LOSS", bad.describe())
        metrics.observe_recovery(self.recovery, time.monotonic() - walk_started)
        metrics.COMMITLOG_QUARANTINED_BYTES.set(self.quarantine.total_bytes)
        self.mfq.truncate_dirty_files(end)
        self.mfq.prefault_last_file()
        self.recovered_offset = end
        self.topics.load()
        self._restore_queue_table(end, snapshot)
        if not self.last_exit_ok and not self.sync_flush:
            self._report_flush_loss()
        if accepted_loss:  # the evidence now describes the log as it is: the next start finds nothing missing
            self._save_queue_offsets(self.queue_offset_snapshot())
        self._discover_topics()
        self._abort.create()
        self.incarnation = uuid.uuid4().hex
        self._start_services()
        self._running = True
        log.info("commitlog ready in %.2fs: offsets [%d, %d), %d queues, incarnation %s",
                 time.monotonic() - started, self.min_offset, self.max_offset, len(self.queue_table),
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
        if not missing.durable_evidence and not self.sync_flush:
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

    def _report_flush_loss(self) -> None:
        """Under ASYNC_FLUSH an unclean stop loses what was not yet flushed: a WARNING and gauges say what
        every durable witness shows of it (the checkpoint, the dispatch checkpoint, consumer offsets)."""
        assert self._checkpoint is not None
        try:
            offsets = read_offset_table(offsets_file_candidates(self.root)[0])
        except (FileNotFoundError, ValueError):
            offsets = {}
        loss = find_flush_loss(self.recovery, self._checkpoint.physic_msg_timestamp,
                               read_dispatch_witness(self.root / INDEXER_DIR / "config" / "dispatch_checkpoint.json"),
                               consumed_beyond(offsets, self.queue_table))
        metrics.observe_flush_loss(loss)
        if loss is not None:
            log.warning("recovery under ASYNC_FLUSH after an unclean stop: %s", loss.describe())

    def _restore_queue_table(self, end: int, snapshot: QueueOffsetSnapshot | None) -> None:
        start = self.mfq.min_offset
        table: dict[QueueKey, int] = {}
        if snapshot is not None and self.mfq.min_offset <= snapshot.commitlog_offset <= end:
            start, table = snapshot.commitlog_offset, dict(snapshot.next_offsets)
        elif snapshot is not None:
            log.warning("queue offset snapshot at %d is outside the log [%d, %d]: rebuilding from the log",
                        snapshot.commitlog_offset, self.mfq.min_offset, end)
        replayed = replay_queue_offsets(self.mfq, start, end, table,
                                        [(r.start, r.end) for r in self.quarantine.ranges])
        for bad in self.quarantine.ranges:
            self._keep_lost_queue_offset(bad, table)
        log.info("queue offsets restored: snapshot at %d, %d records replayed", start, replayed)
        self.queue_table = table
        self._queue_offset_store.save(QueueOffsetSnapshot(end, dict(table)))

    def _keep_lost_queue_offset(self, bad: QuarantinedRange, table: dict[QueueKey, int]) -> None:
        """A quarantined record that was the last of its queue must not have its queue offset handed out
        again: the indexer may hold a (voided) unit there, and a second record at that offset would be
        skipped as already built. When the damage left the record's fields readable (a flipped body
        byte: a CRC mismatch), its queue offset is kept used; otherwise a WARNING says it may be reused."""
        mapped = self.mfq.find_by_offset(bad.start)
        try:
            if mapped is None:
                raise RecordError("no file holds it")
            record = decode_record(mapped.buffer, bad.start - mapped.file_from_offset)
            if record.commitlog_offset != bad.start:
                raise RecordError(f"it claims offset {record.commitlog_offset}")
        except RecordError as exc:
            log.warning("the queue of the record lost at quarantined offset %d is unknown (%s): if it was the "
                        "last of its queue, its queue offset is handed out again", bad.start, exc)
            return
        if advances_queue(record.sys_flag):
            key = (record.topic, record.queue_id)
            table[key] = max(table.get(key, 0), record.queue_offset + 1)

    def _discover_topics(self) -> None:
        """Topics the store's data holds but topics.json lacks (a RocketMQ store, a lost file) join the
        table, so reads of them route without a CreateTopic (``topic_discovery.py``)."""
        found = discover_queue_nums(self.root, self.queue_table)
        for config in self.topics.merge_discovered(found):
            log.info("topic %s found in the store's data: %d queues", config.topic, config.write_queue_nums,
                     extra={"topic": config.topic})

    def _start_services(self) -> None:
        cfg = self.config
        if self.sync_flush:
            self._group_commit = GroupCommitService(self.mfq, cfg.group_commit_gather_us)
            flush: ServiceThread = self._group_commit
        else:
            flush = FlushRealTimeService(self.mfq, cfg.flush_interval_commit_log, cfg.flush_commit_log_least_pages,
                                         cfg.flush_commit_log_thorough_interval, cfg.flush_commit_log_timed)
        self._services = [flush]
        self._flush_service = flush
        # A timed flush service sleeps its interval whatever happens: waking it per put is wasted work.
        self._wake_flush_service = self.pool_enabled or not cfg.flush_commit_log_timed
        if self.pool_enabled:
            commit = CommitRealTimeService(self.mfq, cfg.commit_interval_commit_log, cfg.commit_commit_log_least_pages,
                                           cfg.commit_commit_log_thorough_interval, flush)
            self._services.insert(0, commit)
            self._flush_service = commit
        assert self._checkpoint is not None
        self._state_service = StoreStateService(self, self._checkpoint)
        self._services.append(self._state_service)
        for service in self._services:
            service.start()

    def shutdown(self) -> None:
        """Clean stop: drain puts, commit and flush everything, write the checkpoint, remove abort."""
        with self._put_lock:
            self._running = False
        for service in self._services:  # commit before flush, flush before checkpoint
            service.stop()
        self._services = []
        while self.mfq.commit(0):
            pass
        self.mfq.flush_until(self.mfq.max_offset)
        if self._checkpoint is not None:
            if self.mfq.store_timestamp:
                self._checkpoint.physic_msg_timestamp = self.mfq.store_timestamp
            self._checkpoint.close()
            self._checkpoint = None
        self._save_queue_offsets(self.queue_offset_snapshot())
        self.mfq.shutdown()
        if self.pool is not None:
            self.pool.close()
        with self._new_data:
            self._new_data.notify_all()
        self._abort.remove()
        self._lock_file.release()
        log.info("commitlog stopped cleanly at offset %d", self.max_offset)

    @property
    def writable(self) -> bool:
        return self._running and not self.disk.full

    @property
    def disk_full(self) -> bool:
        """Writes are refused because the disk is too full (``disk_guard.py``)."""
        return self.disk.full

    # -- put ---------------------------------------------------------------------------------
    def put_message(self, msg: Message) -> PutMessageResult:
        """Append one message (every unary Append): the batch path without its per-batch setup."""
        encoded = self.encoder.encode(msg)
        new_topics: set[str] = set()
        config = self.topics.get(encoded.topic)
        # As _encode, one call less: an existing, writable topic, the queue in range, no DELAY rewrite.
        if config is None or not config.perm & PERM_WRITE or encoded.queue_id >= config.write_queue_nums \
                or encoded.topic is not msg.topic:
            self._check_encoded(encoded, msg, None, new_topics)
        return self._put_encoded([encoded], new_topics)[0]

    def put_messages(self, messages: Sequence[Message]) -> list[PutMessageResult]:
        """Append ``messages`` in order under one hold of the put lock. All are validated first:
        one bad message rejects the whole batch and nothing is written."""
        if not messages:
            return []
        if len(messages) == 1:
            return [self.put_message(messages[0])]
        now = time.time_ns() // 1_000_000
        new_topics: set[str] = set()
        encode = self.encoder.encode
        # Topics found writable in this call, with their write queue count: checked once per call.
        queue_nums: dict[str, int] = {}
        encoded: list[EncodedMessage] = []
        append = encoded.append
        for i, msg in enumerate(messages):
            e = encode(msg, now, i)
            topic = msg.topic
            if msg.queue_id >= queue_nums.get(topic, 0) or e.topic is not topic:  # not is: a DELAY rewrite
                self._check_encoded(e, msg, i, new_topics, queue_nums)
            append(e)
        return self._put_encoded(encoded, new_topics)

    def put_each(self, messages: Sequence[Message]) -> list[PutMessageResult | StoreError]:
        """Append the valid ones of ``messages`` (from independent producers) under one hold of the put
        lock; each invalid one gets its own error and does not affect the others."""
        now = time.time_ns() // 1_000_000
        outcomes: list[PutMessageResult | StoreError] = []
        valid: list[EncodedMessage] = []
        new_topics: set[str] = set()
        for msg in messages:
            try:
                valid.append(self._encode(msg, now, None, new_topics))
                outcomes.append(_PENDING)
            except StoreError as exc:
                outcomes.append(exc)
        if valid:
            results = iter(self._put_encoded(valid, new_topics))
            outcomes = [next(results) if o is _PENDING else o for o in outcomes]
        return outcomes

    def _put_encoded(self, encoded: list[EncodedMessage], new_topics: set[str]) -> list[PutMessageResult]:
        """``new_topics``: topics of these (valid) messages that did not exist when they were checked."""
        if self.write_refusal is not None:
            raise FailedPreconditionError(self.write_refusal)
        if new_topics or self._begin_time_in_lock:  # else the check under the lock is the first and only one
            self.disk.check_writable()  # before anything is written, topics.json included
            for topic in new_topics:
                self.topics.get_or_create(topic)
            self._check_busy()
        with self._put_lock:
            if not self._running:
                raise UnavailableError("the commitlog is not writable (stopping)")
            self.disk.check_writable()
            if self.disk.queue_pages_tight(len(encoded)):
                self.disk.check_queue_pages(self._queue_pages_started(encoded))
            self._begin_time_in_lock = time.monotonic()
            try:
                results = self._append_locked(encoded)
            finally:
                self._begin_time_in_lock = 0.0
        if self._tail_waiters:
            with self._new_data:
                self._new_data.notify_all()
        if self._group_commit is not None or self._wake_flush_service or self.wait_for_replicas is not None:
            self._handle_flush(encoded, results)
        return results

    def append_replica_data(self, write: Callable[[], None]) -> None:
        """A follower's append of what its leader sent (``services/commitlog/ha/replica_append.py``):
        ``write`` runs under the put lock, so a queue offset snapshot sees the log and the queue table
        agree; waiting tails wake after it."""
        with self._put_lock:
            write()
        if self._tail_waiters:
            with self._new_data:
                self._new_data.notify_all()

    def after_truncation(self, end: int, table: dict[QueueKey, int]) -> None:
        """A replica cut its log at ``end`` (``services/commitlog/ha/truncation.py``, under the put lock):
        the queue table, its snapshot and the checkpoint's store time describe the log as it is now (a
        restart finds no "missing" log), and a new incarnation makes the indexer drop what it built past
        ``end``."""
        assert self._checkpoint is not None
        self.queue_table = table
        self.mfq.store_timestamp = 0  # unknown until the next flush: 0 claims nothing
        self._checkpoint.physic_msg_timestamp = 0
        self._checkpoint.flush()
        self._save_queue_offsets(QueueOffsetSnapshot(end, dict(table)))
        self.recovered_offset = end
        self.incarnation = uuid.uuid4().hex

    def _live_queues(self) -> dict[QueueKey, int]:
        """The queue table's queues of topics in the topic table (a deleted topic's queues keep their
        next offsets here, but the indexer writes nothing more for them)."""
        topics = self.topics
        return {key: end for key, end in dict(self.queue_table).items() if topics.get(key[0]) is not None}

    def _queue_pages_started(self, encoded: Sequence[EncodedMessage]) -> int:
        """How many ConsumeQueue pages appending ``encoded`` starts (under the put lock)."""
        units, table = self._queue_units_per_file, self.queue_table
        next_offsets: dict[QueueKey, int] = {}
        started = 0
        for e in encoded:
            if e.advances_queue:
                key = (e.topic, e.queue_id)
                offset = next_offsets.get(key, table.get(key, 0))
                started += starts_page(offset, units)
                next_offsets[key] = offset + 1
        return started

    def _check_busy(self) -> None:
        """RocketMQ's isOSPageCacheBusy: when the put in the lock has taken longer than
        osPageCacheBusyTimeOutMills (the page cache is stalling writes), refuse at once ("broker busy")
        instead of queueing behind it; nothing is written, so the producer may retry."""
        begin = self._begin_time_in_lock
        if begin:
            held = time.monotonic() - begin
            if held > self._busy_timeout_s:
                raise ResourceExhaustedError(
                    f"broker busy: the put in progress has held the commitlog lock for {held * 1000:.0f} ms "
                    f"(> osPageCacheBusyTimeOutMills {self._busy_timeout_s * 1000:.0f}); nothing was written, "
                    "retry later")

    def _encode(self, msg: Message, now: int, index: int | None, new_topics: set[str]) -> EncodedMessage:
        """Encode and check one message; adds the topics it would create to ``new_topics`` once it
        is known to be valid."""
        encoded = self.encoder.encode(msg, now, index)
        config = self.topics.get(encoded.topic)
        # The common case in one test: an existing, writable topic, the queue in range, no DELAY rewrite.
        if config is None or not config.perm & PERM_WRITE or encoded.queue_id >= config.write_queue_nums \
                or encoded.topic is not msg.topic:
            self._check_encoded(encoded, msg, index, new_topics)
        return encoded

    def _check_encoded(self, encoded: EncodedMessage, msg: Message, index: int | None, new_topics: set[str],
                       queue_nums: dict[str, int] | None = None) -> None:
        """Refuse a message whose queue it may not go to; add the topics it would create to
        ``new_topics``. A DELAY message is checked against its real topic and queue (as the broker
        checks a send before the store rewrites it) and against its SCHEDULE_TOPIC_XXXX queue.
        ``queue_nums`` learns an existing writable topic's write queue count (not a DELAY's)."""
        topic = encoded.topic
        missing = self._check_queue(topic, encoded.queue_id, index)
        if topic is not msg.topic:
            if self._check_queue(msg.topic, msg.queue_id, index):
                new_topics.add(msg.topic)
        elif not missing and queue_nums is not None:
            config = self.topics.get(topic)
            if config is not None and config.perm & PERM_WRITE:
                queue_nums[topic] = config.write_queue_nums
        if missing:
            new_topics.add(topic)

    def _check_queue(self, topic: str, queue_id: int, index: int | None) -> bool:
        """Refuse a queue the message may not go to; True if the topic does not exist yet."""
        config = self.topics.get(topic)
        missing = config is None
        if config is None:
            try:
                check_topic_name(topic)
            except InvalidArgumentError as exc:
                raise PutMessageError(PutMessageStatus.MESSAGE_ILLEGAL, str(exc), index) from None
            # SCHEDULE_TOPIC_XXXX, rmq_sys_wheel_timer and the transaction topics are the store's own: they
            # exist whenever a DELAY, timer or transactional message needs them.
            if not self.config.auto_create_topic_enable and topic not in (SCHEDULE_TOPIC, TIMER_TOPIC) and \
                    topic not in TRANSACTION_TOPICS:
                raise NotFoundError(f"topic {topic!r} does not exist and autoCreateTopicEnable is off: create it first")
            # Checked against the topic it would get; created only once the whole put is valid.
            config = self.topics.auto_config(topic)
        if not config.perm & PERM_WRITE:
            raise PutMessageError(PutMessageStatus.MESSAGE_ILLEGAL,
                                  f"topic {topic!r} is not writable (perm {config.perm})", index)
        if not 0 <= queue_id < config.write_queue_nums:
            raise PutMessageError(PutMessageStatus.MESSAGE_ILLEGAL,
                                  f"queue id {queue_id} is out of range for topic {topic!r}: it has "
                                  f"{config.write_queue_nums} write queues (0..{config.write_queue_nums - 1})", index)
        return missing

    def _append_locked(self, encoded: Sequence[EncodedMessage]) -> list[PutMessageResult]:
        """Copy each record straight into the file (or the pool buffer) past its wrote position, fill
        in its offsets and store time there, and publish the records by advancing the wrote position
        (per file, after the last record written into it): readers never see a record unfilled."""
        store_timestamp = time.time_ns() // 1_000_000
        table = self.queue_table
        units, started = self._queue_units_per_file, 0
        store_host = self.encoder.store_host
        results: list[PutMessageResult] = []
        append_result = results.append
        pack_offsets, pack_i64 = _OFFSETS.pack_into, _I64.pack_into
        mapped = self.mfq.last_file_for_append()
        pos = mapped.wrote_position
        # A record plus a BLANK's 8 bytes must fit in the file, else the file ends here.
        limit = mapped.file_size - END_FILE_MIN_BLANK_LENGTH
        total = encoded[0].size if len(encoded) == 1 else sum([e.size for e in encoded])
        if pos + total > limit:
            # The put rolls: every file it rolls into must exist before its first byte is written.
            self.mfq.prepare_next_files(_files_needed(encoded, mapped.file_size - pos, mapped.file_size))
        if pos + total > mapped.reserved_position or pos + total > limit:
            self.mfq.reserve_for_append(mapped, total)  # blocks for every byte, before the first is written
        buffer = mapped.append_buffer()
        base = mapped.file_from_offset
        for record, size, topic, queue_id, timestamp_pos, _, takes_queue_offset in encoded:
            end = pos + size
            if end > limit:
                mapped.wrote_position = pos
                mapped = self._roll(mapped, store_timestamp)
                buffer, base, pos, end = mapped.append_buffer(), mapped.file_from_offset, 0, size
            commitlog_offset = base + pos
            if takes_queue_offset:
                key = (topic, queue_id)
                queue_offset = table.get(key, 0)
                table[key] = queue_offset + 1
                started += starts_page(queue_offset, units)
            else:
                queue_offset = 0
            buffer[pos:end] = record
            pack_offsets(buffer, pos + QUEUE_OFFSET_POS, queue_offset, commitlog_offset)
            pack_i64(buffer, pos + timestamp_pos, store_timestamp)
            append_result(PutMessageResult(PUT_OK, commitlog_offset, size, queue_offset, store_timestamp,
                                           store_host, topic, queue_id))
            pos = end
        mapped.wrote_position = pos
        mapped.store_timestamp = store_timestamp
        if started:
            self.disk.charge_queue_pages(started)
        return results

    def _roll(self, mapped: MappedFile, store_timestamp: int) -> MappedFile:
        """END_OF_FILE: mark the rest of the file BLANK and continue in the next file."""
        remaining = mapped.remaining
        mapped.append(encode_blank(remaining))
        mapped.wrote_position = mapped.file_size
        mapped.store_timestamp = store_timestamp
        return self.mfq.last_file_for_append()

    def _handle_flush(self, encoded: Sequence[EncodedMessage], results: list[PutMessageResult]) -> None:
        if self._group_commit is not None:
            if any(e.wait_store_msg_ok for e in encoded):
                last = results[-1]
                end = last.commitlog_offset + last.wrote_bytes
                if tracing.ENABLED:
                    flushed = self._traced_wait_for_flush(self._group_commit, end, len(results))
                else:
                    flushed = self._group_commit.wait_for_flush(end, self.config.sync_flush_timeout / 1000)
                if not flushed:
                    log.warning("flush of offset %d did not finish within syncFlushTimeout", end)
                    for result in results:
                        result.status = PutMessageStatus.FLUSH_DISK_TIMEOUT
        elif self._flush_service is not None and self._wake_flush_service:
            self._flush_service.wakeup()
        if self.wait_for_replicas is not None and any(e.wait_store_msg_ok for e in encoded):
            last = results[-1]
            self.wait_for_replicas(last.commitlog_offset + last.wrote_bytes)

    def _traced_wait_for_flush(self, group_commit: GroupCommitService, end: int, messages: int) -> bool:
        """The flush wait as a span of the request that appended (AppendBatch, AppendStream: their
        context follows them into this thread). The PutBatcher's calls serve many requests and have
        none; each of those requests times its own wait instead."""
        with tracing.child_span("commitlog.flush_wait", flush_disk_type=SYNC_FLUSH, group_commit=False,
                                messages=messages):
            return group_commit.wait_for_flush(end, self.config.sync_flush_timeout / 1000)

    # -- read --------------------------------------------------------------------------------
    @property
    def min_offset(self) -> int:
        return self.mfq.min_offset

    @property
    def max_offset(self) -> int:
        return self.mfq.max_offset

    def read(self, offset: int, size: int) -> bytes:
        """Bytes [offset, offset+size) of one file; the query path reads whole records this way."""
        if size <= 0 or size > MAX_READ_BYTES:
            raise InvalidArgumentError(f"size {size} must be within 1..{MAX_READ_BYTES}")
        self._check_offset_range(offset, offset + size)
        self._check_not_quarantined(offset, offset + size)
        mapped = self.mfq.find_by_offset(offset)
        if mapped is None:
            raise OutOfRangeError(f"offset {offset} is not in the log [{self.min_offset}, {self.max_offset})")
        position = offset - mapped.file_from_offset
        if position + size > mapped.file_size:
            raise InvalidArgumentError(f"[{offset}, {offset + size}) crosses the end of file {mapped.path.name}: "
                                       "a record never does")
        try:
            return mapped.read(position, size)
        except ValueError as exc:  # deleted or not yet readable meanwhile
            raise OutOfRangeError(str(exc)) from None

    def _check_not_quarantined(self, start: int, end: int) -> None:
        bad = self.quarantine.overlapping(start, end)
        if bad is not None:
            raise DataLossError(f"[{start}, {end}) reaches into the QUARANTINED commitlog range {bad.describe()}: "
                                "recovery found those bytes damaged, no record there can be read")

    def _check_offset_range(self, start: int, end: int) -> None:
        if start < 0:
            raise InvalidArgumentError(f"offset {start} is negative")
        min_offset, max_offset = self.min_offset, self.max_offset
        if start < min_offset:
            raise OutOfRangeError(f"offset {start} is below the min offset {min_offset} (older files were deleted)")
        if end > max_offset:
            raise OutOfRangeError(f"[{start}, {end}) goes past the max offset {max_offset}")

    def tail_chunk(self, offset: int, max_bytes: int) -> TailChunk:
        """Whole records from ``offset`` (a record boundary), up to ``max_bytes`` (at least one record),
        within one file. A BLANK ends the chunk and ``next_offset`` is then the next file's start, also
        when the BLANK is at ``offset`` (no records: the caller is told of the skip, never silently moved
        on). A chunk with no records and ``next_offset == offset`` means the end of the log."""
        bad = self.quarantine.overlapping(offset, offset + 1)
        if bad is not None and offset >= self.min_offset:  # never a record boundary: skip it, announced
            return TailChunk(offset, b"", bad.end, 0)
        self._check_tail_start(offset)
        mapped = self.mfq.find_by_offset(offset)
        if mapped is None:  # offset == max offset on a file boundary, or an empty log
            return TailChunk(offset, b"", offset, 0)
        buf = mapped.buffer
        start = offset - mapped.file_from_offset
        readable = mapped.read_position
        next_bad = self.quarantine.next_start(offset)
        if next_bad is not None:
            readable = min(readable, next_bad - mapped.file_from_offset)
        walk = walk_chunk(buf, start, readable, max_bytes)
        pos, count = walk.end, walk.count
        data = buf[start:pos] if count else b""
        next_offset = mapped.file_tail_offset if walk.stop is ChunkStop.BLANK else mapped.file_from_offset + pos
        return TailChunk(offset, data, next_offset, count)

    def _check_tail_start(self, offset: int) -> None:
        if offset < 0:
            raise InvalidArgumentError(f"offset {offset} is negative")
        min_offset, max_offset = self.min_offset, self.max_offset
        if offset < min_offset:
            raise OutOfRangeError(f"offset {offset} is below the min offset {min_offset}: those files were deleted")
        if offset > max_offset:
            raise OutOfRangeError(f"offset {offset} is beyond the max offset {max_offset}: "
                                  "the log ends there (it may have been truncated by a crash recovery)")
        if offset == max_offset or offset % self.config.mapped_file_size_commit_log == 0:
            return
        mapped = self.mfq.find_by_offset(offset)
        if mapped is None:
            raise OutOfRangeError(f"offset {offset} is not in the log")
        pos = offset - mapped.file_from_offset
        size, magic = SIZE_AND_MAGIC.unpack_from(mapped.buffer, pos)
        if magic == BLANK_MAGIC_CODE and pos + size == mapped.file_size:
            return
        if magic in (MESSAGE_MAGIC_CODE, MESSAGE_MAGIC_CODE_V2) and \
                _I64.unpack_from(mapped.buffer, pos + PHYSICAL_OFFSET_POS)[0] == offset:
            return
        raise InvalidArgumentError(f"offset {offset} is not a record boundary: start at a record's commitlog offset")

    def wait_for_data(self, offset: int, timeout_s: float) -> bool:
        """Long poll: block until the log grows past ``offset`` or the timeout. True if it did."""
        if self.max_offset > offset:
            return True
        with self._new_data:
            self._tail_waiters += 1
            try:
                return self._new_data.wait_for(lambda: self.max_offset > offset or not self._running, timeout_s) \
                    and self.max_offset > offset
            finally:
                self._tail_waiters -= 1

    # -- info and admin ----------------------------------------------------------------------
    def stats(self) -> StoreStats:
        usage = shutil.disk_usage(self.root)
        committed = self.mfq.committed_where if self.pool_enabled else self.mfq.max_wrote_offset
        return StoreStats(self.min_offset, self.max_offset, self.mfq.flushed_where, committed,
                          len(self.mfq.files), usage.total, usage.used, self.recovered_offset)

    def queue_offset_snapshot(self) -> QueueOffsetSnapshot:
        with self._put_lock:
            return QueueOffsetSnapshot(self.mfq.max_wrote_offset, dict(self.queue_table))

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
        with self._put_lock:
            return self.mfq.max_wrote_offset

    def clean_expired_files(self, disk_used_ratio: float) -> list[Path]:
        """One round of RocketMQ's CleanCommitLogService at ``disk_used_ratio`` (``clean_commitlog.py``):
        expired files at the ``deleteWhen`` hour or above ``diskMaxUsedSpaceRatio``, the oldest files
        even if not expired above diskSpaceCleanForciblyRatio (each a WARNING naming the consumer
        groups that lose messages; held instead under ``protectUnconsumedData``)."""
        return [mapped.path for mapped in self.cleaner.run(disk_used_ratio)]

    def flush_and_snapshot(self) -> None:
        """Persist the queue offset table at a point the flushed log covers."""
        snapshot = self.queue_offset_snapshot()
        while self.mfq.commit(0):
            pass
        self.mfq.flush_until(snapshot.commitlog_offset)
        if self.mfq.flushed_where >= snapshot.commitlog_offset:
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


def _files_needed(encoded: Sequence[EncodedMessage], room: int, file_size: int) -> int:
    """How many new files appending ``encoded`` rolls into, with ``room`` bytes left in the current
    file (the roll rule of ``_append_locked``: a record plus a BLANK's 8 bytes must fit)."""
    files = 0
    for e in encoded:
        if e.size + END_FILE_MIN_BLANK_LENGTH > room:
            files += 1
            room = file_size
        room -= e.size
    return files


class StoreStateService(ServiceThread):
    """Every second: checkpoint the store time the flushed log covers, refresh the disk-full state.
    Every ``flushCommitLogThoroughInterval``: persist the queue offset snapshot. Every
    ``cleanResourceInterval``: delete expired files."""

    name = "store-state"

    def __init__(self, commit_log: CommitLog, checkpoint: StoreCheckpoint) -> None:
        super().__init__()
        self._log = commit_log
        self._checkpoint = checkpoint
        self._interval_s = commit_log.config.flush_interval_consume_queue / 1000
        self._snapshot_interval_s = commit_log.config.flush_commit_log_thorough_interval / 1000
        self._last_snapshot = time.monotonic()
        self._clean_interval_s = commit_log.config.clean_resource_interval / 1000
        self._last_clean = time.monotonic()

    def run_once(self) -> None:
        self._stopped.wait(self._interval_s)
        if self.stopped:
            return
        stamp = self._log.mfq.store_timestamp
        if stamp and stamp != self._checkpoint.physic_msg_timestamp:
            self._checkpoint.physic_msg_timestamp = stamp
            self._checkpoint.flush()
        usage = self._log.disk.refresh()
        if time.monotonic() - self._last_snapshot >= self._snapshot_interval_s:
            self._last_snapshot = time.monotonic()
            self._log.flush_and_snapshot()
        if time.monotonic() - self._last_clean >= self._clean_interval_s and usage is not None:
            self._last_clean = time.monotonic()
            self._log.clean_expired_files(usage.ratio)

