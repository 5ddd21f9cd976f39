"""The CommitLog: one sequential log of every message, appended under a lock, flushed by policy.

Recovered, started and stopped by its ``MessageStore`` (``message_store.py``). Thread-safe: appends
are serialised by the put lock; reads and tails run concurrently with them.
"""

from __future__ import annotations

import copy
import logging
import struct
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from services.commitlog.disk_guard import DiskGuard
from services.commitlog.flush import CommitRealTimeService, FlushRealTimeService, GroupCommitService
from services.commitlog.message_encoder import EncodedMessage, MessageEncoder
from services.commitlog.put_result import PutMessageError, PutMessageResult, PutMessageStatus
from services.commitlog.topic_config import TopicConfigManager
from services.commitlog.topic_queue_table import QueueKey, QueueOffsetSnapshot
from services.server import tracing
from services.store.config import SYNC_FLUSH, MessageStoreConfig
from services.store.errors import (
    DataLossError,
    InvalidArgumentError,
    NotFoundError,
    OutOfRangeError,
    ResourceExhaustedError,
    StoreError,
    UnavailableError,
)
from services.store.formats.chunk_walk import ChunkStop, walk_chunk
from services.store.formats.consume_queue import CQ_STORE_UNIT_SIZE, starts_page
from services.store.formats.mapped_file import MappedFile
from services.store.formats.mapped_file_queue import MappedFileQueue
from services.store.formats.message import SCHEDULE_TOPIC, Message, parse_delay_levels
from services.store.formats.quarantine import QuarantineTable
from services.store.formats.record import (
    BLANK_MAGIC_CODE,
    END_FILE_MIN_BLANK_LENGTH,
    MESSAGE_MAGIC_CODE,
    MESSAGE_MAGIC_CODE_V2,
    PHYSICAL_OFFSET_POS,
    QUEUE_OFFSET_POS,
    SIZE_AND_MAGIC,
    encode_blank,
)
from services.store.formats.transient_store_pool import TransientStorePool
from services.store.invariants import broken
from services.store.rules.names import check_topic_name
from services.store.rules.timer_message import TIMER_TOPIC
from services.store.rules.topics import PERM_WRITE
from services.store.rules.transaction_records import TRANSACTION_TOPICS
from services.store.service_thread import ServiceThread

log = logging.getLogger(__name__)

_I64 = struct.Struct(">q")
_OFFSETS = struct.Struct(">qq")  # QUEUEOFFSET, PHYSICALOFFSET: adjacent in the record
_SEAL = SIZE_AND_MAGIC.size  # a record's TOTALSIZE and MAGICCODE, written after the rest of it
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




class CommitLog:
    """RocketMQ's CommitLog: the put path (the checks, the queue offsets, the records copied into the
    mapped files), the hand-off to the commit and flush services, and reads and tails of the log.
    ``MessageStore`` (``message_store.py``) recovers it, loads its queue table and starts and stops it."""

    def __init__(self, config: MessageStoreConfig, store_root: Path, topics: TopicConfigManager, disk: DiskGuard,
                 quarantine: QuarantineTable, reserve_step: int) -> None:
        self.config = config
        self.root = store_root
        self.sync_flush = config.flush_disk_type == SYNC_FLUSH
        # RocketMQ uses the pool only for an async-flushing master.
        self.pool_enabled = config.transient_store_pool_enable and not self.sync_flush
        self.pool = TransientStorePool(config.transient_store_pool_size, config.mapped_file_size_commit_log) \
            if self.pool_enabled else None
        self.queue_table: dict[QueueKey, int] = {}
        self.disk = disk
        #: ConsumeQueue units per file: a message whose queue offset is a multiple starts a new file.
        self._queue_units_per_file = max(1, config.mapped_file_size_consume_queue // CQ_STORE_UNIT_SIZE)
        self.mfq = MappedFileQueue(store_root / "commitlog", config.mapped_file_size_commit_log, self.pool,
                                   prefault=config.prefault_mapped_file and not self.pool_enabled,
                                   space_check=disk.check_new_file, reserve_step=reserve_step)
        self.topics = topics
        self.quarantine = quarantine
        self.encoder = MessageEncoder(config.store_host, config.max_message_size,
                                      config.mapped_file_size_commit_log, len(parse_delay_levels(
                                          config.message_delay_level)), config.timer_max_delay_sec)
        self._put_lock = threading.Lock()
        # RocketMQ's beginTimeInLock: when the put holding the lock started (0 = none), for isOSPageCacheBusy.
        self._begin_time_in_lock = 0.0
        self._busy_timeout_s = config.os_page_cache_busy_time_out_mills / 1000
        self._new_data = threading.Condition()
        self._tail_waiters = 0
        self._running = False
        self._services: list[ServiceThread] = []
        self._group_commit: GroupCommitService | None = None
        self._flush_service: ServiceThread | None = None
        self._wake_flush_service = False
        # Replication (services/commitlog/ha/): under SYNC_MASTER, a put also waits until enough
        # followers hold its end offset (raises UnavailableError otherwise); a follower refuses every
        # put with this reason (FAILED_PRECONDITION naming its leader).
        self.wait_for_replicas: Callable[[int], None] | None = None
        #: A leader under etcd leadership: raises unless its lease is surely alive. Checked before a put
        #: that waits for nothing (waitStoreMsgOK false) is answered: a lapsed leader answers no put.
        self.ack_fence: Callable[[], None] | None = None
        #: Raised (a copy: each refusal its own traceback) at every put of a replica that takes none.
        self.write_refusal: StoreError | None = None
        #: The store's part of a replica's truncation (its checkpoint, snapshot and incarnation).
        self.truncation_listener: Callable[[int, dict[QueueKey, int]], None] | None = None

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        """Start the commit and flush services and take puts (the log is recovered, its queue table loaded)."""
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
        for service in self._services:
            service.start()
        self._running = True

    def shutdown(self) -> None:
        """Refuse puts once the ones in progress are done, stop the services (commit before flush), then
        commit and flush everything written."""
        with self._put_lock:
            self._running = False
        for service in self._services:
            service.stop()
        self._services = []
        while self.mfq.commit(0):
            pass
        self.mfq.flush_until(self.mfq.max_offset)

    def close(self) -> None:
        """Unmap the files and release the pool; waiting tails return."""
        self.mfq.shutdown()
        if self.pool is not None:
            self.pool.close()
        with self._new_data:
            self._new_data.notify_all()

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
            raise copy.copy(self.write_refusal)
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
        if self.ack_fence is not None and not any(e.wait_store_msg_ok for e in encoded):
            self.ack_fence()
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
        the queue table is the one rebuilt from the log as it is now, the store time unknown until the
        next flush, and the store resets what describes the old log (``truncation_listener``)."""
        self.queue_table = table
        self.mfq.store_timestamp = 0  # 0 claims nothing
        if self.truncation_listener is not None:
            self.truncation_listener(end, table)

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
        log_end = base + pos  # where the next record must start, or past (a roll)
        for record, size, topic, queue_id, timestamp_pos, _, takes_queue_offset in encoded:
            end = pos + size
            if end > limit:
                mapped.wrote_position = pos
                mapped = self._roll(mapped, store_timestamp)
                buffer, base, pos, end = mapped.append_buffer(), mapped.file_from_offset, 0, size
                if end > limit:
                    broken("a record never crosses a file end", f"a {size}-byte record does not fit in a "
                           f"{mapped.file_size}-byte file with the {END_FILE_MIN_BLANK_LENGTH} bytes of its BLANK")
            commitlog_offset = base + pos
            if commitlog_offset < log_end:
                broken("commitlog offsets increase", f"a record at offset {commitlog_offset} would overwrite the "
                       f"log below its end {log_end}")
            log_end = commitlog_offset + size
            if takes_queue_offset:
                key = (topic, queue_id)
                queue_offset = table.get(key, 0)
                if queue_offset < 0:
                    broken("the queue offset assigned is the queue table's next", f"{topic} queue {queue_id} "
                           f"would get queue offset {queue_offset}")
                table[key] = queue_offset + 1
                started += starts_page(queue_offset, units)
            else:
                queue_offset = 0
            # TOTALSIZE and MAGICCODE go in last. An fdatasync syncs every dirty page of the file, those of
            # a record still being written too, in file order: a record a power cut leaves with its first
            # bytes is whole (offsets and store time filled in); one caught earlier starts with zeros, the
            # end of the log. (Filled in after the copy, a record could survive with STORETIMESTAMP 0.)
            buffer[pos + _SEAL:end] = memoryview(record)[_SEAL:]
            pack_offsets(buffer, pos + QUEUE_OFFSET_POS, queue_offset, commitlog_offset)
            pack_i64(buffer, pos + timestamp_pos, store_timestamp)
            buffer[pos:pos + _SEAL] = record[:_SEAL]
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


    def queue_offset_snapshot(self) -> QueueOffsetSnapshot:
        with self._put_lock:
            return QueueOffsetSnapshot(self.mfq.max_wrote_offset, dict(self.queue_table))



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

