"""apache.rocketmq.v2.MessagingService on the gateway: RocketMQ 5's clients against mqstore.

Each RPC is answered with the protocol's own status (``Status{code, message}`` inside the response:
OK = 20000, BAD_REQUEST = 40000, TOPIC_NOT_FOUND = 40402, ...); mqstore's details, which say what to
fix, are the message. Calls go to the gateway's mqstore.v1 handlers in process (local_call.py), so
routes, tokens, queue selection, UNIQ_KEYs, timers, transactions and the retry/dead-letter topics
are mqstore's. Receive with invisible durations: inflight.py. Message mapping: messages.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf import timestamp_pb2

from mqstore.apache.rocketmq.v2 import definition_pb2, service_pb2
from mqstore.gateway.resilience import BackendError
from mqstore.gateway.rocketmq5 import status as st
from mqstore.gateway.rocketmq5.checks import CheckRelay
from mqstore.gateway.rocketmq5.inflight import DEFAULT_MAX_DELIVERY_ATTEMPTS, BadReceiptHandle, QueueLease, Receipt
from mqstore.gateway.rocketmq5.local_call import LocalContext, MqstoreCallError, call
from mqstore.gateway.rocketmq5.messages import SHARDING_KEY, V2_PRODUCER_GROUP, BadMessage, to_mqstore, to_v2
from mqstore.gateway.wire import Undecodable
from mqstore.services.store.record import largest_body_always_stored
from mqstore.v1 import gateway_pb2, groups_pb2, query_pb2, transaction_pb2

if TYPE_CHECKING:
    from mqstore.gateway.servicer import MessagingServicer

log = logging.getLogger("mqstore.gateway.rocketmq5")
Code = definition_pb2.Code
Context = grpc.aio.ServicerContext[Any, Any]
MIB = 1024 * 1024
#: RocketMQ's default maxMessageSize, the limit of a whole record: what the gateway assumes of a shard
#: whose commitlog cannot be asked.
DEFAULT_MAX_MESSAGE_SIZE = 4 * MIB
STORE_INFO_TIMEOUT_S = 5.0
DEFAULT_INVISIBLE_S = 30.0
#: RocketMQ's proxy takes 10 s at least; 1 s here, so short tests and short tasks work.
MIN_INVISIBLE_S = 1.0
MAX_INVISIBLE_S = 12 * 3600.0
DEFAULT_LONG_POLL_S = 20.0
MAX_LONG_POLL_S = 30.0
MAX_BATCH = 1024
#: Acks commit their group's offset at most this often per queue (then within this time).
COMMIT_INTERVAL_S = 0.2
COMMIT_TIMEOUT_S = 10.0
#: RocketMQ 5 clients heartbeat every 10 s.
HEARTBEAT_INTERVAL_MS = 10_000
#: RocketMQ's retry delays of consumer groups (messageDelayLevel from level 3 on: "1s 5s 10s 30s 1m 2m 3m 4m
#: 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"), in seconds.
RETRY_DELAYS_S = [1, 5, 10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200]
ACCEPTED_TYPES = [definition_pb2.MessageType.NORMAL, definition_pb2.MessageType.FIFO,
                  definition_pb2.MessageType.DELAY, definition_pb2.MessageType.TRANSACTION]


class RocketMQ5Servicer:
    """The v2 MessagingService over one gateway process's mqstore.v1 servicer."""

    def __init__(self, mq: MessagingServicer, max_delivery_attempts: int = DEFAULT_MAX_DELIVERY_ATTEMPTS) -> None:
        self.mq = mq
        self._max_body_bytes: int | None = None
        self.max_delivery_attempts = max_delivery_attempts
        self._leases: dict[tuple[str, str, int], QueueLease] = {}
        self._lease_lock = asyncio.Lock()
        self.checks = CheckRelay(mq)
        self._changed = asyncio.Event()
        #: client id -> (consumer group, subscribed topics), from the consumers' settings.
        self._subscribers: dict[str, tuple[str, set[str]]] = {}
        self._dirty: dict[tuple[str, str, int], LocalContext] = {}
        self._flusher: asyncio.Task[None] | None = None

    # -- the edge ------------------------------------------------------------------------------------
    @staticmethod
    def _local(context: Context, timeout_s: float | None = None) -> LocalContext:
        remaining = context.time_remaining()
        if timeout_s is None or (remaining is not None and remaining < timeout_s):
            timeout_s = remaining
        return LocalContext(tuple(context.invocation_metadata() or ()), context.peer() or "", timeout_s)

    async def _route(self, topic: str, context: Context) -> gateway_pb2.TopicRoute:
        return await call(self.mq.GetRoute, gateway_pb2.GetRouteRequest(topic=topic), self._local(context))

    async def max_body_bytes(self) -> int:
        """The largest body every shard stores whatever the message's topic and properties (each
        store's maxMessageSize limits the whole record): what the settings advertise as max_body_size
        and what a send is held to. Learned from the shards' commitlogs once."""
        if self._max_body_bytes is None:
            sizes = []
            for shard in self.mq.shards:
                if shard.max_message_size is None:
                    with contextlib.suppress(BackendError):
                        await shard.learn_store_host(STORE_INFO_TIMEOUT_S)
                sizes.append(shard.max_message_size)
            if None in sizes:  # a shard that could not say: assumed the default, and asked again next time
                return largest_body_always_stored(min(s or DEFAULT_MAX_MESSAGE_SIZE for s in sizes))
            self._max_body_bytes = largest_body_always_stored(min(s for s in sizes if s is not None))
        return self._max_body_bytes

    # -- routes, clients -----------------------------------------------------------------------------
    async def QueryRoute(self, request: service_pb2.QueryRouteRequest, context: Context
                         ) -> service_pb2.QueryRouteResponse:
        if not request.topic.name:
            return service_pb2.QueryRouteResponse(status=st.status(Code.ILLEGAL_TOPIC, "the topic name is empty"))
        if not request.endpoints.addresses:
            return service_pb2.QueryRouteResponse(status=st.status(
                Code.ILLEGAL_ACCESS_POINT, "QueryRouteRequest.endpoints is empty: send the address you reached "
                "the gateway at (its route lists that address)"))
        try:
            route = await self._route(request.topic.name, context)
        except MqstoreCallError as exc:
            if exc.code != grpc.StatusCode.NOT_FOUND:
                return service_pb2.QueryRouteResponse(status=st.of_error(exc))
            try:  # a producer's first look at a new topic: the route its first send creates the topic by
                route = await call(self.mq.GetRouteToProduce, gateway_pb2.GetRouteRequest(topic=request.topic.name),
                                   self._local(context))
            except MqstoreCallError:
                return service_pb2.QueryRouteResponse(status=st.of_error(exc))
        broker = definition_pb2.Broker(name="mqstore", id=0, endpoints=request.endpoints)
        queues = [definition_pb2.MessageQueue(topic=request.topic, id=q.queue_id, permission=_permission(q),
                                              broker=broker, accept_message_types=ACCEPTED_TYPES)
                  for q in route.queues]
        return service_pb2.QueryRouteResponse(status=st.ok(), message_queues=queues)

    async def Heartbeat(self, request: service_pb2.HeartbeatRequest, context: Context
                        ) -> service_pb2.HeartbeatResponse:
        """A consumer's heartbeat makes it a member of its group in mqstore (``mqstore groups``), with the
        topics its settings subscribe to; producers' heartbeats are only answered."""
        client_id = _client_id(context)
        subscribed = self._subscribers.get(client_id)
        if not request.group.name or subscribed is None or subscribed[0] != request.group.name:
            return service_pb2.HeartbeatResponse(status=st.ok())
        beat = groups_pb2.HeartbeatRequest(group=request.group.name, client_id=client_id, topics=sorted(subscribed[1]),
                                           allocation_strategy="pop", rebalance_interval_ms=HEARTBEAT_INTERVAL_MS)
        try:
            await call(self.mq.Heartbeat, beat, self._local(context))
        except MqstoreCallError as exc:
            return service_pb2.HeartbeatResponse(status=st.of_error(exc))
        return service_pb2.HeartbeatResponse(status=st.ok())

    async def NotifyClientTermination(self, request: service_pb2.NotifyClientTerminationRequest,
                                      context: Context) -> service_pb2.NotifyClientTerminationResponse:
        client_id = _client_id(context)
        subscribed = self._subscribers.pop(client_id, None)
        if subscribed is not None:
            leave = groups_pb2.UnregisterConsumerRequest(group=subscribed[0], client_id=client_id)
            try:
                await call(self.mq.UnregisterConsumer, leave, self._local(context))
            except MqstoreCallError as exc:
                if exc.code != grpc.StatusCode.NOT_FOUND:
                    return service_pb2.NotifyClientTerminationResponse(status=st.of_error(exc))
        return service_pb2.NotifyClientTerminationResponse(status=st.ok())

    async def Telemetry(self, requests: AsyncIterator[service_pb2.TelemetryCommand], context: Context
                        ) -> AsyncIterator[service_pb2.TelemetryCommand]:
        """The settings stream: each Settings the client sends is answered with the server's (clients
        do not start before the first answer). A producer's stream also carries the transaction checks
        of its topics (checks.py). Other commands (stack traces, verify results) are taken and ignored."""
        outbox: asyncio.Queue[service_pb2.TelemetryCommand | None] = asyncio.Queue(maxsize=1024)
        client_id = _client_id(context)

        async def read() -> None:
            try:
                async for command in requests:
                    if isinstance(command, Undecodable):
                        await outbox.put(service_pb2.TelemetryCommand(status=st.status(Code.BAD_REQUEST,
                                                                                       command.reason)))
                        continue
                    if not command.HasField("settings"):
                        continue
                    settings = self._settings(command.settings, await self.max_body_bytes())
                    await outbox.put(service_pb2.TelemetryCommand(status=st.ok(), settings=settings))
                    if command.settings.WhichOneof("pub_sub") == "subscription" and client_id:
                        sub = command.settings.subscription
                        self._subscribers[client_id] = (sub.group.name, {e.topic.name for e in sub.subscriptions})
                    if command.settings.WhichOneof("pub_sub") == "publishing":
                        topics = {t.name for t in command.settings.publishing.topics}
                        self.checks.join(outbox, topics, self._local(context))
            finally:
                await outbox.put(None)

        reader = asyncio.get_running_loop().create_task(read())
        try:
            while (item := await outbox.get()) is not None:
                yield item
        finally:
            reader.cancel()
            self.checks.leave(outbox)
            self._subscribers.pop(client_id, None)

    def _settings(self, client: definition_pb2.Settings, max_body_bytes: int) -> definition_pb2.Settings:
        """The server's settings for a client: its own, with the limits and retry policy of mqstore.
        Producers retry sends with exponential backoff; consumers get RocketMQ's retry delays (the
        delay levels 1s 5s 10s 30s 1m 2m ...) and the group's max delivery attempts, after which the
        gateway moves a message to %DLQ%<group>."""
        settings = definition_pb2.Settings()
        settings.CopyFrom(client)
        backoff = settings.backoff_policy
        backoff.Clear()
        backoff.max_attempts = self.max_delivery_attempts
        if client.WhichOneof("pub_sub") == "subscription":
            for level_s in RETRY_DELAYS_S[:max(self.max_delivery_attempts, 1)]:
                backoff.customized_backoff.next.add().FromSeconds(level_s)
            sub = settings.subscription
            if not sub.HasField("fifo"):
                sub.fifo = False
            if not sub.receive_batch_size:
                sub.receive_batch_size = 32
            if not sub.HasField("long_polling_timeout"):
                sub.long_polling_timeout.FromSeconds(int(DEFAULT_LONG_POLL_S))
        else:
            backoff.max_attempts = 3
            backoff.exponential_backoff.initial.FromMilliseconds(10)
            backoff.exponential_backoff.max.FromMilliseconds(1000)
            backoff.exponential_backoff.multiplier = 2.0
            if client.WhichOneof("pub_sub") == "publishing":
                settings.publishing.max_body_size = max_body_bytes
                settings.publishing.validate_message_type = False
        return settings

    # -- producing -----------------------------------------------------------------------------------
    async def SendMessage(self, request: service_pb2.SendMessageRequest, context: Context
                          ) -> service_pb2.SendMessageResponse:
        if not request.messages:
            return service_pb2.SendMessageResponse(status=st.status(Code.BAD_REQUEST, "no messages to send"))
        entries = []
        first_failure = None
        for message in request.messages:
            entry = await self._send_one(message, context)
            if entry.status.code != Code.OK and first_failure is None:
                first_failure = entry.status
            entries.append(entry)
        return service_pb2.SendMessageResponse(status=first_failure or st.ok(), entries=entries)

    async def _send_one(self, message: definition_pb2.Message, context: Context) -> service_pb2.SendResultEntry:
        try:
            stored, sharding_key = to_mqstore(message, await self.max_body_bytes())
        except BadMessage as exc:
            code = Code.MESSAGE_BODY_TOO_LARGE if "allowed" in str(exc) else Code.BAD_REQUEST
            return service_pb2.SendResultEntry(status=st.status(code, str(exc)))
        try:
            result = await call(self.mq.Send, gateway_pb2.SendRequest(message=stored, sharding_key=sharding_key),
                                self._local(context))
        except MqstoreCallError as exc:
            return service_pb2.SendResultEntry(status=st.of_error(exc))
        transactional = message.system_properties.message_type == definition_pb2.MessageType.TRANSACTION
        return service_pb2.SendResultEntry(status=st.ok(), message_id=result.msg_id, offset=result.queue_offset,
                                           transaction_id=result.offset_msg_id if transactional else "")

    async def EndTransaction(self, request: service_pb2.EndTransactionRequest, context: Context
                             ) -> service_pb2.EndTransactionResponse:
        """transaction_id is the half's offset msg id (the send answered it), message_id its UNIQ_KEY."""
        resolution = {definition_pb2.TransactionResolution.COMMIT: transaction_pb2.COMMIT,
                      definition_pb2.TransactionResolution.ROLLBACK: transaction_pb2.ROLLBACK}.get(request.resolution)
        if resolution is None:
            return service_pb2.EndTransactionResponse(status=st.status(
                Code.BAD_REQUEST, "resolution must be COMMIT or ROLLBACK"))
        if not request.transaction_id or not request.message_id:
            return service_pb2.EndTransactionResponse(status=st.status(
                Code.INVALID_TRANSACTION_ID, "give the message_id and transaction_id the half's send answered"))
        end = transaction_pb2.EndTransactionRequest(
            producer_group=V2_PRODUCER_GROUP, transaction_id=request.message_id,
            offset_msg_id=request.transaction_id, resolution=resolution,
            from_transaction_check=request.source == definition_pb2.TransactionSource.SOURCE_SERVER_CHECK)
        try:
            await call(self.mq.EndTransaction, end, self._local(context))
        except MqstoreCallError as exc:
            if exc.code in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT):
                return service_pb2.EndTransactionResponse(status=st.status(Code.INVALID_TRANSACTION_ID, exc.details))
            return service_pb2.EndTransactionResponse(status=st.of_error(exc))
        return service_pb2.EndTransactionResponse(status=st.ok())

    # -- consuming -----------------------------------------------------------------------------------
    async def QueryAssignment(self, request: service_pb2.QueryAssignmentRequest, context: Context
                              ) -> service_pb2.QueryAssignmentResponse:
        """One assignment per topic (queue id -1, as RocketMQ's proxy answers for pop consumption): a
        receive takes from every readable queue of the topic."""
        if not request.group.name:
            return service_pb2.QueryAssignmentResponse(status=st.status(Code.ILLEGAL_CONSUMER_GROUP,
                                                                        "the consumer group is empty"))
        try:
            route = await self._route(request.topic.name, context)
        except MqstoreCallError as exc:
            return service_pb2.QueryAssignmentResponse(status=st.of_error(exc))
        if not any(q.readable for q in route.queues):
            return service_pb2.QueryAssignmentResponse(status=st.status(
                Code.FORBIDDEN, f"topic {request.topic.name!r} has no readable queue"))
        queue = definition_pb2.MessageQueue(
            topic=request.topic, id=-1, permission=definition_pb2.Permission.READ_WRITE,
            broker=definition_pb2.Broker(name="mqstore", id=0, endpoints=request.endpoints),
            accept_message_types=ACCEPTED_TYPES)
        return service_pb2.QueryAssignmentResponse(status=st.ok(),
                                                   assignments=[definition_pb2.Assignment(message_queue=queue)])

    async def ReceiveMessage(self, request: service_pb2.ReceiveMessageRequest, context: Context
                             ) -> AsyncIterator[service_pb2.ReceiveMessageResponse]:
        group, topic = request.group.name, request.message_queue.topic
        problem = _receive_problem(request)
        if problem is not None:
            yield service_pb2.ReceiveMessageResponse(status=problem)
            return
        invisible_s = (request.invisible_duration.ToMilliseconds() / 1000 if request.HasField("invisible_duration")
                       else DEFAULT_INVISIBLE_S)
        wait_s = (request.long_polling_timeout.ToMilliseconds() / 1000 if request.HasField("long_polling_timeout")
                  else DEFAULT_LONG_POLL_S)
        remaining = context.time_remaining()
        wait_s = min(wait_s, MAX_LONG_POLL_S, max((remaining or wait_s) - 1.0, 0.0))
        subscription = request.filter_expression.expression.strip() or "*"
        deadline = time.monotonic() + wait_s
        try:
            route = await self._route(topic.name, context)
            while True:
                found = await self._take(group, topic, route, request.batch_size or 32, invisible_s,
                                         subscription, context)
                if found or time.monotonic() >= deadline:
                    break
                await self._wait(group, topic.name, route, deadline - time.monotonic(), subscription, context)
        except MqstoreCallError as exc:
            yield service_pb2.ReceiveMessageResponse(status=st.of_error(exc))
            return
        if not found:
            yield service_pb2.ReceiveMessageResponse(status=st.status(Code.MESSAGE_NOT_FOUND, "no new message"))
            return
        delivered = timestamp_pb2.Timestamp()
        delivered.GetCurrentTime()
        yield service_pb2.ReceiveMessageResponse(delivery_timestamp=delivered)  # clients time their latency by it
        for message in found:
            yield service_pb2.ReceiveMessageResponse(message=message)
        yield service_pb2.ReceiveMessageResponse(status=st.ok())

    async def _wait(self, group: str, topic: str, route: gateway_pb2.TopicRoute, wait_s: float, subscription: str,
                    context: Context) -> None:
        """Wait (at most ``wait_s``) until a receive may find something: a message arrives in a queue
        (mqstore's long-polling pulls, one per queue the group waits on), an in-flight message becomes
        visible again, or the group acks or changes a message (which may unblock a FIFO group)."""
        changed = self._changed
        now = time.monotonic()
        leases = [self._leases.get((group, topic, q.queue_id)) for q in route.queues if q.readable]
        for lease in leases:
            for delivery in lease.inflight.values() if lease is not None else ():
                wait_s = min(wait_s, delivery.visible_at - now)
        if wait_s <= 0:
            return
        waits: list[asyncio.Future[Any]] = [asyncio.ensure_future(changed.wait())]
        for lease in leases:
            if lease is None or lease.fifo_blocked:
                continue
            pull = query_pb2.PullMessageRequest(topic=topic, queue_id=lease.queue_id, queue_offset=lease.next_offset,
                                                max_messages=1, subscription=subscription,
                                                long_poll_ms=max(int(wait_s * 1000), 1))
            waits.append(asyncio.ensure_future(call(self.mq.Pull, pull, self._local(context, wait_s + 1.0))))
        done, pending = await asyncio.wait(waits, timeout=wait_s, return_when=asyncio.FIRST_COMPLETED)
        for waiting in pending:
            waiting.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for finished in done:
            finished.exception()  # taken: an error shows in the next look at the queues

    def _notify_change(self) -> None:
        """Wake the receives waiting for an ack or a change of invisible duration."""
        self._changed.set()
        self._changed = asyncio.Event()

    async def _lease(self, group: str, topic: str, queue_id: int, context: Context) -> QueueLease:
        key = (group, topic, queue_id)
        lease = self._leases.get(key)
        if lease is not None:
            return lease
        async with self._lease_lock:
            lease = self._leases.get(key)
            if lease is None:
                start = await self._start_offset(group, topic, queue_id, context)
                lease = self._leases[key] = QueueLease(queue_id, start)
        return lease

    async def _start_offset(self, group: str, topic: str, queue_id: int, context: Context) -> int:
        """The group's committed offset; a new group starts at the queue's min offset (it sees what was
        sent before it first received: nothing acknowledged to a producer is skipped)."""
        try:
            answer = await call(self.mq.QueryOffset, query_pb2.QueryConsumerOffsetRequest(
                consumer_group=group, topic=topic, queue_id=queue_id), self._local(context))
            return int(answer.offset)
        except MqstoreCallError as exc:
            if exc.code != grpc.StatusCode.NOT_FOUND:
                raise
        offsets = await call(self.mq.GetQueueOffsets, query_pb2.GetQueueOffsetRangeRequest(
            topic=topic, queue_id=queue_id), self._local(context))
        return int(offsets.min_offset)

    async def _take(self, group: str, topic: definition_pb2.Resource, route: gateway_pb2.TopicRoute, batch: int,
                    invisible_s: float, subscription: str, context: Context) -> list[definition_pb2.Message]:
        """Up to ``batch`` messages of the topic's readable queues: in-flight ones visible again first
        (or to the dead-letter topic after the group's max attempts), then new ones."""
        out: list[definition_pb2.Message] = []
        invisible_ms = int(invisible_s * 1000)
        for queue in route.queues:
            if len(out) >= batch or not queue.readable:
                continue
            lease = await self._lease(group, topic.name, queue.queue_id, context)
            async with lease.lock:
                for offset, delivery in lease.expired(time.monotonic()):
                    if len(out) >= batch:
                        break
                    if delivery.attempts >= self.max_delivery_attempts:
                        await self._dead_letter(group, topic.name, delivery.message, context)
                        del lease.inflight[offset]
                        continue
                    receipt, attempts = lease.hand_out(offset, delivery.message, invisible_s, delivery.group_key)
                    out.append(to_v2(delivery.message, topic, queue.queue_id, receipt.encode(), invisible_ms,
                                     delivery.message.reconsume_times + attempts))
                if len(out) < batch:
                    await self._take_new(lease, topic, batch - len(out), invisible_s, subscription, out, context)
                await self._commit(group, topic.name, lease, context)
        return out

    async def _take_new(self, lease: QueueLease, topic: definition_pb2.Resource, wanted: int, invisible_s: float,
                        subscription: str, out: list[definition_pb2.Message], context: Context) -> None:
        pull = query_pb2.PullMessageRequest(topic=topic.name, queue_id=lease.queue_id,
                                            queue_offset=lease.next_offset, max_messages=min(wanted, 32),
                                            subscription=subscription)
        answer = await call(self.mq.Pull, pull, self._local(context, 10.0), query_pb2.PullMessageResponse)
        next_offset = answer.next_begin_offset if answer.next_begin_offset else lease.next_offset
        lease.fifo_blocked = False
        for stored in answer.messages:
            group_key = stored.properties.get(SHARDING_KEY)
            if lease.blocked(group_key, stored.queue_offset):
                next_offset = stored.queue_offset  # FIFO: its group's earlier message is still in flight
                lease.fifo_blocked = True
                break
            receipt, attempts = lease.hand_out(stored.queue_offset, stored, invisible_s, group_key)
            out.append(to_v2(stored, topic, lease.queue_id, receipt.encode(), int(invisible_s * 1000),
                             stored.reconsume_times + attempts))
        lease.next_offset = max(lease.next_offset, next_offset)

    async def _commit(self, group: str, topic: str, lease: QueueLease, context: Context, soon: bool = False) -> None:
        """Commit the group's offset of this queue (the lowest in flight). ``soon``: within COMMIT_INTERVAL_S
        rather than at once when the queue was committed less than that ago (acks come one per call:
        a commit each would bound a consumer to a few hundred acks a second). An offset not yet
        committed when the gateway stops only delivers its acked messages again (at least once)."""
        committed = lease.committed
        if committed == lease.stored_offset:
            return
        if soon and time.monotonic() - lease.committed_at < COMMIT_INTERVAL_S:
            self._dirty[(group, topic, lease.queue_id)] = self._local(context)
            if self._flusher is None or self._flusher.done():
                self._flusher = asyncio.get_running_loop().create_task(self._flush_later(), name="rocketmq5-commits")
            return
        await self._commit_now(group, topic, lease, committed, self._local(context))

    async def _commit_now(self, group: str, topic: str, lease: QueueLease, committed: int, local: LocalContext) -> None:
        await call(self.mq.CommitOffset, query_pb2.UpdateConsumerOffsetRequest(
            consumer_group=group, topic=topic, queue_id=lease.queue_id, offset=committed), local)
        lease.stored_offset = committed
        lease.committed_at = time.monotonic()

    async def _flush_later(self) -> None:
        while self._dirty:
            await asyncio.sleep(COMMIT_INTERVAL_S)
            dirty, self._dirty = self._dirty, {}
            for (group, topic, queue_id), local in dirty.items():
                lease = self._leases[(group, topic, queue_id)]
                async with lease.lock:
                    if lease.committed == lease.stored_offset:
                        continue
                    try:
                        await self._commit_now(group, topic, lease, lease.committed, local.renewed(COMMIT_TIMEOUT_S))
                    except MqstoreCallError as exc:
                        log.warning("committing %s's offset of %s queue %d: %s (retried with the next ack)",
                                    group, topic, queue_id, exc)

    async def _dead_letter(self, group: str, topic: str, message: query_pb2.StoredMessage, context: Context) -> None:
        await call(self.mq.ConsumerSendBack, gateway_pb2.ConsumerSendBackRequest(
            group=group, msg_id=message.msg_id, delay_level=-1, topic=topic), self._local(context))

    async def _delivery(self, group: str, topic: str, handle: str, context: Context
                        ) -> tuple[QueueLease, Receipt]:
        receipt = Receipt.decode(handle)
        lease = self._leases.get((group, topic, receipt.queue_id))
        if lease is None:
            raise BadReceiptHandle(f"receipt handle {handle!r}: group {group!r} has received nothing from queue "
                                   f"{receipt.queue_id} of topic {topic!r} through this gateway process")
        return lease, receipt

    async def AckMessage(self, request: service_pb2.AckMessageRequest, context: Context
                         ) -> service_pb2.AckMessageResponse:
        entries = []
        first_failure = None
        for entry in request.entries:
            status = st.ok()
            try:
                lease, receipt = await self._delivery(request.group.name, request.topic.name, entry.receipt_handle,
                                                      context)
                async with lease.lock:
                    lease.ack(receipt)
                    self._notify_change()
                    await self._commit(request.group.name, request.topic.name, lease, context, soon=True)
            except BadReceiptHandle as exc:
                status = st.status(Code.INVALID_RECEIPT_HANDLE, str(exc))
            except MqstoreCallError as exc:
                status = st.of_error(exc)
            if status.code != Code.OK and first_failure is None:
                first_failure = status
            entries.append(service_pb2.AckMessageResultEntry(message_id=entry.message_id,
                                                             receipt_handle=entry.receipt_handle, status=status))
        return service_pb2.AckMessageResponse(status=first_failure or st.ok(), entries=entries)

    async def ChangeInvisibleDuration(self, request: service_pb2.ChangeInvisibleDurationRequest, context: Context
                                      ) -> service_pb2.ChangeInvisibleDurationResponse:
        seconds = request.invisible_duration.ToMilliseconds() / 1000
        if not 0 <= seconds <= MAX_INVISIBLE_S:
            return service_pb2.ChangeInvisibleDurationResponse(status=st.status(
                Code.ILLEGAL_INVISIBLE_TIME,
                f"invisible duration {seconds} s is not within 0..{MAX_INVISIBLE_S:.0f} s"))
        try:
            lease, receipt = await self._delivery(request.group.name, request.topic.name, request.receipt_handle,
                                                  context)
            async with lease.lock:
                renewed = lease.change_invisible(receipt, seconds)
                self._notify_change()
        except BadReceiptHandle as exc:
            return service_pb2.ChangeInvisibleDurationResponse(status=st.status(Code.INVALID_RECEIPT_HANDLE, str(exc)))
        return service_pb2.ChangeInvisibleDurationResponse(status=st.ok(), receipt_handle=renewed.encode())

    async def ForwardMessageToDeadLetterQueue(self, request: service_pb2.ForwardMessageToDeadLetterQueueRequest,
                                              context: Context) -> service_pb2.ForwardMessageToDeadLetterQueueResponse:
        """The message goes to %DLQ%<group> (mqstore's ConsumerSendBack with delay level -1) and counts
        as acked."""
        group, topic = request.group.name, request.topic.name
        try:
            lease, receipt = await self._delivery(group, topic, request.receipt_handle, context)
            async with lease.lock:
                delivery = lease.find(receipt)
                await self._dead_letter(group, topic, delivery.message, context)
                lease.ack(receipt)
                self._notify_change()
                await self._commit(group, topic, lease, context)
        except BadReceiptHandle as exc:
            return service_pb2.ForwardMessageToDeadLetterQueueResponse(
                status=st.status(Code.INVALID_RECEIPT_HANDLE, str(exc)))
        except MqstoreCallError as exc:
            return service_pb2.ForwardMessageToDeadLetterQueueResponse(
                status=st.of_error(exc, not_found=Code.MESSAGE_NOT_FOUND))
        return service_pb2.ForwardMessageToDeadLetterQueueResponse(status=st.ok())

    # -- not supported: answered NOT_IMPLEMENTED (50100) in the protocol's own way ---------------------
    @staticmethod
    def _not_implemented(what: str) -> definition_pb2.Status:
        return st.status(Code.NOT_IMPLEMENTED, f"{what} is not supported by mqstore's gateway (docs/rocketmq5.md)")

    async def PullMessage(self, request: service_pb2.PullMessageRequest, context: Context
                          ) -> AsyncIterator[service_pb2.PullMessageResponse]:
        yield service_pb2.PullMessageResponse(status=self._not_implemented("PullMessage (the PullConsumer)"))

    async def UpdateOffset(self, request: service_pb2.UpdateOffsetRequest, context: Context
                           ) -> service_pb2.UpdateOffsetResponse:
        return service_pb2.UpdateOffsetResponse(status=self._not_implemented("UpdateOffset (the PullConsumer)"))

    async def GetOffset(self, request: service_pb2.GetOffsetRequest, context: Context) -> service_pb2.GetOffsetResponse:
        return service_pb2.GetOffsetResponse(status=self._not_implemented("GetOffset (the PullConsumer)"))

    async def QueryOffset(self, request: service_pb2.QueryOffsetRequest, context: Context
                          ) -> service_pb2.QueryOffsetResponse:
        return service_pb2.QueryOffsetResponse(status=self._not_implemented("QueryOffset (the PullConsumer)"))

    async def RecallMessage(self, request: service_pb2.RecallMessageRequest, context: Context
                            ) -> service_pb2.RecallMessageResponse:
        return service_pb2.RecallMessageResponse(status=self._not_implemented("RecallMessage"))

    async def SyncLiteSubscription(self, request: service_pb2.SyncLiteSubscriptionRequest, context: Context
                                   ) -> service_pb2.SyncLiteSubscriptionResponse:
        return service_pb2.SyncLiteSubscriptionResponse(status=self._not_implemented("lite topics"))


def _client_id(context: Context) -> str:
    """The client's id (RocketMQ 5 clients send it as x-mq-client-id metadata), or ""."""
    for key, value in context.invocation_metadata() or ():
        if key == "x-mq-client-id":
            return value.decode() if isinstance(value, bytes) else str(value)
    return ""


def _permission(queue: gateway_pb2.QueueRoute) -> int:
    P = definition_pb2.Permission
    permissions: dict[tuple[bool, bool], int] = {(True, True): P.READ_WRITE, (True, False): P.READ,
                                                 (False, True): P.WRITE}
    return int(permissions.get((queue.readable, queue.writable), P.NONE))


def _receive_problem(request: service_pb2.ReceiveMessageRequest) -> definition_pb2.Status | None:
    """The status refusing a bad receive, or None."""
    if not request.group.name:
        return st.status(Code.ILLEGAL_CONSUMER_GROUP, "the consumer group is empty")
    if not request.message_queue.topic.name:
        return st.status(Code.ILLEGAL_TOPIC, "message_queue.topic is empty")
    if not 0 <= request.batch_size <= MAX_BATCH:
        return st.status(Code.BAD_REQUEST, f"batch_size {request.batch_size} is not within 1..{MAX_BATCH}")
    if request.HasField("invisible_duration"):
        seconds = request.invisible_duration.ToMilliseconds() / 1000
        if not MIN_INVISIBLE_S <= seconds <= MAX_INVISIBLE_S:
            return st.status(Code.ILLEGAL_INVISIBLE_TIME, f"invisible duration {seconds} s is not within "
                             f"{MIN_INVISIBLE_S:.0f}..{MAX_INVISIBLE_S:.0f} s")
    if request.filter_expression.type == definition_pb2.FilterType.SQL:
        return st.status(Code.ILLEGAL_FILTER_EXPRESSION, "SQL92 filters are not supported by mqstore: filter by "
                         "tag ('TagA || TagB')")
    return None
