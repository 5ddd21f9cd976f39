"""The reput loop: follow the commitlog from the reput offset and dispatch every record.

Also RocketMQ's ReputMessageService, but across a process boundary: the commitlog may restart (and
lose a tail of unflushed records in a crash) while the indexer runs, so every (re)connection
checks which incarnation of the commitlog it talks to and truncates what was built from records
that no longer exist before it resumes.

Two sources of records (``ReputSource``): the commitlog's files on the shared store volume, read by
the indexer itself up to the readable end a ``positions_only`` Tail announces (``commitlog_files``:
no record bytes cross gRPC, no chunk is built by the commitlog service), or the byte-carrying Tail
for an indexer that does not see the files (another machine). ``auto`` takes the files when the
store root GetStoreInfo names is here and holds the same bytes as the service reads.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

import grpc
from tenacity import RetryCallState, Retrying, retry_if_exception, wait_exponential

from mqstore.v1 import commitlog_pb2, commitlog_pb2_grpc
from services.indexer.commitlog_reader import CommitLogFiles, FileChunk, FilesMismatch
from services.indexer.indexer_store import IndexerStore, ReputState
from services.indexer.tail_protocol import ChunkMismatch, ChunkStep, check_chunk
from services.indexer.topic_deletion import topic_deletions
from services.server.channels import sync_channel
from services.store.errors import DiskFullError
from services.store.formats.message import parse_delay_levels
from services.store.formats.record import (
    BLANK_MAGIC_CODE,
    END_FILE_MIN_BLANK_LENGTH,
    SIZE_AND_MAGIC,
    DispatchRequest,
    RecordError,
    parse_dispatch_requests,
)

log = logging.getLogger(__name__)

MIB = 1024 * 1024
RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED,
             grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL}
#: Resyncs in a row at one reput offset, with no chunk accepted between them, after which each one is
#: logged as a WARNING: dispatch is stalled there, not resynchronising once after a restart.
STALL_RESYNCS = 3
#: How often an ERROR repeats while dispatch waits for room on a full disk.
DISK_FULL_LOG_INTERVAL_S = 30.0
#: Bytes compared between a commitlog file and the service's Read before the files are trusted.
_PROBE_BYTES = 256


class ReputSource(Enum):
    """Where the reput loop reads records (MQSTORE_INDEXER_REPUT_SOURCE)."""

    AUTO = "auto"  # the files when they are here and hold the service's bytes, else the Tail
    FILES = "files"  # the files (in the store root the service names, or MQSTORE_INDEXER_COMMITLOG_DIR)
    TAIL = "tail"  # the byte-carrying Tail: an indexer on another machine


@dataclass(slots=True)
class DispatchLag:
    connected: bool = False
    commitlog_max_offset: int = 0
    commitlog_incarnation: str = ""
    # Wall time the reput loop learned of records past its reput offset after being caught up (0:
    # caught up). Lag in time is measured from the later of this and the last dispatched record's
    # store time: after an idle spell the last store time is old, but nothing was pending then.
    behind_since_ms: int = 0


class Resync(Exception):
    """The reput offset no longer fits the commitlog: reconcile, then reconnect."""


class ResyncWatch:
    """Makes a stall visible: one resync is routine (the commitlog restarted, files were deleted), but
    resyncs that repeat at the same reput offset with no chunk accepted in between mean dispatch
    cannot move past it; from the ``STALL_RESYNCS``-th on they are WARNINGs naming the offsets."""

    def __init__(self, stall_after: int = STALL_RESYNCS) -> None:
        self._stall_after = stall_after
        self._offset = -1
        self.count = 0  # resyncs in a row at ``self._offset``

    def resynced(self, reput_offset: int, why: object) -> None:
        if reput_offset == self._offset:
            self.count += 1
        else:
            self._offset, self.count = reput_offset, 1
        if self.count >= self._stall_after:
            log.warning("reput stalled at reput offset %d: resynchronised %d times in a row there, no chunk "
                        "accepted in between (%s)", reput_offset, self.count, why)
        else:
            log.info("reput resynchronised at reput offset %d: %s", reput_offset, why)

    def progressed(self) -> None:
        """A chunk was accepted: the stream works at this offset."""
        self.count = 0


class ReadableEnd:
    """The newest readable end a ``positions_only`` Tail announced, read off the stream by a thread of
    its own: while the reput loop dispatches, announcements coalesce into the newest one, so a busy
    indexer takes one bigger step (up to the chunk size per read) instead of one per append."""

    def __init__(self, call: Iterator[commitlog_pb2.TailChunk], incarnation: str) -> None:
        self._call = call
        self._incarnation = incarnation
        self._cond = threading.Condition()
        self._seq = 0
        self._end = -1
        self._done = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="reput-positions", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        error: BaseException | None = None
        try:
            for chunk in self._call:
                if chunk.incarnation != self._incarnation:
                    error = Resync(f"the commitlog restarted (incarnation {chunk.incarnation})")
                    break
                with self._cond:
                    self._seq += 1
                    self._end = chunk.max_offset
                    self._cond.notify()
        except BaseException as exc:  # noqa: BLE001 - handed to the reput loop, which decides
            error = exc
        with self._cond:
            self._done, self._error = True, error
            self._cond.notify()

    def next(self, seen: int) -> tuple[int, int]:
        """(announcement number, readable end) of the newest announcement after number ``seen``; the end
        is -1 once the stream ended cleanly; the stream's error is raised here."""
        with self._cond:
            self._cond.wait_for(lambda: self._seq > seen or self._done)
            if self._seq > seen:
                return self._seq, self._end
            if self._error is not None:
                raise self._error
            return self._seq, -1

    def join(self) -> None:
        self._thread.join(10)


class ReputService:
    def __init__(self, store: IndexerStore, commitlog_address: str, chunk_bytes: int = 4 * MIB,
                 poll_wait_ms: int = 500, max_backoff_s: float = 2.0, source: ReputSource = ReputSource.AUTO,
                 commitlog_dir: Path | None = None) -> None:
        self._store = store
        self._address = commitlog_address
        self._chunk_bytes = chunk_bytes
        self._poll_wait_ms = poll_wait_ms
        self._max_backoff_s = max_backoff_s
        self._source = source
        self._commitlog_dir = commitlog_dir
        #: messageDelayLevel: a SCHEDULE_TOPIC_XXXX unit's tags code is store time + its level's delay
        self._delay_levels_ms = parse_delay_levels(store.config.message_delay_level)
        #: the reput offset where the files last disagreed with the service: the next connection
        #: there takes the byte Tail (the service's word) instead of resyncing on the files forever
        self._files_failed_at = -1
        #: which source the current connection reads: "files" or "tail" (status, tests)
        self.reading = ""
        #: commitlog bytes taken for dispatch, by source ("files" or "tail"): the metrics read it live
        self.read_bytes = {"files": 0, "tail": 0}
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="reput", daemon=True)
        self._call: grpc.Call | None = None
        self.lag = DispatchLag()
        self.resyncs = ResyncWatch()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        call = self._call
        if call is not None:
            call.cancel()  # type: ignore[no-untyped-call]
        self._thread.join(10)

    # -- status ------------------------------------------------------------------------------
    @property
    def behind_bytes(self) -> int:
        return max(0, self.lag.commitlog_max_offset - self._store.reput_offset)

    @property
    def behind_ms(self) -> int:
        if self.behind_bytes == 0:
            return 0
        last = max(self._store.last_dispatched_store_timestamp, self.lag.behind_since_ms)
        return max(0, int(time.time() * 1000) - last) if last else 0

    def _track_end(self, max_offset: int) -> None:
        """The commitlog's readable end as last heard: pending records since when (see DispatchLag)."""
        self.lag.commitlog_max_offset = max_offset
        if self._store.reput_offset >= max_offset:
            self.lag.behind_since_ms = 0
        elif not self.lag.behind_since_ms:
            self.lag.behind_since_ms = int(time.time() * 1000)

    # -- the loop ----------------------------------------------------------------------------
    def _run(self) -> None:
        retrying = Retrying(
            retry=retry_if_exception(self._retryable),
            wait=wait_exponential(multiplier=0.05, max=self._max_backoff_s),
            sleep=self._sleep,
            before_sleep=self._log_retry,
            reraise=True,
        )
        while not self._stopped.is_set():
            try:
                retrying(self._follow_once)
            except Exception:  # never let the thread die: log, pause, start over
                if not self._stopped.is_set():
                    log.exception("reput loop failed; restarting it")
                    self._stopped.wait(self._max_backoff_s)

    def _sleep(self, seconds: float) -> None:
        self._stopped.wait(seconds)  # a stop cuts a backoff short

    def _retryable(self, exc: BaseException) -> bool:
        if self._stopped.is_set():
            return False
        if isinstance(exc, Resync):
            return True
        return isinstance(exc, grpc.RpcError) and exc.code() in RETRYABLE

    def _log_retry(self, state: RetryCallState) -> None:
        self.lag.connected = False
        exc = state.outcome.exception() if state.outcome else None
        if isinstance(exc, Resync):
            self.resyncs.resynced(self._store.reput_offset, exc)
        else:
            log.warning("commitlog service at %s unavailable (%s); retrying", self._address,
                        exc.code().name if isinstance(exc, grpc.RpcError) else exc)

    def _follow_once(self) -> None:
        """Connect, reconcile with this commitlog incarnation, then dispatch until the stream ends."""
        with sync_channel(self._address, options=[("grpc.max_receive_message_length", 256 * MIB)]) as ch:
            stub = commitlog_pb2_grpc.CommitLogServiceStub(ch)
            info = stub.GetStoreInfo(commitlog_pb2.GetStoreInfoRequest(), timeout=5)
            self._reconcile(info)
            self.lag.connected = True
            self.lag.commitlog_incarnation = info.incarnation
            self.lag.commitlog_max_offset = info.max_offset
            quarantined = [(r.start_offset, r.end_offset) for r in info.quarantined_ranges]
            # A queue whose record was lost in one gets filler units for its queue offset (ConsumeQueue.put_batch).
            self._store.consume_queues.lost_ranges = tuple(quarantined)
            if quarantined:  # units built before the damage was found must not point at it
                self._store.consume_queues.void_units(quarantined)
            files = self._open_files(stub, info, quarantined)
            try:
                if files is not None:
                    self.reading = "files"
                    with files:
                        self._follow_files(stub, files, info, quarantined)
                else:
                    self.reading = "tail"
                    self._tail(stub, info.mapped_file_size, quarantined)
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.OUT_OF_RANGE:
                    raise Resync(exc.details()) from None
                if exc.code() == grpc.StatusCode.INVALID_ARGUMENT:
                    self._rebuild_from(info.min_offset, exc.details() or "")
                    raise Resync("rebuilt") from None
                raise

    def _reconcile(self, info: commitlog_pb2.StoreInfo) -> None:
        store = self._store
        state = store.load_reput_state()
        if state is None or state.commitlog_incarnation != info.incarnation:
            # A new start of the commitlog: records we dispatched past its recovered end are gone, and
            # so are the units any queue file kept for them (whatever the dispatch checkpoint says).
            if store.reput_offset > info.recovered_offset or store.built_past(info.recovered_offset):
                store.truncate(info.recovered_offset)
            store.save_reput_state(ReputState(info.incarnation))
        if store.reput_offset > info.max_offset:
            store.truncate(info.max_offset)
        if store.reput_offset < info.min_offset:
            log.warning("reput offset %d is below the commitlog's min offset %d (files deleted): skipping ahead",
                        store.reput_offset, info.min_offset)
            store.skip_to(info.min_offset)
        store.correct_min_offset(info.min_offset)

    def _rebuild_from(self, min_offset: int, why: str) -> None:
        log.error("reput offset %d is not a record boundary of the commitlog (%s): rebuilding from %d",
                  self._store.reput_offset, why, min_offset)
        self._store.truncate(min_offset)
        self._store.skip_to(min_offset)

    # -- records from the files ------------------------------------------------------------
    def _open_files(self, stub: commitlog_pb2_grpc.CommitLogServiceStub, info: commitlog_pb2.StoreInfo,
                    quarantined: Sequence[tuple[int, int]]) -> CommitLogFiles | None:
        """The commitlog's files if this connection reads them, else None (the byte Tail)."""
        if self._source is ReputSource.TAIL:
            return None
        if self._store.reput_offset == self._files_failed_at:
            log.warning("the commitlog's files disagreed with the service at reput offset %d: reading its Tail "
                        "for this connection", self._files_failed_at)
            self.reading = "tail"
            return None
        directory = self._commitlog_dir or Path(info.store_root) / "commitlog"
        files = CommitLogFiles(directory, info.mapped_file_size, quarantined)
        why = "" if self._source is ReputSource.FILES else \
            self._files_differ(stub, files, info) if directory.is_dir() else f"{directory} is not a directory here"
        if why:
            files.close()
            if self.reading != "tail":
                log.info("reading the commitlog through its Tail, not its files: %s", why)
            return None
        if self.reading != "files":
            log.info("reading the commitlog's files in %s up to the readable end its Tail announces", directory)
        return files

    @staticmethod
    def _files_differ(stub: commitlog_pb2_grpc.CommitLogServiceStub, files: CommitLogFiles,
                      info: commitlog_pb2.StoreInfo) -> str:
        """Why the files are not the service's (a same-named directory on another machine, a stale
        copy), or "" when the last bytes of the log read the same both ways (or there are none yet)."""
        end = info.max_offset
        start = max(info.min_offset, end - _PROBE_BYTES, (end - 1) - (end - 1) % files.file_size)
        if end <= start:
            return ""
        try:
            served = stub.Read(commitlog_pb2.ReadRequest(offset=start, size=end - start), timeout=5).data
        except grpc.RpcError as exc:
            if exc.code() in RETRYABLE:
                raise
            return ""  # a quarantined probe: the directory's presence has to do
        try:
            here = files.pread(start, end - start)
        except (FilesMismatch, OSError) as exc:
            return str(exc)
        return "" if here == served else f"{files.directory} holds other bytes at [{start}, {end}) than the service"

    def _follow_files(self, stub: commitlog_pb2_grpc.CommitLogServiceStub, files: CommitLogFiles,
                      info: commitlog_pb2.StoreInfo, quarantined: Sequence[tuple[int, int]]) -> None:
        """Dispatch from the files up to each readable end a ``positions_only`` Tail announces."""
        request = commitlog_pb2.TailRequest(from_offset=self._store.reput_offset, poll_wait_ms=self._poll_wait_ms,
                                            positions_only=True)
        call = stub.Tail(request)
        self._call = call
        positions = ReadableEnd(call, info.incarnation)
        try:
            seen = 0
            while not self._stopped.is_set():
                seen, end = positions.next(seen)
                if end < 0:  # the stream ended without an error: reconnect
                    return
                self._track_end(end)
                try:
                    self._dispatch_files(files, end, info.mapped_file_size, quarantined)
                except (FilesMismatch, OSError) as exc:
                    self._files_failed_at = self._store.reput_offset
                    raise Resync(f"the commitlog files disagree with the service: {exc}") from None
                self._track_end(end)
        finally:
            self._call = None
            call.cancel()
            positions.join()

    def _dispatch_files(self, files: CommitLogFiles, readable_end: int, file_size: int,
                        quarantined: Sequence[tuple[int, int]]) -> None:
        store = self._store
        while not self._stopped.is_set():
            offset = store.reput_offset
            chunk = files.chunk(offset, readable_end, self._chunk_bytes)
            if chunk.next_offset == offset:
                return
            self._take(chunk, file_size, quarantined)

    def _take(self, chunk: FileChunk | commitlog_pb2.TailChunk, file_size: int,
              quarantined: Sequence[tuple[int, int]], check_blank: Callable[[ChunkStep], None] | None = None) -> None:
        """Check a chunk against the reput offset (``tail_protocol``), then dispatch it. A chunk that
        skips a BLANK is taken only after ``check_blank`` read it back (a chunk from the files was cut
        at a BLANK the reader checked reaches its file's end)."""
        try:
            step = check_chunk(chunk.start_offset, len(chunk.data), chunk.record_count, chunk.next_offset,
                               self._store.reput_offset, file_size, quarantined)
        except ChunkMismatch as exc:
            raise Resync(str(exc)) from None
        if step.blank_offset >= 0:
            if check_blank is not None:
                check_blank(step)
            log.info("crossed the BLANK end of file at %d: dispatch continues at %d", step.blank_offset,
                     step.next_offset)
        if step.quarantined is not None:
            log.warning("skipping the commitlog's QUARANTINED range [%d, %d) (damaged at its recovery): "
                        "the records there are lost, dispatch continues at %d", *step.quarantined,
                        step.next_offset)
        self.read_bytes["files" if isinstance(chunk, FileChunk) else "tail"] += len(chunk.data)
        if chunk.record_count:
            try:
                requests = parse_dispatch_requests(chunk.data, chunk.start_offset, self._delay_levels_ms)
            except RecordError as exc:
                raise Resync(f"unparsable chunk at {chunk.start_offset}: {exc}") from None
            start = 0
            # A topic-deletion metadata record ends a part of its own: the topic's queues are removed
            # right after it, before any later record of the topic is dispatched (topic_deletion.py).
            for end, topic in topic_deletions(requests, chunk.data, chunk.start_offset):
                record = requests[end]
                if not self._dispatch(requests[start:end + 1], record.commitlog_offset + record.msg_size, topic):
                    return
                start = end + 1
            if not self._dispatch(requests[start:], step.next_offset):
                return
        elif step.next_offset != self._store.reput_offset:
            self._store.skip_to(step.next_offset)
        self.resyncs.progressed()

    def _dispatch(self, requests: Sequence[DispatchRequest], next_offset: int, deleted_topic: str = "") -> bool:
        """Dispatch a chunk (``IndexerStore.dispatch``); while the disk has no room for the files it
        needs (DiskFullError, raised before the write that would fail: whatever of the chunk was written
        is written again unchanged), wait and try again at the same reput offset, logging an ERROR when
        it starts and every ``DISK_FULL_LOG_INTERVAL_S`` while it lasts. Returns False, nothing
        dispatched, when stopped meanwhile."""
        waiting_since = told = 0.0
        while True:
            try:
                self._store.dispatch(requests, next_offset, deleted_topic)
            except DiskFullError as exc:
                now = time.monotonic()
                if not waiting_since:
                    waiting_since = now
                if now - told >= DISK_FULL_LOG_INTERVAL_S:
                    told = now
                    log.error("dispatch waits at reput offset %d for %.0f s: the indexer cannot write its files "
                              "(%s). Nothing is lost: it retries every %.1f s and goes on from there once there "
                              "is room", self._store.reput_offset, now - waiting_since, exc, self._max_backoff_s,
                              extra={"reput_offset": self._store.reput_offset})
                if self._stopped.wait(self._max_backoff_s):
                    return False
                continue
            if waiting_since:
                log.warning("dispatch goes on at reput offset %d after waiting %.1f s for room on the disk",
                            self._store.reput_offset, time.monotonic() - waiting_since)
            return True

    # -- records from the Tail --------------------------------------------------------------
    def _tail(self, stub: commitlog_pb2_grpc.CommitLogServiceStub, file_size: int,
              quarantined: Sequence[tuple[int, int]] = ()) -> None:
        """Dispatch the chunks of one Tail stream. Each chunk is checked against the reput offset
        first (``tail_protocol``): a chunk that skips a BLANK to the next file's start is taken only
        once the BLANK is read back from the commitlog, and a quarantine skip only over a range this
        commitlog incarnation's GetStoreInfo listed, so no skip can hide records unannounced."""
        store = self._store
        request = commitlog_pb2.TailRequest(from_offset=store.reput_offset, max_chunk_bytes=self._chunk_bytes,
                                            poll_wait_ms=self._poll_wait_ms)
        call = stub.Tail(request)
        self._call = call
        try:
            for chunk in call:
                if self._stopped.is_set():
                    return
                self._track_end(chunk.max_offset)
                self._take(chunk, file_size, quarantined, lambda step: self._check_blank(stub, step))
                self._track_end(chunk.max_offset)
        finally:
            self._call = None
            call.cancel()

    def _check_blank(self, stub: commitlog_pb2_grpc.CommitLogServiceStub, step: ChunkStep) -> None:
        """Read the BLANK a chunk skips: its magic must be there and its size must reach the next file."""
        try:
            head = stub.Read(commitlog_pb2.ReadRequest(offset=step.blank_offset, size=END_FILE_MIN_BLANK_LENGTH),
                             timeout=5).data
        except grpc.RpcError as exc:
            if exc.code() in RETRYABLE:
                raise
            raise Resync(f"the BLANK at {step.blank_offset} cannot be read: {exc.details()}") from None
        size, magic = SIZE_AND_MAGIC.unpack(head) if len(head) == SIZE_AND_MAGIC.size else (0, 0)
        if magic != BLANK_MAGIC_CODE or step.blank_offset + size != step.next_offset:
            raise Resync(f"a chunk skips from {step.blank_offset} to {step.next_offset}, but no BLANK reaching "
                         f"that file end is at {step.blank_offset} (size {size}, magic {magic:#010x})")
