"""CommitLogService: the gRPC face of the in-process CommitLog engine, on a ``grpc.aio`` server.

The servicer validates what only the edge knows about (request shapes and bounds), converts
protobuf to domain types, and maps each domain error to exactly one status code. Handlers are
coroutines on one event loop and never block it: concurrent unary Appends meet in a PutBatcher, which
appends whatever has arrived with one engine call (under SYNC_FLUSH, one group-commit fsync for all
of them), and engine calls that can block (appends, large reads, topic changes) run in the loop's
bounded executor. Coroutines rather than threads per call because waking an OS thread per
acknowledgement costs more than the append itself in CPython.

Everything it holds is bounded: batch sizes, read sizes, tail chunks and waits, concurrent streams,
and the messages in flight on one AppendStream.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterable, AsyncIterator, Sequence
from contextlib import asynccontextmanager, suppress

import grpc

from mqstore.v1 import admin_pb2, commitlog_pb2, commitlog_pb2_grpc, common_pb2
from services.commitlog import metrics
from services.commitlog.convert import (
    append_batch_response,
    append_blob_response,
    append_result_to_proto,
    blob_messages_from_proto,
    message_from_proto,
    messages_from_proto,
    store_info_to_proto,
    topic_config_from_proto,
    topic_config_to_proto,
)
from services.commitlog.ha.metadata_apply import metadata_flow_message
from services.commitlog.message_store import MessageStore
from services.commitlog.put_batcher import PutBatcher
from services.commitlog.put_result import PutMessageError, PutMessageResult, PutMessageStatus
from services.server import tracing
from services.server.status import CallFailed, RpcEdge, status_code_of
from services.store.config import SYNC_FLUSH
from services.store.errors import (
    InvalidArgumentError,
    OutOfRangeError,
    ResourceExhaustedError,
    StoreError,
    UnavailableError,
)
from services.store.formats.message import PROPERTY_TAGS, Message
from services.store.rules.batch_codec import MAX_BATCH_MESSAGES
from services.store.rules.names import check_deletable_topic

log = logging.getLogger(__name__)

MIB = 1024 * 1024
SERVICE_NAME: str = commitlog_pb2.DESCRIPTOR.services_by_name["CommitLogService"].full_name

MAX_BATCH_BYTES = 64 * MIB
MAX_READ_RANGES = 1024
MAX_READ_BATCH_BYTES = 64 * MIB
DEFAULT_TAIL_CHUNK_BYTES = 1 * MIB
MAX_TAIL_CHUNK_BYTES = 64 * MIB
DEFAULT_POLL_WAIT_MS = 1000
MAX_POLL_WAIT_MS = 60_000
# Tail + AppendStream calls open at once. A waiting stream costs a coroutine, not a thread; the bound
# keeps memory and the work of waking tails in check (the proto's RESOURCE_EXHAUSTED names it).
MAX_STREAMS = 256
# Messages one AppendStream has read but not yet acknowledged; its reader waits beyond this. Also the
# most one engine call of a stream appends (the AppendBatch limit).
STREAM_MAX_UNACKED = MAX_BATCH_MESSAGES
# Work on up to this many bytes (a read, a tail chunk, an ASYNC_FLUSH append) is done on the loop: it
# holds the GIL anyway, and a thread hop costs two wake-ups. Bigger work goes to a thread so one 64 MiB
# copy does not stall every other call for its whole duration.
LOOP_WORK_MAX_BYTES = 1 * MIB
# The growth watch waits on the engine in slices, so its thread notices a stop promptly.
WAIT_SLICE_S = 0.25


Context = grpc.aio.ServicerContext[object, object]


def _rejected_status(exc: StoreError) -> str:
    return exc.status.name if isinstance(exc, PutMessageError) else type(exc).__name__


def _observe(method: str, code: grpc.StatusCode, _: float) -> None:
    if code is not grpc.StatusCode.OK:
        metrics.RPC_ERRORS.labels(method=method, code=code.name).inc()


#: Every RPC's error path: domain errors and CallFailed end the call with their status (and count it).
rpc = RpcEdge(commitlog_pb2.DESCRIPTOR.services_by_name["CommitLogService"], _observe)


def _check_range(name: str, value: int, low: int, high: int, default: int, hint: str) -> int:
    if value == 0:
        return default
    if not low <= value <= high:
        raise InvalidArgumentError(f"{name} {value} must be within {low}..{high} ({hint})")
    return value


class _MeteredEngine:
    """The engine's append calls with their metrics: one observation per engine call, never per
    message. Called on the loop or in worker threads (prometheus metrics are thread-safe)."""

    def __init__(self, engine: MessageStore) -> None:
        self._engine = engine

    def put_messages(self, messages: Sequence[Message]) -> list[PutMessageResult]:
        """All or nothing (AppendBatch, a stream's batch); raises the engine's StoreError."""
        started = time.perf_counter()
        try:
            results = self._engine.put_messages(messages)
        except StoreError as exc:
            metrics.observe_rejected(_rejected_status(exc), len(messages))
            raise
        metrics.observe_append(results, time.perf_counter() - started)
        return results

    def put_each(self, messages: Sequence[Message]) -> list[PutMessageResult | StoreError]:
        """Independent producers' messages (the PutBatcher's call): each bad one fails alone."""
        started = time.perf_counter()
        try:
            outcomes = self._engine.put_each(messages)
        except StoreError as exc:
            metrics.observe_rejected(_rejected_status(exc), len(messages))
            raise
        results = [o for o in outcomes if isinstance(o, PutMessageResult)]
        metrics.observe_append(results, time.perf_counter() - started)
        if len(results) < len(outcomes):
            for outcome in outcomes:
                if isinstance(outcome, StoreError):
                    metrics.observe_rejected(_rejected_status(outcome))
        return outcomes


class _GrowthWatch:
    """Wakes waiting Tail calls on the event loop when the log grows, from one thread for all of them.

    The engine's long poll (``wait_for_data``) blocks a thread on a condition; a thread per waiting
    tail would tie up the executor the appends need. This thread waits only while some tail does,
    and each growth wakes every waiter once (each then reads its own next chunk).
    """

    def __init__(self, engine: MessageStore) -> None:
        self._engine = engine
        self._loop: asyncio.AbstractEventLoop | None = None
        self._grown = asyncio.Event()
        self._waiters = 0
        self._wanted = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tail-growth-watch", daemon=True)

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread.start()

    def stop(self) -> None:
        """Blocks until the thread has ended (at most one wait slice)."""
        self._stop.set()
        self._wanted.set()
        if self._thread.is_alive():
            self._thread.join()

    def wake_all(self) -> None:
        """Wake every waiter now (the log grew, or the server is stopping). Loop thread only."""
        grown, self._grown = self._grown, asyncio.Event()
        grown.set()

    async def wait(self, timeout_s: float) -> None:
        """Return at the next growth (or :meth:`wake_all`), or after ``timeout_s``. Callers check
        the max offset themselves, before and after: a wake may be for somebody else's offset."""
        grown = self._grown
        self._waiters += 1
        if self._waiters == 1:
            self._wanted.set()
        try:
            with suppress(TimeoutError):
                async with asyncio.timeout(timeout_s):
                    await grown.wait()
        finally:
            self._waiters -= 1
            if not self._waiters:
                self._wanted.clear()

    def _run(self) -> None:
        engine, loop = self._engine, self._loop
        assert loop is not None
        seen = engine.max_offset
        while not self._stop.is_set():
            if not self._wanted.wait(WAIT_SLICE_S) or self._stop.is_set():
                continue
            started = time.monotonic()
            if engine.wait_for_data(seen, WAIT_SLICE_S):
                seen = engine.max_offset
                with suppress(RuntimeError):  # the loop closed meanwhile: nobody is waiting
                    loop.call_soon_threadsafe(self.wake_all)
                continue
            # Never spin: the engine answers at once once it has stopped.
            rest = WAIT_SLICE_S - (time.monotonic() - started)
            if rest > 0:
                self._stop.wait(rest)


def _stream_failure(exc: StoreError, seq: int) -> CallFailed:
    """What ends an AppendStream at message ``seq`` (after the acks of the messages before it)."""
    return CallFailed(status_code_of(exc), f"message #{seq} of the stream: {exc}")


class CommitLogServicer(commitlog_pb2_grpc.CommitLogServiceServicer):  # type: ignore[misc]
    def __init__(self, engine: MessageStore, max_streams: int = MAX_STREAMS) -> None:
        """Create on the loop that will serve; :meth:`start` before serving, :meth:`close` after."""
        self.engine = engine
        self.stopping = False
        self._puts = _MeteredEngine(engine)
        # The batcher only calls put_each: the metered wrapper stands in for the engine.
        self._batcher = PutBatcher(self._puts)
        self._growth = _GrowthWatch(engine)
        self._max_streams = max_streams
        self._open_streams = 0
        self._stream_wakeups: set[asyncio.Event] = set()

    @property
    def _puts_wait_for_flush(self) -> bool:
        """Puts that wait (a group-commit flush, SYNC_MASTER followers) run off the loop. Asked per put:
        a replica that etcd makes leader starts waiting for its followers after this servicer exists."""
        commit_log = self.engine.commit_log
        return commit_log.sync_flush or commit_log.wait_for_replicas is not None

    async def start(self) -> None:
        self._batcher.start()
        self._growth.start()

    def begin_shutdown(self) -> None:
        """Make tails and append streams end now (UNAVAILABLE, with where to resume). Unary calls
        in flight still finish: the batcher keeps appending until :meth:`close`."""
        self.stopping = True
        self._growth.wake_all()
        for wakeup in self._stream_wakeups:
            wakeup.set()

    async def close(self) -> None:
        """After the server stopped: fail whatever still waits in the batcher, stop the growth watch."""
        await self._batcher.close()
        await asyncio.to_thread(self._growth.stop)

    # -- append ------------------------------------------------------------------------------
    async def put_messages(self, messages: Sequence[Message], size_bytes: int) -> list[PutMessageResult]:
        """An all-or-nothing append of about ``size_bytes``; raises the engine's StoreError.

        Under SYNC_FLUSH an engine call waits for its group commit, so it runs in a worker thread, and
        a single message joins the PutBatcher (for one message all-or-nothing is what the batcher does
        anyway), sharing one engine call and fsync with every other producer. A big batch also goes to
        a thread. A small ASYNC_FLUSH append is a few µs of GIL-bound work per message: done here.
        """
        if self._puts_wait_for_flush:
            if len(messages) == 1:
                if tracing.ENABLED:
                    return [await self._put_one_traced(messages[0])]
                return [await self._batcher.put(messages[0])]
            # The engine's flush wait is a span of its own (the thread inherits this call's context).
            return await asyncio.to_thread(self._puts.put_messages, messages)
        if size_bytes > LOOP_WORK_MAX_BYTES:
            return await asyncio.to_thread(self._puts.put_messages, messages)
        return self._puts.put_messages(messages)

    async def _put_one_traced(self, message: Message) -> PutMessageResult:
        """The batcher's engine call serves many producers, so no single request's span can parent
        it: each waiting Append gets its own flush-wait span, the wall time it waited for the group
        commit (the shared append and the fdatasync that made its message durable)."""
        with tracing.span("commitlog.flush_wait", flush_disk_type=SYNC_FLUSH, group_commit=True, messages=1):
            return await self._batcher.put(message)

    @rpc
    async def Append(self, request: commitlog_pb2.AppendRequest, context: Context) -> commitlog_pb2.AppendResult:
        if not request.HasField("message"):
            raise InvalidArgumentError("AppendRequest.message is missing: set the message to append")
        if request.metadata_flow:
            pb = request.message
            message = metadata_flow_message(pb.topic, pb.queue_id, pb.properties.get(PROPERTY_TAGS), pb.body)
        else:
            message = message_from_proto(request.message, context.peer(), request.group_flow,
                                         request.transaction_flow, request.scheduled_delivery)
        if tracing.ENABLED and self._puts_wait_for_flush:
            result = await self._put_one_traced(message)
        else:
            result = await self._batcher.put(message)
        if result.status is PutMessageStatus.FLUSH_DISK_TIMEOUT:
            raise CallFailed(grpc.StatusCode.DEADLINE_EXCEEDED,
                             "FLUSH_DISK_TIMEOUT: the message was written at commitlog offset "
                             f"{result.commitlog_offset} (msg id {result.msg_id}) but its flush to disk did not "
                             f"finish within syncFlushTimeout ({self.engine.config.sync_flush_timeout} ms), so a "
                             "power loss may lose it: check the disk's latency or raise syncFlushTimeout")
        return append_result_to_proto(result)

    @rpc
    async def AppendBatch(self, request: commitlog_pb2.AppendBatchRequest,
                          context: Context) -> commitlog_pb2.AppendBatchResponse:
        count = len(request.messages)
        blob = request.encoded_messages
        if count == 0 and not blob:
            raise InvalidArgumentError("AppendBatchRequest has no messages: send at least one (messages or "
                                       "encoded_messages)")
        if count and blob:
            raise InvalidArgumentError("AppendBatchRequest has both messages and encoded_messages: send one form")
        if count > MAX_BATCH_MESSAGES:
            raise InvalidArgumentError(f"the batch has {count} messages, more than the limit of {MAX_BATCH_MESSAGES}: "
                                       "split it")
        size = len(blob) if blob else request.ByteSize()
        if size > MAX_BATCH_BYTES:
            raise InvalidArgumentError(f"the batch is {size} bytes, more than the limit of {MAX_BATCH_BYTES}: "
                                       "split it")
        if blob:
            messages = blob_messages_from_proto(request, blob, context.peer(), MAX_BATCH_MESSAGES)
        else:
            messages = messages_from_proto(request.messages, context.peer(), request.scheduled_delivery)
        results = await self.put_messages(messages, size)
        if blob:
            return append_blob_response(results, request.topic, request.queue_id)
        return append_batch_response(results)

    @rpc
    async def AppendStream(self, request_iterator: AsyncIterable[commitlog_pb2.AppendRequest],
                           context: Context) -> None:
        async with self._stream_slot():
            await _AppendStream(self, request_iterator, context).run()

    # -- read --------------------------------------------------------------------------------
    @rpc
    async def Read(self, request: commitlog_pb2.ReadRequest, context: Context) -> commitlog_pb2.ReadResponse:
        if request.size > LOOP_WORK_MAX_BYTES:
            data = await asyncio.to_thread(self.engine.read, request.offset, request.size)
        else:
            data = self.engine.read(request.offset, request.size)
        metrics.observe_read(metrics.READ_CALLS, metrics.READ_BYTES_READ, len(data))
        return commitlog_pb2.ReadResponse(data=data, incarnation=self.engine.incarnation)

    @rpc
    async def ReadBatch(self, request: commitlog_pb2.ReadBatchRequest,
                        context: Context) -> commitlog_pb2.ReadBatchResponse:
        ranges = request.ranges
        if not ranges:
            raise InvalidArgumentError("ReadBatchRequest has no ranges: send at least one")
        if len(ranges) > MAX_READ_RANGES:
            raise InvalidArgumentError(f"{len(ranges)} ranges are more than the limit of {MAX_READ_RANGES}: split "
                                       "the request")
        total = sum(max(r.size, 0) for r in ranges)
        if total > MAX_READ_BATCH_BYTES:
            raise InvalidArgumentError(f"the ranges add up to {total} bytes, more than the limit of "
                                       f"{MAX_READ_BATCH_BYTES}: split the request")
        pairs = [(r.offset, r.size) for r in ranges]
        if total > LOOP_WORK_MAX_BYTES:
            data, failure = await asyncio.to_thread(self._read_ranges, pairs)
        else:
            data, failure = self._read_ranges(pairs)
        if failure is not None:
            raise failure
        metrics.observe_read(metrics.READ_BATCH_CALLS, metrics.READ_BYTES_READ_BATCH, sum([len(d) for d in data]))
        return commitlog_pb2.ReadBatchResponse(data=data, incarnation=self.engine.incarnation)

    def _read_ranges(self, pairs: Sequence[tuple[int, int]]) -> tuple[list[bytes], CallFailed | None]:
        read = self.engine.read
        data: list[bytes] = []
        for i, (offset, size) in enumerate(pairs):
            try:
                data.append(read(offset, size))
            except StoreError as exc:
                return data, CallFailed(status_code_of(exc), f"range #{i}: {exc}")
        return data, None

    @rpc
    async def Tail(self, request: commitlog_pb2.TailRequest, context: Context) -> None:
        """Writes chunks with ``context.write`` from a coroutine rather than yielding them from an async
        generator: a cancelled call then unwinds this frame (and frees its stream slot) at once."""
        max_bytes = _check_range("max_chunk_bytes", request.max_chunk_bytes, 1, MAX_TAIL_CHUNK_BYTES,
                                 DEFAULT_TAIL_CHUNK_BYTES, "0 means 1 MiB")
        poll_wait_ms = _check_range("poll_wait_ms", request.poll_wait_ms, 1, MAX_POLL_WAIT_MS,
                                    DEFAULT_POLL_WAIT_MS, "0 means 1000 ms")
        async with self._stream_slot():
            if request.positions_only:
                await self._tail_positions(request.from_offset, poll_wait_ms / 1000, context)
            else:
                await self._tail(request.from_offset, max_bytes, poll_wait_ms / 1000, context)

    async def _tail_positions(self, offset: int, poll_wait_s: float, context: Context) -> None:
        """POSITIONS mode: only the readable end (``engine.max_offset``: the committed position with a
        transient store pool), for a tailer reading the files itself. No record is read here and no
        thread is used: one small chunk per growth the loop sees, so growths during a write coalesce."""
        engine = self.engine
        if not engine.min_offset <= offset <= engine.max_offset:
            raise OutOfRangeError(f"offset {offset} is outside the log [{engine.min_offset}, {engine.max_offset}]: "
                                  "it may have been truncated by a crash recovery, or its files deleted")
        sent = -1
        while True:
            if self.stopping:
                raise UnavailableError("the commitlog service is stopping: resume the tail once it is back")
            end = engine.max_offset
            if end != sent:
                kind = metrics.TAIL_POSITION_CHUNKS
            elif not await self._wait_for_data(end, poll_wait_s) and not self.stopping:
                kind = metrics.TAIL_HEARTBEATS
            else:
                continue
            kind.inc()
            end = engine.max_offset
            await context.write(commitlog_pb2.TailChunk(start_offset=end, next_offset=end, max_offset=end,
                                                        incarnation=engine.incarnation))
            sent = end

    async def _tail(self, offset: int, max_bytes: int, poll_wait_s: float, context: Context) -> None:
        engine = self.engine
        in_thread = max_bytes > LOOP_WORK_MAX_BYTES
        while True:
            if self.stopping:
                raise UnavailableError("the commitlog service is stopping: resume the tail from offset "
                                       f"{offset} once it is back")
            if in_thread:
                chunk = await asyncio.to_thread(engine.tail_chunk, offset, max_bytes)
            else:
                chunk = engine.tail_chunk(offset, max_bytes)
            if chunk.record_count or chunk.skips_blank:
                # Records, or a BLANK or quarantined range skipped with none: either way the client is
                # told where the next chunk starts, so its offset never jumps unannounced.
                if chunk.record_count:
                    metrics.TAIL_DATA_CHUNKS.inc()
                    metrics.READ_BYTES_TAIL.inc(len(chunk.data))
                else:
                    quarantined = engine.quarantine.overlapping(chunk.start_offset, chunk.start_offset + 1)
                    metrics.TAIL_CHUNKS.labels(kind="quarantine_skip" if quarantined else "blank_skip").inc()
                await context.write(commitlog_pb2.TailChunk(
                    start_offset=chunk.start_offset, data=chunk.data, next_offset=chunk.next_offset,
                    max_offset=engine.max_offset, record_count=chunk.record_count,
                    incarnation=engine.incarnation))
                offset = chunk.next_offset
            elif not await self._wait_for_data(offset, poll_wait_s) and not self.stopping:
                metrics.TAIL_HEARTBEATS.inc()
                await context.write(commitlog_pb2.TailChunk(
                    start_offset=offset, next_offset=offset, max_offset=engine.max_offset,
                    incarnation=engine.incarnation))

    async def _wait_for_data(self, offset: int, timeout_s: float) -> bool:
        """Long poll without a thread of its own; False on timeout or shutdown."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not self.stopping:
            if self.engine.max_offset > offset:
                return True
            rest = deadline - loop.time()
            if rest <= 0:
                return False
            await self._growth.wait(rest)
        return False

    # -- info and admin ----------------------------------------------------------------------
    @rpc
    async def GetStoreInfo(self, request: commitlog_pb2.GetStoreInfoRequest,
                           context: Context) -> commitlog_pb2.StoreInfo:
        engine, config = self.engine, self.engine.config
        info = store_info_to_proto(
            engine.stats(), flush_disk_type=config.flush_disk_type,
            transient_store_pool_enable=engine.commit_log.pool_enabled,
            mapped_file_size=config.mapped_file_size_commit_log, store_root=str(engine.root.resolve()),
            incarnation=engine.incarnation, store_host=config.store_host,
            quarantined=engine.quarantine.ranges,
            disk_clean_ratio=config.disk_max_used_space_ratio / 100,
            disk_refuse_ratio=config.disk_space_warning_level_ratio, disk_full=engine.disk_full)
        info.max_message_size = min(config.max_message_size, config.mapped_file_size_commit_log - 8)
        return info

    @rpc
    async def CreateTopic(self, request: commitlog_pb2.TopicRequest, context: Context) -> common_pb2.TopicConfig:
        return await self._change_topic(request, "CreateTopic")

    @rpc
    async def UpdateTopic(self, request: commitlog_pb2.TopicRequest, context: Context) -> common_pb2.TopicConfig:
        return await self._change_topic(request, "UpdateTopic")

    async def _change_topic(self, request: commitlog_pb2.TopicRequest, method: str) -> common_pb2.TopicConfig:
        if not request.HasField("topic"):
            raise InvalidArgumentError("TopicRequest.topic is missing: set the topic config")
        config = topic_config_from_proto(request.topic)
        change = self.engine.create_topic if method == "CreateTopic" else self.engine.update_topic
        return topic_config_to_proto(await asyncio.to_thread(change, config))  # writes the topics file

    @rpc
    async def DeleteTopic(self, request: admin_pb2.DeleteTopicRequest,
                          context: Context) -> admin_pb2.DeleteTopicResponse:
        check_deletable_topic(request.topic)
        offset = await asyncio.to_thread(self.engine.delete_topic, request.topic)  # writes the topics file
        return admin_pb2.DeleteTopicResponse(commitlog_offset=offset)

    @rpc
    async def ListTopics(self, request: commitlog_pb2.ListTopicsRequest,
                         context: Context) -> commitlog_pb2.ListTopicsResponse:
        if request.topic:
            config = self.engine.topics.get(request.topic)
            return commitlog_pb2.ListTopicsResponse(topics=[] if config is None else [topic_config_to_proto(config)])
        return commitlog_pb2.ListTopicsResponse(
            topics=[topic_config_to_proto(c) for c in self.engine.topics.list()])

    # -- streams -----------------------------------------------------------------------------
    @asynccontextmanager
    async def _stream_slot(self) -> AsyncIterator[None]:
        if self._open_streams >= self._max_streams:
            raise ResourceExhaustedError(f"{self._max_streams} Tail/AppendStream calls are already open on this "
                                         "server: close idle ones or retry later")
        self._open_streams += 1
        try:
            yield
        finally:
            self._open_streams -= 1


class _AppendStream:
    """One AppendStream call, pipelined so a slow flush never stalls the reading of requests.

    A reader task takes requests off the wire while the call's own coroutine appends whatever has
    arrived with one all-or-nothing engine call (in a thread; one call at a time, so the log keeps
    the stream's order) and sends the acks in order. At most STREAM_MAX_UNACKED messages are read
    and not yet acknowledged; beyond that the reader stops reading (and HTTP/2 flow control slows the
    producer). A bad message ends the stream with its 0-based sequence number after the acks of every
    message before it; nothing after it is written.
    """

    def __init__(self, servicer: CommitLogServicer, requests: AsyncIterable[commitlog_pb2.AppendRequest],
                 context: Context) -> None:
        self._servicer = servicer
        self._requests = requests
        self._context = context
        self._peer = context.peer()
        self._arrived: list[commitlog_pb2.AppendRequest] = []
        self._unacked = 0
        self._ended = False
        self._wakeup = asyncio.Event()  # requests arrived, the request stream ended, or the server is stopping
        self._room = asyncio.Event()  # acknowledgements made room below STREAM_MAX_UNACKED

    async def run(self) -> None:
        servicer = self._servicer
        servicer._stream_wakeups.add(self._wakeup)
        reader = asyncio.create_task(self._read(), name="append-stream-reader")
        seq = 0
        try:
            while True:
                if servicer.stopping:
                    raise UnavailableError(f"the commitlog service is stopping: message #{seq} of the stream and "
                                           "later were not appended; resend them once it is back")
                if self._arrived:
                    requests, self._arrived = self._arrived, []
                    seq = await self._append(seq, requests)
                elif self._ended:
                    return
                else:
                    self._wakeup.clear()
                    await self._wakeup.wait()
        finally:
            reader.cancel()
            servicer._stream_wakeups.discard(self._wakeup)

    async def _read(self) -> None:
        try:
            async for request in self._requests:
                self._arrived.append(request)
                self._unacked += 1
                self._wakeup.set()
                while self._unacked >= STREAM_MAX_UNACKED:
                    self._room.clear()
                    await self._room.wait()
        except Exception as exc:  # noqa: BLE001 - the call was cancelled or broke: nothing more to read
            log.debug("append stream from %s ended while reading: %s", self._peer, exc)
        finally:
            self._ended = True
            self._wakeup.set()

    async def _append(self, seq: int, requests: Sequence[commitlog_pb2.AppendRequest]) -> int:
        """Append, ack in order, abort on a failure; returns the sequence number of the next request."""
        messages, failure = self._messages(seq, requests)
        results: list[PutMessageResult] = []
        if messages:
            try:
                results = await self._servicer.put_messages(messages, sum([len(m.body) for m in messages]))
            except StoreError as exc:
                # Nothing was written; find the culprit one message at a time, acking those before it.
                # UNAVAILABLE is never a culprit's: the service stops, or (SYNC_MASTER) the batch was
                # written but not replicated, and a resend one by one would write it twice.
                if len(messages) == 1 or isinstance(exc, UnavailableError):
                    failure = _stream_failure(exc, seq)
                else:
                    results, culprit = await asyncio.to_thread(self._append_one_by_one, seq, messages)
                    failure = culprit or failure
        write = self._context.write
        for result in results:
            await write(append_result_to_proto(result))
        self._unacked -= len(requests)
        self._room.set()
        if failure is not None:
            raise failure
        return seq + len(requests)

    def _messages(self, seq: int,
                  requests: Sequence[commitlog_pb2.AppendRequest]) -> tuple[list[Message], CallFailed | None]:
        """The messages up to the first request without one or with one a producer may not send (and
        the failure it causes)."""
        messages: list[Message] = []
        for i, request in enumerate(requests):
            if not request.HasField("message"):
                return messages, CallFailed(grpc.StatusCode.INVALID_ARGUMENT,
                                            f"message #{seq + i} of the stream: AppendRequest.message is missing")
            try:
                messages.append(message_from_proto(request.message, self._peer))
            except StoreError as exc:
                return messages, _stream_failure(exc, seq + i)
        return messages, None

    def _append_one_by_one(self, seq: int,
                           messages: Sequence[Message]) -> tuple[list[PutMessageResult], CallFailed | None]:
        results: list[PutMessageResult] = []
        put = self._servicer._puts.put_messages
        for i, message in enumerate(messages):
            try:
                results.extend(put([message]))
            except StoreError as exc:
                return results, _stream_failure(exc, seq + i)
        return results, None
