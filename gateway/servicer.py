"""The public MessagingService: auth, routing and queue selection in front of the shards.

Requests are validated at the edge (names, ids, queue ids against the route) so that a bad call
never reaches a backend; the backends validate message contents themselves and their INVALID_ARGUMENT
details come back unchanged. Pull answers are relayed as bytes (see :mod:`gateway.shard`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc

from gateway import metrics, send_back
from gateway import transaction_relay as transactions
from gateway.admin import Admin
from gateway.auth import Action, AuthError, PermissionDeniedError, Principal, TokenTable
from gateway.groups import GroupDirectory
from gateway.message_finder import MessageFinder
from gateway.queue_selector import NoWritableQueueError, QueueSelector
from gateway.resilience import BackendError, RetryPolicy
from gateway.route import QueueRoute, RouteTable, TopicRoute
from gateway.send_batcher import SendBatcher
from gateway.settings import GatewaySettings
from gateway.shard import ShardClient
from gateway.uniq_key_maker import UniqKeyGenerator
from gateway.wire import (
    Context,
    Undecodable,
    check_pull_request,
    status_of,
    stream,
    topic_config_from_proto,
    unary,
)
from mqstore.v1 import admin_pb2, commitlog_pb2, common_pb2, gateway_pb2, groups_pb2, query_pb2, transaction_pb2
from services.server import tracing
from services.server.peer import peer_address
from services.server.status import CallFailed
from services.store.errors import (
    InvalidArgumentError,
    NotFoundError,
    OutOfRangeError,
    StoreError,
)
from services.store.formats.message import PROPERTY_SHARDING_KEY
from services.store.formats.message import PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX as UNIQ_KEY
from services.store.formats.message_id import check_message_id, message_id_kind
from services.store.rules.batch_codec import MAX_BATCH_MESSAGES, scan_blob, uniq_keys_of, with_uniq_keys
from services.store.rules.key_query import check_key_query
from services.store.rules.names import check_group, check_offset, check_queue, check_topic_name
from services.store.rules.producer_message import (
    check_batch_entry,
    check_producer_body,
    check_producer_message,
    check_producer_request,
)
from services.store.rules.topics import check_topic_config

log = logging.getLogger(__name__)

STREAM_WINDOW = 4096
#: Batches of one SendBatchStream being worked on at once (the proto's window).
BATCH_STREAM_WINDOW = 16
T = TypeVar("T")


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


# The wire contract with the commitlog (proto/mqstore/v1/commitlog.proto, AppendBatchRequest): the gateway
# forwards its clients' SendRequest / SendBatchRequest bytes as AppendBatchRequest bytes once these fields
# are cleared, and writes encoded_messages itself.
#: AppendBatchRequest.encoded_messages' tag (its field number, wire type 2: length-delimited).
_ENCODED_MESSAGES_TAG = _varint(
    commitlog_pb2.AppendBatchRequest.DESCRIPTOR.fields_by_name["encoded_messages"].number << 3 | 2)
def blob_append_request(head: commitlog_pb2.AppendBatchRequest, blob: bytes) -> bytes:
    """``head``'s bytes with ``blob`` as its encoded_messages: the small fields through protobuf, the
    blob appended by hand, one copy of it instead of two (into the message, then out of it)."""
    return b"".join((head.SerializeToString(), _ENCODED_MESSAGES_TAG, _varint(len(blob)), blob))


#: SendRequest's fields other than message (cleared before its bytes go to the commitlog).
_SEND_ONLY_FIELDS = ("sharding_key", "queue_id")
#: SendBatchRequest's fields other than messages (cleared before its bytes go to the commitlog).
_SEND_BATCH_ONLY_FIELDS = ("sharding_key", "queue_id", "topic", "encoded_messages", "born_timestamp", "born_host",
                           "sys_flag")


@dataclass(slots=True)
class PreparedBatch:
    """A batch that passed every check the gateway makes (``MessagingServicer._checked_batch``)."""

    request: gateway_pb2.SendBatchRequest
    topic: str
    count: int
    #: The blob to forward (with any UNIQ_KEYs the gateway added), or None for repeated messages.
    blob: bytes | None = None
    born_host: str = ""
    #: Blob: the gateway generated UNIQ_KEYs for some messages.
    generated: bool = False
    #: Repeated messages: every message's UNIQ_KEY.
    uniq_keys: list[str] | None = None

    def generated_msg_ids(self) -> list[str]:
        """Empty when every message came with its UNIQ_KEY; else every message's."""
        return self.all_uniq_keys() if self.generated else []

    def all_uniq_keys(self) -> list[str]:
        """Read back from the blob when needed (rare: DELAY messages, or keys the gateway added)."""
        if self.uniq_keys is None:
            assert self.blob is not None
            self.uniq_keys = uniq_keys_of(self.blob, MAX_BATCH_MESSAGES)
        return self.uniq_keys


class MessagingServicer:
    def __init__(self, settings: GatewaySettings, shards: Sequence[ShardClient], routes: RouteTable,
                 selector: QueueSelector, tokens: TokenTable, uniq_keys: UniqKeyGenerator) -> None:
        self.settings = settings
        self.shards = tuple(shards)
        self.routes = routes
        self.selector = selector
        self.tokens = tokens
        self.uniq_keys = uniq_keys
        self.retry = RetryPolicy(settings.retry_attempts, settings.retry_initial_backoff_ms / 1000,
                                 settings.retry_max_backoff_ms / 1000)
        self._backend_timeout_s = settings.backend_timeout_ms / 1000
        # Topics being created on every shard right now (an entry lives only during its creation).
        self._creating: set[str] = set()
        self._batchers = [SendBatcher(shard, self._backend_timeout_s) for shard in self.shards]
        self.finder = MessageFinder(self.shards, self.retry)
        self.transactions = transactions.Transactions(self.shards, routes, self.finder)
        self.groups = GroupDirectory(self.shards, routes, self.retry, tokens)
        self.admin = Admin(self.shards)

    def stopping(self) -> None:
        """The server is stopping: end the streams that never end by themselves (transaction checks)."""
        self.transactions.stopping()

    async def close(self) -> None:
        await self.transactions.close()
        await self.admin.close()
        for batcher in self._batchers:
            await batcher.close()

    # -- the edge: who is calling, how long they wait, which route ------------------------------------

    def _principal(self, context: Context) -> Principal:
        cached: Principal | None = getattr(context, "authenticated", None)  # an in-process caller, verified once
        if cached is not None:
            return cached
        metadata = context.invocation_metadata() if self.tokens.enabled else None
        principal = self.tokens.authenticate(metadata)  # type: ignore[arg-type]  # grpc-stubs: Metadata
        if hasattr(context, "authenticated"):
            context.authenticated = principal
        return principal

    def _timeout(self, context: Context, extra_s: float = 0.0) -> float:
        """The backend deadline: ours, plus any wait the request asks for, within the caller's own."""
        timeout = self._backend_timeout_s + extra_s
        remaining = context.time_remaining()
        if remaining is not None:
            timeout = min(timeout, max(remaining - 0.005, 0.001))
        return timeout

    async def _route(self, topic: str) -> TopicRoute:
        route = await self.routes.route(topic)
        if route is None:
            raise NotFoundError(f"topic {topic!r} does not exist on any shard: create it (mqstore topics create) "
                                "or send to it first")
        return route

    async def _route_for_send(self, topic: str, context: Context) -> TopicRoute:
        """An unknown topic gets a provisional route (RocketMQ's producer sends by the default topic's
        route): the commitlog creates the topic with the first *valid* message, so a rejected send
        creates nothing. :meth:`_created` then adds it to the other shards. Nothing is remembered per
        topic: the route says it is provisional (a set of such topics grew with every name a refused
        send used, issue 17)."""
        route = await self.routes.route(topic, fresh_on_miss=True)
        if route is not None:
            return route
        if not self.settings.auto_create_topic:
            raise NotFoundError(f"topic {topic!r} does not exist and auto-create is off: create it first "
                                "(mqstore topics create)")
        nums = self.settings.default_topic_queue_nums
        config = common_pb2.TopicConfig(topic=topic, read_queue_nums=nums, write_queue_nums=nums, perm=6)
        return TopicRoute.build(topic, [(shard, config) for shard in self.shards], provisional=True)

    async def _created(self, topic: str, context: Context, stored_on: Collection[str] = ()) -> None:
        """After a send under a provisional route: the topic now exists on one shard; create it on all
        (once for concurrent first sends; the route table is read again afterwards). ``stored_on``: the
        shards that stored the send, which created the topic there: not asked again, so a first send
        makes no ALREADY_EXISTS call (an error span in every trace of a first send)."""
        if topic in self._creating:
            return
        self._creating.add(topic)
        try:
            nums = self.settings.default_topic_queue_nums
            config = common_pb2.TopicConfig(topic=topic, read_queue_nums=nums, write_queue_nums=nums, perm=6)
            await self._create_on_shards(config, context, tolerate_existing=True, skip=stored_on)
        finally:
            self._creating.discard(topic)

    @staticmethod
    def _queue(route: TopicRoute, queue_id: int) -> QueueRoute:
        if not 0 <= queue_id < len(route.queues):
            raise OutOfRangeError(f"queue id {queue_id} is out of range for topic {route.topic!r}: its route has "
                                  f"{len(route.queues)} queues (0..{len(route.queues) - 1}); see GetRoute")
        return route.queues[queue_id]

    # -- sends ----------------------------------------------------------------------------------------

    def _prepare(self, message: common_pb2.Message, born_host: str, sharding_key: str = "") -> str:
        """The message's UNIQ_KEY, added when the producer gave none (with the born host's ip, as the
        producer's client would); the born host is the producer's address, not the gateway's. A send's
        sharding key is kept as the message's RocketMQ 5 message group (``__SHARDINGKEY``), unless it
        names one itself, so v2 FIFO consumers see the order the key gives."""
        if not message.born_host:
            message.born_host = born_host
        properties = message.properties
        if sharding_key and PROPERTY_SHARDING_KEY not in properties:
            properties[PROPERTY_SHARDING_KEY] = sharding_key
        uniq_key: str = properties.get(UNIQ_KEY, "")
        if not uniq_key:
            uniq_key = properties[UNIQ_KEY] = self.uniq_keys.next(message.born_host)
        return uniq_key

    async def _append(self, route: TopicRoute, sharding_key: str, explicit: int | None,
                      send: Callable[[QueueRoute], Awaitable[T]]) -> tuple[QueueRoute, T]:
        """One send with the selector's choice, retried (elsewhere when possible) only if nothing was written."""
        failed_shard: str | None = None
        faults = self.selector.faults if self.selector.latency_aware else None

        async def attempt() -> tuple[QueueRoute, T]:
            nonlocal failed_shard
            queue = self.selector.select(route, sharding_key, explicit, failed_shard)
            started = time.monotonic()
            try:
                result = await send(queue)
            except BackendError as exc:
                if exc.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                                grpc.StatusCode.RESOURCE_EXHAUSTED):
                    failed_shard = queue.shard.name
                    if faults is not None:
                        faults.record(queue.shard.name, time.monotonic() - started, failed=True)
                raise
            if faults is not None:
                faults.record(queue.shard.name, time.monotonic() - started, failed=False)
            return queue, result

        return await self.retry.send(attempt)

    async def _send_route(self, principal: Principal, request: gateway_pb2.SendRequest,
                          context: Context) -> tuple[TopicRoute, int | None]:
        """The edge checks of one message to send, then its route and its explicit queue (if any)."""
        message = request.message
        check_topic_name(message.topic)
        _check_body(message, None)
        _check_producer_fields(message, None)
        self.tokens.authorize(principal, Action.PRODUCE, message.topic)
        route = await self._route_for_send(message.topic, context)
        return route, self._explicit_queue(route, request.HasField("queue_id"), request.queue_id)

    def _explicit_queue(self, route: TopicRoute, has_queue: bool, queue_id: int) -> int | None:
        if not has_queue:
            return None
        queue = self._queue(route, queue_id)
        if not queue.writable:
            raise InvalidArgumentError(f"queue {queue_id} of topic {route.topic!r} is not writable")
        return queue_id

    @staticmethod
    def _result(result: commitlog_pb2.AppendResult, queue: QueueRoute, topic: str, uniq_key: str,
                make: Callable[..., gateway_pb2.SendResult] = gateway_pb2.SendResult) -> gateway_pb2.SendResult:
        """``make``: the SendResult constructor, or a repeated field's ``add`` (built in place: a result
        built alone would be copied again when appended to an answer)."""
        # A DELAY message is stored under SCHEDULE_TOPIC_XXXX: its queue id is the store's, not a route's.
        queue_id = result.queue_id + queue.base if result.topic == topic else result.queue_id
        # msg_id: the deprecated alias of uniq_key, filled as it always was.
        return make(status=result.status, uniq_key=uniq_key, msg_id=uniq_key, offset_msg_id=result.msg_id,
                    topic=result.topic, queue_id=queue_id, queue_offset=result.queue_offset,
                    store_timestamp=result.store_timestamp, shard=queue.shard.name)

    @unary
    async def Send(self, request: gateway_pb2.SendRequest, context: Context) -> gateway_pb2.SendResult:
        message = request.message
        topic = message.topic
        route, explicit = await self._send_route(self._principal(context), request, context)
        sharding_key = request.sharding_key
        uniq_key = self._prepare(message, _peer_host(context), sharding_key)
        if tracing.ENABLED:
            tracing.annotate({"messaging.system": tracing.MESSAGING_SYSTEM, "messaging.destination.name": topic,
                              "messaging.message.id": uniq_key})
        if transactions.is_transactional(message):
            return await self._send_half(route, sharding_key, explicit, uniq_key, message, context)
        for name in _SEND_ONLY_FIELDS:
            request.ClearField(name)

        async def send(queue: QueueRoute) -> commitlog_pb2.AppendResult:
            message.queue_id = queue.shard_queue_id
            # SendRequest minus its routing fields is one entry of an AppendBatchRequest on the wire.
            result = await self._batchers[queue.shard.index].send(request.SerializeToString())
            if result.status == commitlog_pb2.PUT_MESSAGE_STATUS_FLUSH_DISK_TIMEOUT:
                raise BackendError(grpc.StatusCode.DEADLINE_EXCEEDED,
                                   f"FLUSH_DISK_TIMEOUT: the message was written to {queue.shard.name} but its flush "
                                   "did not finish within syncFlushTimeout; a power loss may lose it")
            return result

        queue, result = await self._append(route, sharding_key, explicit, send)
        if route.provisional:
            await self._created(topic, context, (queue.shard.name,))
        metrics.SENT_MESSAGES.inc()
        return self._result(result, queue, topic, uniq_key)

    @unary
    async def SendBatch(self, request: gateway_pb2.SendBatchRequest,
                        context: Context) -> gateway_pb2.SendBatchResponse:
        batch = self._checked_batch(self._principal(context), request, _peer_host(context))
        return await self._store_batch(batch, context)

    def _checked_batch(self, principal: Principal, request: gateway_pb2.SendBatchRequest,
                       peer_host: str) -> PreparedBatch:
        """Every check of a batch that needs no backend (the whole blob in one pass), and the UNIQ_KEYs
        of messages that came without one."""
        blob = request.encoded_messages
        if blob or request.topic:
            if request.messages:
                raise InvalidArgumentError("the batch has both messages and encoded_messages: send one form")
            topic = request.topic
            check_topic_name(topic)
            check_producer_request(topic, request.sys_flag, request.born_timestamp)
            if not blob:
                raise InvalidArgumentError("encoded_messages is empty: give at least one message")
            scan = scan_blob(blob, MAX_BATCH_MESSAGES, request.sys_flag)
            self.tokens.authorize(principal, Action.PRODUCE, topic)
            born_host = request.born_host or peer_host
            missing = {e.index: self.uniq_keys.next(born_host) for e in scan.missing}
            if missing:
                blob = with_uniq_keys(blob, scan.missing, missing)
            return PreparedBatch(request, topic, scan.count, blob, born_host, bool(missing))
        messages = request.messages
        if not messages:
            raise InvalidArgumentError("the batch is empty: give at least one message")
        if request.born_timestamp or request.born_host or request.sys_flag:
            raise InvalidArgumentError("born_timestamp, born_host and sys_flag of SendBatchRequest go with "
                                       "encoded_messages: with messages, set them on each message")
        if len(messages) > MAX_BATCH_MESSAGES:
            raise InvalidArgumentError(f"the batch has {len(messages)} messages; at most {MAX_BATCH_MESSAGES}")
        topic = messages[0].topic
        check_topic_name(topic)
        for i, message in enumerate(messages):
            # The rules a blob entry follows (check_batch_entry), with the request-wide ones per message.
            check_producer_request(message.topic, message.sys_flag, message.born_timestamp, i)
            check_batch_entry(message.properties, message.flag, message.body, message.sys_flag, i,
                              message.reconsume_times, message.prepared_transaction_offset)
            if message.topic != topic:
                raise InvalidArgumentError(f"message #{i} has topic {message.topic!r} but the batch's topic is "
                                           f"{topic!r}: a batch goes to one topic")
        self.tokens.authorize(principal, Action.PRODUCE, topic)
        uniq_keys = [self._prepare(m, peer_host, request.sharding_key) for m in messages]
        return PreparedBatch(request, topic, len(messages), uniq_keys=uniq_keys)

    async def _store_batch(self, batch: PreparedBatch, context: Context) -> gateway_pb2.SendBatchResponse:
        """A checked batch to the shard of its queue (retried elsewhere when nothing was written)."""
        request, topic = batch.request, batch.topic
        route = await self._route_for_send(topic, context)
        explicit = self._explicit_queue(route, request.HasField("queue_id"), request.queue_id)
        sharding_key = request.sharding_key
        timeout = self._timeout(context)
        blob = batch.blob
        if blob is None:
            # Without its other fields a SendBatchRequest is an AppendBatchRequest (field 1, messages).
            for name in _SEND_BATCH_ONLY_FIELDS:
                request.ClearField(name)

        async def send(queue: QueueRoute) -> commitlog_pb2.AppendBatchResponse:
            if blob is not None:
                data = blob_append_request(commitlog_pb2.AppendBatchRequest(
                    topic=topic, queue_id=queue.shard_queue_id, born_timestamp=request.born_timestamp,
                    born_host=batch.born_host, sys_flag=request.sys_flag), blob)
            else:
                shard_queue_id = queue.shard_queue_id
                for message in request.messages:
                    message.queue_id = shard_queue_id
                data = request.SerializeToString()
            return await queue.shard.on_commitlog(queue.shard.append_batch_bytes, data, timeout)

        queue, response = await self._append(route, sharding_key, explicit, send)
        if route.provisional:
            await self._created(topic, context, (queue.shard.name,))
        metrics.SENT_MESSAGES.inc(batch.count)
        answer = gateway_pb2.SendBatchResponse()
        if response.HasField("receipt"):
            r, uniq_keys = response.receipt, batch.generated_msg_ids()
            answer.receipt.MergeFrom(gateway_pb2.SendBatchReceipt(
                status=r.status, topic=topic, queue_id=queue.queue_id, shard=queue.shard.name,
                offset_msg_id_prefix=r.offset_msg_id_prefix, store_timestamp=r.store_timestamp,
                first_queue_offset=r.first_queue_offset, commitlog_offsets=r.commitlog_offsets,
                uniq_keys=uniq_keys, msg_ids=uniq_keys))
            return answer
        result, add = self._result, answer.results.add
        for r, uniq_key in zip(response.results, batch.all_uniq_keys(), strict=True):
            result(r, queue, topic, uniq_key, add)
        return answer

    @stream
    async def SendBatchStream(self, request_iterator: AsyncIterator[gateway_pb2.SendBatchRequest],
                              context: Context) -> AsyncIterator[gateway_pb2.SendBatchResponse]:
        """Pipelined batches. The reader checks each batch as it arrives (so a bad one stops the reading
        before any batch after it is sent on) and starts its append; up to BATCH_STREAM_WINDOW are in
        flight, answered in stream order. Batches with a sharding key or queue id wait for the stream's
        previous batch with the same one, so they keep their order on that queue."""
        started = time.perf_counter()
        principal = self._principal(context)
        window: asyncio.Queue[asyncio.Task[gateway_pb2.SendBatchResponse] | Exception | None] = \
            asyncio.Queue(BATCH_STREAM_WINDOW)
        reader = asyncio.create_task(self._read_batches(principal, request_iterator, window, context))
        sequence = 0
        try:
            while True:
                item = await window.get()
                if item is None:
                    break
                try:
                    if isinstance(item, Exception):
                        raise item
                    response = await item
                except (StoreError, BackendError, AuthError, NoWritableQueueError) as exc:
                    code, details = status_of(exc) or (grpc.StatusCode.INTERNAL, str(exc))
                    metrics.observe_call("SendBatchStream", code.name, time.perf_counter() - started)
                    raise CallFailed(code, f"batch #{sequence} of the stream: {details} (every batch before it "
                                           "was stored; none after it was sent on by a check that failed)") from None
                sequence += 1
                yield response
            if reader.done() and reader.exception() is not None:
                raise reader.exception()  # type: ignore[misc]
            metrics.observe_call("SendBatchStream", "OK", time.perf_counter() - started)
        finally:
            reader.cancel()
            while not window.empty():
                item = window.get_nowait()
                if isinstance(item, asyncio.Task):
                    item.cancel()

    async def _read_batches(self, principal: Principal,
                            request_iterator: AsyncIterator[gateway_pb2.SendBatchRequest],
                            window: asyncio.Queue[asyncio.Task[gateway_pb2.SendBatchResponse] | Exception | None],
                            context: Context) -> None:
        peer_host = _peer_host(context)
        ordered: dict[tuple[str, str, int | None], asyncio.Task[gateway_pb2.SendBatchResponse]] = {}
        try:
            async for request in request_iterator:
                try:
                    if type(request) is Undecodable:
                        raise InvalidArgumentError(request.reason)
                    batch = self._checked_batch(principal, request, peer_host)
                except (StoreError, AuthError) as exc:
                    await window.put(exc)
                    return
                key = None
                if request.sharding_key or request.HasField("queue_id"):
                    key = (batch.topic, request.sharding_key, request.queue_id if request.HasField("queue_id")
                           else None)
                task = asyncio.create_task(self._store_in_turn(batch, context, ordered.get(key) if key else None))
                if key is not None:
                    ordered[key] = task
                    if len(ordered) > 4 * BATCH_STREAM_WINDOW:
                        ordered = {k: t for k, t in ordered.items() if not t.done()}
                await window.put(task)
        finally:
            await window.put(None)

    async def _store_in_turn(self, batch: PreparedBatch, context: Context,
                             previous: asyncio.Task[gateway_pb2.SendBatchResponse] | None
                             ) -> gateway_pb2.SendBatchResponse:
        if previous is not None:
            await asyncio.wait((previous,))
            if previous.cancelled() or previous.exception() is not None:
                raise BackendError(grpc.StatusCode.ABORTED, "an earlier batch of the stream to the same queue failed: "
                                                            "nothing of this one was sent")
        return await self._store_batch(batch, context)

    @stream
    async def SendStream(self, request_iterator: AsyncIterator[gateway_pb2.SendRequest],
                         context: Context) -> AsyncIterator[gateway_pb2.SendResult]:
        """Whatever has arrived is appended as one batch per shard, so a pipelining client gets group
        appends without asking for them. A bad message ends the stream naming its sequence number;
        every message before it was acknowledged."""
        started = time.perf_counter()
        principal = self._principal(context)
        pending: asyncio.Queue[gateway_pb2.SendRequest | None] = asyncio.Queue(STREAM_WINDOW)
        reader = asyncio.create_task(self._read_stream(request_iterator, pending))
        sequence = 0
        try:
            done = False
            while not done:
                first = await pending.get()
                if first is None:
                    break
                group = [first]
                while len(group) < MAX_BATCH_MESSAGES and not pending.empty():
                    item = pending.get_nowait()
                    if item is None:
                        done = True
                        break
                    group.append(item)
                results, error = await self._send_group(principal, group, sequence, context)
                sequence += len(results)
                metrics.SENT_MESSAGES.inc(len(results))
                for result in results:
                    yield result
                if error is not None:
                    code, details = error
                    metrics.observe_call("SendStream", code.name, time.perf_counter() - started)
                    raise CallFailed(code, f"{details} (every message before it was stored, none after)")
            if reader.done() and reader.exception() is not None:
                raise reader.exception()  # type: ignore[misc]
            metrics.observe_call("SendStream", "OK", time.perf_counter() - started)
        finally:
            reader.cancel()

    @staticmethod
    async def _read_stream(request_iterator: AsyncIterator[gateway_pb2.SendRequest],
                           pending: asyncio.Queue[gateway_pb2.SendRequest | None]) -> None:
        try:
            async for request in request_iterator:
                await pending.put(request)
        finally:
            await pending.put(None)

    async def _send_group(self, principal: Principal, group: list[gateway_pb2.SendRequest], sequence: int,
                          context: Context) -> tuple[list[gateway_pb2.SendResult], tuple[grpc.StatusCode, str] | None]:
        """Appends a group of stream requests, one AppendBatch per run that goes to the same shard, in
        stream order. Returns the results of the messages stored and the error that stopped the
        stream, naming the first bad message by its stream sequence number (``sequence`` is the
        group's first)."""
        picks: list[tuple[QueueRoute, str, str]] = []
        provisional: set[str] = set()
        born_host = _peer_host(context)
        error: tuple[grpc.StatusCode, str] | None = None
        for i, request in enumerate(group):
            try:
                if type(request) is Undecodable:
                    raise InvalidArgumentError(request.reason)
                message = request.message
                topic = message.topic
                transactions.refuse_in_batch(message, None)
                route, explicit = await self._send_route(principal, request, context)
                queue = self.selector.select(route, request.sharding_key, explicit)
                if route.provisional:
                    provisional.add(topic)
            except (StoreError, BackendError, AuthError, NoWritableQueueError) as exc:
                code, details = status_of(exc) or (grpc.StatusCode.INTERNAL, str(exc))
                error = code, f"message #{sequence + i} of the stream: {details}"
                group = group[:i]  # the ones before it are still stored
                break
            message.queue_id = queue.shard_queue_id
            picks.append((queue, topic, self._prepare(message, born_host, request.sharding_key)))
            for name in _SEND_ONLY_FIELDS:
                request.ClearField(name)
        results, append_error = await self._append_runs(picks, group, sequence, self._timeout(context))
        for topic in provisional & {topic for _, topic, _ in picks[:len(results)]}:
            # stored under a provisional route: it exists now (on the shards that stored it)
            await self._created(topic, context, {q.shard.name for q, t, _ in picks[:len(results)] if t == topic})
        return results, append_error or error

    async def _append_runs(self, picks: list[tuple[QueueRoute, str, str]], group: list[gateway_pb2.SendRequest],
                           sequence: int, timeout: float
                           ) -> tuple[list[gateway_pb2.SendResult], tuple[grpc.StatusCode, str] | None]:
        """One AppendBatch per run of ``group`` that goes to the same shard, in stream order: the results
        of the messages stored, and the error that stopped the runs."""
        results: list[gateway_pb2.SendResult] = []
        start = 0
        while start < len(group):
            shard = picks[start][0].shard
            end = start
            while end < len(group) and picks[end][0].shard is shard:
                end += 1
            # Each SendRequest minus its routing fields is one field-1 entry of an AppendBatchRequest.
            try:
                response = await self._append_run(shard, group[start:end], timeout)
            except BackendError as exc:
                bad = exc.refused
                if exc.code == grpc.StatusCode.INVALID_ARGUMENT and bad is not None and 0 < bad.index < end - start:
                    # A batch is all or nothing: store the good ones before the bad one, as a stream promises.
                    end = start + bad.index
                    try:
                        response = await self._append_run(shard, group[start:end], timeout)
                    except BackendError as again:
                        exc = again
                    else:
                        results.extend(self._result(r, queue, topic, uniq_key) for (queue, topic, uniq_key), r
                                       in zip(picks[start:end], response.results, strict=True))
                        return results, (exc.code, _renumber(exc, sequence + start))
                return results, (exc.code, _renumber(exc, sequence + start, end - start))
            for (queue, topic, uniq_key), r in zip(picks[start:end], response.results, strict=True):
                results.append(self._result(r, queue, topic, uniq_key))
            start = end
        return results, None

    async def _append_run(self, shard: ShardClient, requests: list[gateway_pb2.SendRequest],
                          timeout: float) -> commitlog_pb2.AppendBatchResponse:
        # Each SendRequest minus its routing fields is one field-1 entry of an AppendBatchRequest.
        data = b"".join([r.SerializeToString() for r in requests])
        return await self.retry.send(functools.partial(shard.on_commitlog, shard.append_batch_bytes, data, timeout))

    # -- reads ----------------------------------------------------------------------------------------

    async def _readable_queue(self, context: Context, topic: str, queue_id: int) -> QueueRoute:
        principal = self._principal(context)
        check_queue(topic, queue_id)
        self.tokens.authorize(principal, Action.CONSUME, topic)
        return self._queue(await self._route(topic), queue_id)

    @unary
    async def Pull(self, request: query_pb2.PullMessageRequest, context: Context) -> Any:
        check_pull_request(request)  # every bound, before any backend call
        if tracing.ENABLED:
            tracing.annotate({"messaging.system": tracing.MESSAGING_SYSTEM,
                              "messaging.destination.name": request.topic,
                              "messaging.destination.partition.id": str(request.queue_id)})
        queue = await self._readable_queue(context, request.topic, request.queue_id)
        request.queue_id = queue.shard_queue_id
        timeout = self._timeout(context, request.long_poll_ms / 1000)
        shard = queue.shard
        data: bytes = await self.retry.read(lambda: shard.pull(request, timeout))
        metrics.PULLED_BYTES.inc(len(data))
        if not queue.base or request.raw_records:
            # A raw answer's records keep the shard's queue id: the client uses the one it asked for.
            return data
        response = query_pb2.PullMessageResponse.FromString(data)
        for message in response.messages:
            message.queue_id += queue.base
        return response

    async def _on_queue(self, context: Context, request: Any, method: str) -> Any:
        """A per-queue read (or idempotent offset commit) on the queue's shard: its route queue id
        becomes the shard's for the call."""
        queue = await self._readable_queue(context, request.topic, request.queue_id)
        request.queue_id = queue.shard_queue_id
        shard, timeout = queue.shard, self._timeout(context)
        call = getattr(shard.query, method)
        return await self.retry.read(lambda: shard.on_query(call, request, timeout))

    @unary
    async def SearchOffset(self, request: query_pb2.SearchOffsetRequest,
                           context: Context) -> query_pb2.SearchOffsetResponse:
        check_offset("timestamp", request.timestamp)
        return await self._on_queue(context, request, "SearchOffset")

    @unary
    async def GetQueueOffsets(self, request: query_pb2.GetQueueOffsetRangeRequest,
                              context: Context) -> query_pb2.QueueOffsetRange:
        route_queue_id = request.queue_id
        response = await self._on_queue(context, request, "GetQueueOffsetRange")
        response.queue_id = route_queue_id
        return response

    @unary
    async def CommitOffset(self, request: query_pb2.UpdateConsumerOffsetRequest,
                           context: Context) -> query_pb2.UpdateConsumerOffsetResponse:
        check_group(request.consumer_group)
        check_offset("offset", request.offset)
        return await self._on_queue(context, request, "UpdateConsumerOffset")

    @unary
    async def QueryOffset(self, request: query_pb2.QueryConsumerOffsetRequest,
                          context: Context) -> query_pb2.QueryConsumerOffsetResponse:
        check_group(request.consumer_group)
        return await self._on_queue(context, request, "QueryConsumerOffset")

    @unary
    async def QueryByKey(self, request: query_pb2.QueryMessageRequest,
                         context: Context) -> query_pb2.QueryMessageResponse:
        principal = self._principal(context)
        check_key_query(request.topic, request.key, request.begin_timestamp, request.end_timestamp, request.max_num)
        self.tokens.authorize(principal, Action.CONSUME, request.topic)
        route = await self._route(request.topic)
        bases = route.bases
        timeout = self._timeout(context)

        async def ask(shard: ShardClient) -> query_pb2.QueryMessageResponse:
            return await self.retry.read(lambda: shard.on_query(shard.query.QueryMessage, request, timeout))

        if len(bases) == 1:
            # One shard (the common case): its answer as it is, without a task per shard (gather's).
            ((shard, base),) = bases.items()
            if not base:
                return await ask(shard)
            answers = [await ask(shard)]
        else:
            answers = await asyncio.gather(*(ask(shard) for shard in bases))
        merged = query_pb2.QueryMessageResponse()
        found: list[query_pb2.StoredMessage] = []
        for base, answer in zip(bases.values(), answers, strict=True):
            for message in answer.messages:
                if message.topic == request.topic:
                    message.queue_id += base
                found.append(message)
            merged.index_hits += answer.index_hits
            merged.index_last_update_timestamp = max(merged.index_last_update_timestamp,
                                                     answer.index_last_update_timestamp)
        max_num = request.max_num or 32
        found.sort(key=lambda m: (m.store_timestamp, m.commitlog_offset))
        merged.messages.extend(found[-max_num:])
        return merged

    @unary
    async def GetMessage(self, request: query_pb2.ViewMessageRequest,
                         context: Context) -> query_pb2.ViewMessageResponse:
        principal = self._principal(context)
        msg_id = request.msg_id.strip()
        if not msg_id:
            raise InvalidArgumentError("msg_id is empty: give an offset msg id or a UNIQ_KEY")
        check_message_id(msg_id, message_id_kind(request.kind))
        if request.topic:
            check_topic_name(request.topic)
            self.tokens.authorize(principal, Action.CONSUME, request.topic)
        response, shard = await self.finder.find(request, msg_id, self._timeout(context))
        self.tokens.authorize(principal, Action.CONSUME, response.message.topic)
        route = await self.routes.route(response.message.topic)
        if route is not None:
            base = route.bases.get(shard, 0)
            if base:
                response.message.queue_id += base
        return response

    @unary
    async def ConsumerSendBack(self, request: gateway_pb2.ConsumerSendBackRequest,
                               context: Context) -> gateway_pb2.ConsumerSendBackResult:
        """Consumer retry / dead letter (:mod:`gateway.send_back`): the consumed copy read as GetMessage
        reads it, the new record appended with ``group_flow`` to the group topic's queue."""
        principal = self._principal(context)
        group, msg_id = request.group, request.msg_id.strip()
        limit = request.max_reconsume_times if request.HasField("max_reconsume_times") else None
        times = request.reconsume_times if request.HasField("reconsume_times") else None
        send_back.check_send_back(group, msg_id, request.delay_level, limit, times)
        if request.topic:
            check_topic_name(request.topic)
        await self.groups.authorize_group(principal, group, self._timeout(context))
        view = query_pb2.ViewMessageRequest(msg_id=msg_id, topic=request.topic)
        found, _ = await self.finder.find(view, msg_id, self._timeout(context))
        stored = found.message
        self.tokens.authorize(principal, Action.CONSUME, send_back.original_topic(stored))
        plan = send_back.plan_send_back(stored, group, request.delay_level, limit, times)
        route = await self.routes.route(plan.target_topic)
        if route is None:
            config = common_pb2.TopicConfig(topic=plan.target_topic, read_queue_nums=send_back.GROUP_TOPIC_QUEUES,
                                            write_queue_nums=send_back.GROUP_TOPIC_QUEUES,
                                            perm=send_back.GROUP_TOPIC_PERM)
            await self._create_on_shards(config, context, tolerate_existing=True)
            route = await self._route(plan.target_topic)
        message = plan.message
        timeout = self._timeout(context)

        async def send(queue: QueueRoute) -> commitlog_pb2.AppendResult:
            message.queue_id = queue.shard_queue_id
            append = commitlog_pb2.AppendRequest(message=message, group_flow=True)
            return await queue.shard.on_commitlog(queue.shard.commitlog.Append, append, timeout)

        queue, result = await self._append(route, "", None, send)
        metrics.SENT_MESSAGES.inc()
        uniq_key = message.properties.get(UNIQ_KEY, "") or result.msg_id
        return gateway_pb2.ConsumerSendBackResult(
            send=self._result(result, queue, plan.target_topic, uniq_key), target_topic=plan.target_topic,
            dead_letter=plan.dead_letter, reconsume_times=message.reconsume_times, delay_level=plan.delay_level,
            origin_msg_id=plan.origin_msg_id)

    # -- consumer groups (gateway/groups.py) -----------------------------------------------------------

    @unary
    async def Heartbeat(self, request: groups_pb2.HeartbeatRequest,
                        context: Context) -> groups_pb2.HeartbeatResponse:
        return await self.groups.heartbeat(self._principal(context), request, self._timeout(context))

    @unary
    async def UnregisterConsumer(self, request: groups_pb2.UnregisterConsumerRequest,
                                 context: Context) -> groups_pb2.UnregisterConsumerResponse:
        return await self.groups.unregister(self._principal(context), request, self._timeout(context))

    @unary
    async def DescribeGroups(self, request: groups_pb2.DescribeGroupsRequest,
                             context: Context) -> groups_pb2.DescribeGroupsResponse:
        return await self.groups.describe(self._principal(context), request, self._timeout(context))

    # -- transactions (gateway/transaction_relay.py) ------------------------------------------------------

    async def _send_half(self, route: TopicRoute, sharding_key: str, explicit: int | None, uniq_key: str,
                         message: common_pb2.Message, context: Context) -> gateway_pb2.SendResult:
        queue, result = await transactions.send_half(self._append, route, sharding_key, explicit, message,
                                                     self._timeout(context))
        if route.provisional:
            await self._created(message.topic, context)
        metrics.SENT_MESSAGES.inc()
        return self._result(result, queue, message.topic, uniq_key)

    async def _end_transaction(self, principal: Principal, request: transaction_pb2.EndTransactionRequest,
                               context: Context) -> gateway_pb2.EndTransactionResult:
        return await self.transactions.end(
            request, lambda topic: self.tokens.authorize(principal, Action.PRODUCE, topic), self._timeout(context))

    @unary
    async def EndTransaction(self, request: transaction_pb2.EndTransactionRequest,
                             context: Context) -> gateway_pb2.EndTransactionResult:
        return await self._end_transaction(self._principal(context), request, context)

    @stream
    async def TransactionChecks(self, request_iterator: AsyncIterator[transaction_pb2.TransactionCheckStreamRequest],
                                context: Context) -> AsyncIterator[transaction_pb2.TransactionCheck]:
        principal = self._principal(context)
        # A check carries the half's body: the relay hands this stream only checks of topics its token
        # may produce to (transactions.CheckReceiver).
        async for check in self.transactions.checks(
                request_iterator, principal, lambda answer: self._end_transaction(principal, answer, context)):
            yield check

    # -- topics ---------------------------------------------------------------------------------------

    async def _create_on_shards(self, config: common_pb2.TopicConfig, context: Context,
                                tolerate_existing: bool, skip: Collection[str] = ()) -> int:
        """Creates the topic on every shard that lacks it (``skip``: names of shards known to have it);
        returns how many already had it."""
        timeout = self._timeout(context)
        request = commitlog_pb2.TopicRequest(topic=config)
        existing = 0
        created: list[tuple[ShardClient, common_pb2.TopicConfig]] = []
        try:
            for shard in self.shards:
                if shard.name in skip:
                    existing += 1
                    continue
                try:
                    created.append((shard, await self.retry.read(functools.partial(
                        shard.on_commitlog, shard.commitlog.CreateTopic, request, timeout))))
                except BackendError as exc:
                    if exc.code != grpc.StatusCode.ALREADY_EXISTS:
                        raise
                    existing += 1
        finally:
            if existing == 0 and len(created) == len(self.shards):
                self.routes.changed(config.topic, created)  # every shard answered with its config
            else:
                self.routes.invalidate()  # some shards had it (with their own counts) or one failed
        if existing == len(self.shards) and not tolerate_existing:
            raise BackendError(grpc.StatusCode.ALREADY_EXISTS,
                               f"topic {config.topic!r} already exists: use UpdateTopic to change it")
        return existing

    def _admin(self, context: Context, config: common_pb2.TopicConfig) -> None:
        principal = self._principal(context)
        check_topic_config(topic_config_from_proto(config))
        self.tokens.authorize(principal, Action.ADMIN, config.topic)

    @unary
    async def CreateTopic(self, request: commitlog_pb2.TopicRequest,
                          context: Context) -> common_pb2.TopicConfig:
        self._admin(context, request.topic)
        await self._create_on_shards(request.topic, context, tolerate_existing=False)
        return request.topic

    @unary
    async def UpdateTopic(self, request: commitlog_pb2.TopicRequest,
                          context: Context) -> common_pb2.TopicConfig:
        self._admin(context, request.topic)
        route = await self._route(request.topic.topic)
        timeout = self._timeout(context)
        updated = request.topic
        answers: list[tuple[ShardClient, common_pb2.TopicConfig]] = []
        try:
            for shard in dict.fromkeys(q.shard for q in route.queues):
                updated = await self.retry.read(
                    functools.partial(shard.on_commitlog, shard.commitlog.UpdateTopic, request, timeout))
                answers.append((shard, updated))
        except BaseException:
            self.routes.invalidate()
            raise
        self.routes.changed(request.topic.topic, answers)
        return updated

    @unary
    async def DeleteTopic(self, request: admin_pb2.DeleteTopicRequest,
                          context: Context) -> admin_pb2.DeleteTopicResponse:
        self.tokens.authorize(self._principal(context), Action.ADMIN, request.topic)
        try:
            response = await self.admin.delete_topic(request.topic, self._timeout(context))
        except BaseException:
            self.routes.invalidate()
            raise
        self.routes.changed(request.topic, ())
        return response

    @unary
    async def GetClusterStatus(self, request: admin_pb2.GetClusterStatusRequest,
                               context: Context) -> admin_pb2.ClusterStatus:
        self._principal(context)  # any token may look
        return await self.admin.cluster_status(self._timeout(context))

    @unary
    async def ListTopics(self, request: commitlog_pb2.ListTopicsRequest,
                         context: Context) -> commitlog_pb2.ListTopicsResponse:
        principal = self._principal(context)
        await self.routes.refresh()
        response = commitlog_pb2.ListTopicsResponse()
        for topic, pairs in sorted(self.routes.configs().items()):
            if not (principal.may(Action.CONSUME, topic) or principal.may(Action.PRODUCE, topic)):
                continue
            response.topics.add(topic=topic, read_queue_nums=sum(c.read_queue_nums for _, c in pairs),
                                write_queue_nums=sum(c.write_queue_nums for _, c in pairs), perm=pairs[0][1].perm)
        return response

    @unary
    async def GetRoute(self, request: gateway_pb2.GetRouteRequest,
                       context: Context) -> gateway_pb2.TopicRoute:
        principal = self._principal(context)
        check_topic_name(request.topic)
        if not (principal.may(Action.CONSUME, request.topic) or principal.may(Action.PRODUCE, request.topic)):
            raise PermissionDeniedError(f"token {principal.name!r} may neither produce to nor consume from topic "
                                        f"{request.topic!r}")
        return _route_proto(await self._route(request.topic))

    @unary
    async def GetRouteToProduce(self, request: gateway_pb2.GetRouteRequest,
                                context: Context) -> gateway_pb2.TopicRoute:
        """The route a producer sends by (in process, for protocols whose producers look a route up before
        their first send): the topic's, or for a topic that does not exist yet the provisional route of
        :meth:`_route_for_send` (same auto-create setting, default queue count and permission as a first
        Send, which then creates the topic; nothing is created here)."""
        principal = self._principal(context)
        check_topic_name(request.topic)
        if not principal.may(Action.PRODUCE, request.topic):
            raise PermissionDeniedError(f"token {principal.name!r} may not produce to topic {request.topic!r}")
        return _route_proto(await self._route_for_send(request.topic, context))


def _route_proto(route: TopicRoute) -> gateway_pb2.TopicRoute:
    return gateway_pb2.TopicRoute(topic=route.topic, queues=[
        gateway_pb2.QueueRoute(queue_id=q.queue_id, shard=q.shard.name, shard_queue_id=q.shard_queue_id,
                               writable=q.writable, readable=q.readable) for q in route.queues])


def _check_body(message: common_pb2.Message, index: int | None) -> None:
    check_producer_body(message.body, message.sys_flag, index)


def _check_producer_fields(message: common_pb2.Message, index: int | None) -> None:
    check_producer_message(message.topic, message.properties, message.flag, message.sys_flag,
                           message.born_timestamp, message.reconsume_times, message.prepared_transaction_offset, index)


def _peer_host(context: Context) -> str:
    return peer_address(context.peer() or "")


def _renumber(exc: BackendError, offset: int, count: int = 0) -> str:
    """A batch error as the stream names its message: by its sequence number, ``offset`` being the
    batch's first (a batch of one names no position: its only message is meant)."""
    refused = exc.refused
    if refused is not None:
        return f"message #{refused.index + offset} of the stream: {refused.error}"
    if count == 1:
        return f"message #{offset} of the stream: {exc.details}"
    return exc.details
