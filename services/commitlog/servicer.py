"""CommitLogService: the gRPC face of the in-process CommitLog engine.

The servicer validates what only the edge knows about (request shapes and bounds), converts
protobuf to domain types, and maps each domain error to exactly one status code. Everything it
holds is bounded: batch sizes, read sizes, tail chunks and waits, concurrent streams, and the
queues of a pipelined AppendStream.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NoReturn

import grpc
from mqstore.v1 import commitlog_pb2, commitlog_pb2_grpc, common_pb2

from services.commitlog.commit_log import CommitLog
from services.commitlog.convert import (
    append_result_to_proto,
    message_from_proto,
    store_info_to_proto,
    topic_config_from_proto,
    topic_config_to_proto,
)
from services.commitlog.put_result import PutMessageError, PutMessageResult, PutMessageStatus
from services.server import metrics
from services.server.status import status_code_of
from services.store.errors import (
    InvalidArgumentError,
    StoreError,
)
from services.store.message import Message

log = logging.getLogger(__name__)

MIB = 1024 * 1024
SERVICE_NAME: str = commitlog_pb2.DESCRIPTOR.services_by_name["CommitLogService"].full_name

MAX_BATCH_MESSAGES = 1024
MAX_BATCH_BYTES = 64 * MIB
MAX_READ_RANGES = 1024
MAX_READ_BATCH_BYTES = 64 * MIB
DEFAULT_TAIL_CHUNK_BYTES = 1 * MIB
MAX_TAIL_CHUNK_BYTES = 64 * MIB
DEFAULT_POLL_WAIT_MS = 1000
MAX_POLL_WAIT_MS = 60_000
# AppendStream: messages per engine call, requests read ahead, result batches queued for sending.
STREAM_APPEND_BATCH = 64
STREAM_INTAKE_DEPTH = 1024
STREAM_RESULT_DEPTH = 32
# Long waits are cut into slices so a cancelled call or a stopping server is noticed promptly.
WAIT_SLICE_S = 0.25

def _rejected_status(exc: StoreError) -> str:
    return exc.status.name if isinstance(exc, PutMessageError) else type(exc).__name__


def _abort(context: grpc.ServicerContext, method: str, code: grpc.StatusCode, detail: str) -> NoReturn:
    metrics.RPC_ERRORS.labels(method=method, code=code.name).inc()
    context.abort(code, detail)


def _check_range(name: str, value: int, low: int, high: int, default: int, hint: str) -> int:
    if value == 0:
        return default
    if not low <= value <= high:
        raise InvalidArgumentError(f"{name} {value} must be within {low}..{high} ({hint})")
    return value


@dataclass(slots=True, frozen=True)
class _Failure:
    """Ends an AppendStream: the status to abort with, after the acks queued before it."""

    code: grpc.StatusCode
    detail: str


class _Marker:
    """A queue item that is not a request or a result."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


_END = _Marker("END")  # the request stream ended (half-close), or the call is over
_STOPPING = _Marker("STOPPING")  # the server is stopping


class CommitLogServicer(commitlog_pb2_grpc.CommitLogServiceServicer):  # type: ignore[misc]
    def __init__(self, engine: CommitLog, max_streams: int = 48) -> None:
        """``max_streams`` bounds Tail and AppendStream calls together: each holds a server worker for
        its whole life, and unary calls must always find one free."""
        self.engine = engine
        self.stopping = threading.Event()
        self._stream_slots = threading.BoundedSemaphore(max_streams)
        self._max_streams = max_streams

    def begin_shutdown(self) -> None:
        """Make tails and append streams end now (UNAVAILABLE, with where to resume)."""
        self.stopping.set()

    # -- append ------------------------------------------------------------------------------
    def put(self, messages: Sequence[Message]) -> list[PutMessageResult]:
        """One engine append call, with its metrics. Raises the engine's StoreError."""
        started = time.perf_counter()
        try:
            results = self.engine.put_messages(messages)
        except StoreError as exc:
            metrics.observe_rejected(_rejected_status(exc), len(messages))
            raise
        metrics.observe_append(results, time.perf_counter() - started)
        return results

    def _put_or_abort(self, context: grpc.ServicerContext, method: str,
                      messages: Sequence[Message]) -> list[PutMessageResult]:
        try:
            return self.put(messages)
        except StoreError as exc:
            _abort(context, method, status_code_of(exc), str(exc))

    def Append(self, request: commitlog_pb2.AppendRequest,
               context: grpc.ServicerContext) -> commitlog_pb2.AppendResult:
        if not request.HasField("message"):
            _abort(context, "Append", grpc.StatusCode.INVALID_ARGUMENT,
                   "AppendRequest.message is missing: set the message to append")
        message = message_from_proto(request.message, context.peer())
        result = self._put_or_abort(context, "Append", [message])[0]
        if result.status is PutMessageStatus.FLUSH_DISK_TIMEOUT:
            _abort(context, "Append", grpc.StatusCode.DEADLINE_EXCEEDED,
                   "FLUSH_DISK_TIMEOUT: the message was written at commitlog offset "
                   f"{result.commitlog_offset} (msg id {result.msg_id}) but its flush to disk did not finish "
                   f"within syncFlushTimeout ({self.engine.config.sync_flush_timeout} ms), so a power loss "
                   "may lose it: check the disk's latency or raise syncFlushTimeout")
        return append_result_to_proto(result)

    def AppendBatch(self, request: commitlog_pb2.AppendBatchRequest,
                    context: grpc.ServicerContext) -> commitlog_pb2.AppendBatchResponse:
        count = len(request.messages)
        if count == 0:
            _abort(context, "AppendBatch", grpc.StatusCode.INVALID_ARGUMENT,
                   "AppendBatchRequest has no messages: send at least one")
        if count > MAX_BATCH_MESSAGES:
            _abort(context, "AppendBatch", grpc.StatusCode.INVALID_ARGUMENT,
                   f"the batch has {count} messages, more than the limit of {MAX_BATCH_MESSAGES}: split it")
        size = request.ByteSize()
        if size > MAX_BATCH_BYTES:
            _abort(context, "AppendBatch", grpc.StatusCode.INVALID_ARGUMENT,
                   f"the batch is {size} bytes, more than the limit of {MAX_BATCH_BYTES}: split it")
        peer = context.peer()
        results = self._put_or_abort(context, "AppendBatch",
                                     [message_from_proto(m, peer) for m in request.messages])
        return commitlog_pb2.AppendBatchResponse(results=[append_result_to_proto(r) for r in results])

    def AppendStream(self, request_iterator: Iterator[commitlog_pb2.AppendRequest],
                     context: grpc.ServicerContext) -> Iterator[commitlog_pb2.AppendResult]:
        with self._stream_slot(context, "AppendStream"):
            yield from _AppendPipeline(self, request_iterator, context).responses()

    # -- read --------------------------------------------------------------------------------
    def Read(self, request: commitlog_pb2.ReadRequest,
             context: grpc.ServicerContext) -> commitlog_pb2.ReadResponse:
        try:
            data = self.engine.read(request.offset, request.size)
        except StoreError as exc:
            _abort(context, "Read", status_code_of(exc), str(exc))
        return commitlog_pb2.ReadResponse(data=data, incarnation=self.engine.incarnation)

    def ReadBatch(self, request: commitlog_pb2.ReadBatchRequest,
                  context: grpc.ServicerContext) -> commitlog_pb2.ReadBatchResponse:
        ranges = request.ranges
        if not ranges:
            _abort(context, "ReadBatch", grpc.StatusCode.INVALID_ARGUMENT,
                   "ReadBatchRequest has no ranges: send at least one")
        if len(ranges) > MAX_READ_RANGES:
            _abort(context, "ReadBatch", grpc.StatusCode.INVALID_ARGUMENT,
                   f"{len(ranges)} ranges are more than the limit of {MAX_READ_RANGES}: split the request")
        total = sum(max(r.size, 0) for r in ranges)
        if total > MAX_READ_BATCH_BYTES:
            _abort(context, "ReadBatch", grpc.StatusCode.INVALID_ARGUMENT,
                   f"the ranges add up to {total} bytes, more than the limit of {MAX_READ_BATCH_BYTES}: "
                   "split the request")
        data: list[bytes] = []
        for i, r in enumerate(ranges):
            try:
                data.append(self.engine.read(r.offset, r.size))
            except StoreError as exc:
                _abort(context, "ReadBatch", status_code_of(exc), f"range #{i}: {exc}")
        return commitlog_pb2.ReadBatchResponse(data=data, incarnation=self.engine.incarnation)

    def Tail(self, request: commitlog_pb2.TailRequest,
             context: grpc.ServicerContext) -> Iterator[commitlog_pb2.TailChunk]:
        try:
            max_bytes = _check_range("max_chunk_bytes", request.max_chunk_bytes, 1, MAX_TAIL_CHUNK_BYTES,
                                     DEFAULT_TAIL_CHUNK_BYTES, "0 means 1 MiB")
            poll_wait_ms = _check_range("poll_wait_ms", request.poll_wait_ms, 1, MAX_POLL_WAIT_MS,
                                        DEFAULT_POLL_WAIT_MS, "0 means 1000 ms")
        except InvalidArgumentError as exc:
            _abort(context, "Tail", grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        with self._stream_slot(context, "Tail"):
            yield from self._tail(request.from_offset, max_bytes, poll_wait_ms / 1000, context)

    def _tail(self, offset: int, max_bytes: int, poll_wait_s: float,
              context: grpc.ServicerContext) -> Iterator[commitlog_pb2.TailChunk]:
        engine = self.engine
        while context.is_active():
            if self.stopping.is_set():
                _abort(context, "Tail", grpc.StatusCode.UNAVAILABLE,
                       "the commitlog service is stopping: resume the tail from offset "
                       f"{offset} once it is back")
            try:
                chunk = engine.tail_chunk(offset, max_bytes)
            except StoreError as exc:
                _abort(context, "Tail", status_code_of(exc), str(exc))
            if chunk.record_count:
                metrics.TAIL_DATA_CHUNKS.inc()
                yield commitlog_pb2.TailChunk(
                    start_offset=chunk.start_offset, data=chunk.data, next_offset=chunk.next_offset,
                    max_offset=engine.max_offset, record_count=chunk.record_count,
                    incarnation=engine.incarnation)
                offset = chunk.next_offset
            elif chunk.next_offset != offset:  # a BLANK end of file: continue in the next file
                offset = chunk.next_offset
            elif not self._wait_for_data(offset, poll_wait_s, context) and context.is_active() \
                    and not self.stopping.is_set():
                metrics.TAIL_HEARTBEATS.inc()
                yield commitlog_pb2.TailChunk(start_offset=offset, next_offset=offset,
                                              max_offset=engine.max_offset, incarnation=engine.incarnation)

    def _wait_for_data(self, offset: int, timeout_s: float, context: grpc.ServicerContext) -> bool:
        """Long poll in slices; False on timeout, cancellation or shutdown. Never spins: the engine
        returns at once while it is not writable (disk full), so a short return sleeps out its slice."""
        deadline = time.monotonic() + timeout_s
        while True:
            now = time.monotonic()
            if now >= deadline or self.stopping.is_set() or not context.is_active():
                return False
            slice_end = min(deadline, now + WAIT_SLICE_S)
            if self.engine.wait_for_data(offset, slice_end - now):
                return True
            rest = slice_end - time.monotonic()
            if rest > 0:
                self.stopping.wait(rest)

    # -- info and admin ----------------------------------------------------------------------
    def GetStoreInfo(self, request: commitlog_pb2.GetStoreInfoRequest,
                     context: grpc.ServicerContext) -> commitlog_pb2.StoreInfo:
        engine, config = self.engine, self.engine.config
        return store_info_to_proto(
            engine.stats(), flush_disk_type=config.flush_disk_type,
            transient_store_pool_enable=engine.pool_enabled,
            mapped_file_size=config.mapped_file_size_commit_log, store_root=str(engine.root.resolve()),
            incarnation=engine.incarnation, store_host=config.store_host)

    def CreateTopic(self, request: commitlog_pb2.TopicRequest,
                    context: grpc.ServicerContext) -> common_pb2.TopicConfig:
        return self._change_topic(request, context, "CreateTopic")

    def UpdateTopic(self, request: commitlog_pb2.TopicRequest,
                    context: grpc.ServicerContext) -> common_pb2.TopicConfig:
        return self._change_topic(request, context, "UpdateTopic")

    def _change_topic(self, request: commitlog_pb2.TopicRequest, context: grpc.ServicerContext,
                      method: str) -> common_pb2.TopicConfig:
        if not request.HasField("topic"):
            _abort(context, method, grpc.StatusCode.INVALID_ARGUMENT,
                   "TopicRequest.topic is missing: set the topic config")
        config = topic_config_from_proto(request.topic)
        change = self.engine.create_topic if method == "CreateTopic" else self.engine.update_topic
        try:
            return topic_config_to_proto(change(config))
        except StoreError as exc:
            _abort(context, method, status_code_of(exc), str(exc))

    def ListTopics(self, request: commitlog_pb2.ListTopicsRequest,
                   context: grpc.ServicerContext) -> commitlog_pb2.ListTopicsResponse:
        return commitlog_pb2.ListTopicsResponse(
            topics=[topic_config_to_proto(c) for c in self.engine.topics.list()])

    # -- streams -----------------------------------------------------------------------------
    @contextmanager
    def _stream_slot(self, context: grpc.ServicerContext, method: str) -> Iterator[None]:
        if not self._stream_slots.acquire(blocking=False):
            _abort(context, method, grpc.StatusCode.RESOURCE_EXHAUSTED,
                   f"{self._max_streams} Tail/AppendStream calls are already open on this server: "
                   "close idle ones or retry later")
        try:
            yield
        finally:
            self._stream_slots.release()


class _AppendPipeline:
    """One AppendStream call, pipelined so a slow flush never stalls the reading of requests.

    An intake thread reads requests into a bounded queue; an appender thread takes whatever has
    arrived (up to STREAM_APPEND_BATCH) into one engine call, so under SYNC_FLUSH one group-commit
    fsync covers many messages; the RPC's own generator sends the results in order. A bad message
    ends the stream with its sequence number (0-based) after the acks of every message before it.
    """

    def __init__(self, servicer: CommitLogServicer, requests: Iterator[commitlog_pb2.AppendRequest],
                 context: grpc.ServicerContext) -> None:
        self._servicer = servicer
        self._requests = requests
        self._context = context
        self._peer = context.peer()
        self._intake: queue.Queue[Any] = queue.Queue(STREAM_INTAKE_DEPTH)
        self._results: queue.Queue[Any] = queue.Queue(STREAM_RESULT_DEPTH)
        self._done = threading.Event()

    def responses(self) -> Iterator[commitlog_pb2.AppendResult]:
        self._context.add_callback(self._done.set)
        threading.Thread(target=self._read, name="append-stream-intake", daemon=True).start()
        threading.Thread(target=self._append_loop, name="append-stream-append", daemon=True).start()
        try:
            while True:
                item = self._take(self._results)
                if isinstance(item, list):
                    yield from item
                elif isinstance(item, _Failure):
                    _abort(self._context, "AppendStream", item.code, item.detail)
                else:
                    return
        finally:
            self._done.set()

    def _offer(self, target: queue.Queue[Any], item: object) -> bool:
        """Put with backpressure; False if the call ended meanwhile (nobody will take it)."""
        while not self._done.is_set():
            try:
                target.put(item, timeout=WAIT_SLICE_S)
                return True
            except queue.Full:
                continue
        return False

    def _take(self, source: queue.Queue[Any], watch_stopping: bool = False) -> Any:
        """Block for the next item; _END once the call is over, _STOPPING (if watched) once the
        server is stopping and nothing is queued."""
        while True:
            try:
                return source.get(timeout=WAIT_SLICE_S)
            except queue.Empty:
                pass
            if self._done.is_set():
                return _END
            if watch_stopping and self._servicer.stopping.is_set():
                return _STOPPING

    def _read(self) -> None:
        try:
            for request in self._requests:
                if not self._offer(self._intake, request):
                    return
        except Exception as exc:  # noqa: BLE001 - the call was cancelled or broke: nothing more to read
            log.debug("append stream from %s ended while reading: %s", self._peer, exc)
        self._offer(self._intake, _END)

    def _append_loop(self) -> None:
        seq = 0
        while True:
            if self._servicer.stopping.is_set():
                self._offer(self._results, _Failure(
                    grpc.StatusCode.UNAVAILABLE,
                    f"the commitlog service is stopping: message #{seq} of the stream and later were not "
                    "appended; resend them once it is back"))
                return
            requests, end = self._next_requests()
            failure = self._append(seq, requests) if requests else None
            seq += len(requests)
            if failure is not None:
                self._offer(self._results, failure)
                return
            if end is _END:
                self._offer(self._results, _END)
                return

    def _next_requests(self) -> tuple[list[commitlog_pb2.AppendRequest], object]:
        """Block for one request, then take what else has already arrived, up to a batch.
        Also returns _END if the request stream ended, _STOPPING if the server is stopping, else None."""
        first = self._take(self._intake, watch_stopping=True)
        if first is _END or first is _STOPPING:
            return [], first
        batch = [first]
        while len(batch) < STREAM_APPEND_BATCH:
            try:
                item = self._intake.get_nowait()
            except queue.Empty:
                break
            if item is _END:
                return batch, _END
            batch.append(item)
        return batch, None

    def _append(self, seq: int, requests: Sequence[commitlog_pb2.AppendRequest]) -> _Failure | None:
        messages: list[Message] = []
        failure: _Failure | None = None
        for i, request in enumerate(requests):
            if not request.HasField("message"):
                failure = _Failure(grpc.StatusCode.INVALID_ARGUMENT,
                                   f"message #{seq + i} of the stream: AppendRequest.message is missing")
                break
            messages.append(message_from_proto(request.message, self._peer))
        if not messages:
            return failure
        try:
            results = self._servicer.put(messages)
        except StoreError:
            # The engine wrote nothing; find the culprit one message at a time, acking those before it.
            results, first_failure = self._append_one_by_one(seq, messages)
            failure = first_failure or failure
        if results:
            self._offer(self._results, [append_result_to_proto(r) for r in results])
        return failure

    def _append_one_by_one(self, seq: int,
                           messages: Iterable[Message]) -> tuple[list[PutMessageResult], _Failure | None]:
        results: list[PutMessageResult] = []
        for i, message in enumerate(messages):
            try:
                results.extend(self._servicer.put([message]))
            except StoreError as exc:
                return results, _Failure(status_code_of(exc), f"message #{seq + i} of the stream: {exc}")
        return results, None
