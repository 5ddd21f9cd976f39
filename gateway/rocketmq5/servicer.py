"""apache.rocketmq.v2.MessagingService on the gateway: RocketMQ 5's clients against mqstore.

Each RPC is answered with the protocol's own status (``Status{code, message}`` inside the response:
OK = 20000, BAD_REQUEST = 40000, TOPIC_NOT_FOUND = 40402, ...); mqstore's details, which say what to
fix, are the message. Calls go to the gateway's mqstore.v1 handlers in process (local_call.py), so
routes, tokens, queue selection, UNIQ_KEYs, timers, transactions and the retry/dead-letter topics
are mqstore's. Receive with invisible durations: the shards' pop state (store_pop.py, inflight.py,
consumer_tasks.py). Message mapping: messages.py.
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

from apache.rocketmq.v2 import definition_pb2, service_pb2
from gateway.resilience import BackendError
from gateway.rocketmq5 import status as st
from gateway.rocketmq5.checks import CheckRelay
from gateway.rocketmq5.consumer_tasks import DeadLetterMover, renew_receipts
from gateway.rocketmq5.inflight import (
    DEFAULT_MAX_DELIVERY_ATTEMPTS,
    DEFAULT_RENEW_MAX_S,
    BadReceiptHandle,
    Receipt,
    Renewal,
    Renewals,
)
from gateway.rocketmq5.local_call import LocalContext, MqstoreCallError, call
from gateway.rocketmq5.messages import V2_PRODUCER_GROUP, BadMessage, to_mqstore, to_v2
from gateway.rocketmq5.store_pop import StorePop
from gateway.send_back import MAX_RECONSUME_TIMES_LIMIT
from gateway.wire import Undecodable
from mqstore.v1 import gateway_pb2, groups_pb2, query_pb2, transaction_pb2
from services.store.formats.record import largest_body_always_stored
from services.store.rules.batch_codec import MAX_BATCH_MESSAGES

if TYPE_CHECKING:
    from gateway.servicer import MessagingServicer

log = logging.getLogger("gateway.rocketmq5")
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
#: A receive waiting on a FIFO group blocked by a message in flight looks again this often: the ack that
#: unblocks it may come through another gateway process.
FIFO_RECHECK_S = 1.0
#: ForwardMessageToDeadLetterQueue keeps the message invisible this long while it moves it.
FORWARD_CLAIM_MS = 30_000
#: RocketMQ 5 clients heartbeat every 10 s.
HEARTBEAT_INTERVAL_MS = 10_000
#: RocketMQ's retry delays of consumer groups (messageDelayLevel from level 3 on: "1s 5s 10s 30s 1m 2m 3m 4m
#: 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"), in seconds.
RETRY_DELAYS_S = [1, 5, 10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200]
ACCEPTED_TYPES = [definition_pb2.MessageType.NORMAL, definition_pb2.MessageType.FIFO,
                  definition_pb2.MessageType.DELAY, definition_pb2.MessageType.TRANSACTION]


class RocketMQ5Servicer:
    """The v2 MessagingService over one gateway process's mqstore.v1 servicer."""

    def __init__(self, mq: MessagingServicer, max_delivery_attempts: int = DEFAULT_MAX_DELIVERY_ATTEMPTS,
                 default_invisible_s: float = DEFAULT_INVISIBLE_S, renew_max_s: float = DEFAULT_RENEW_MAX_S) -> None:
        self.mq = mq
        self._max_body_bytes: int | None = None
        self.max_delivery_attempts = max_delivery_attempts
        self.default_invisible_s = default_invisible_s
        self.checks = CheckRelay(mq)
        self._changed = asyncio.Event()
        #: client id -> (consumer group, subscribed topics), from the consumers' settings.
        self._subscribers: dict[str, tuple[str, set[str]]] = {}
        self.pop = StorePop(mq)
        self.dead_letters = DeadLetterMover(mq, self.pop, max_delivery_attempts)
        self.renewals = Renewals(renew_max_s)
        #: Push consumers whose telemetry stream is connected to this process (their receipts are renewed).
        self._push_clients: set[str] = set()
        self._background: list[asyncio.Task[None]] = []
        #: Every open Telemetry stream's outbox, and whether the server is stopping (see stopping()).
        self._outboxes: set[asyncio.Queue[service_pb2.TelemetryCommand | None]] = set()
        self._stopping = False

    def start(self) -> None:
        """Start the background work (on the running loop): dead letters, receipt renewals."""
        loop = asyncio.get_running_loop()
        self._background = [loop.create_task(self.dead_letters.run(), name="rocketmq5-dead-letters"),
                            loop.create_task(renew_receipts(self.renewals, self.pop), name="rocketmq5-renewals")]

    def stopping(self) -> None:
        """The server is stopping: end every Telemetry stream and long-polling receive now (clients
        reconnect to the next gateway), so the stop does not wait out the drain grace on streams that
        never end by themselves."""
        self._stopping = True
        for outbox in self._outboxes:
            with contextlib.suppress(asyncio.QueueFull):
                outbox.put_nowait(None)
        self._notify_change()

    async def close(self) -> None:
        for task in self._background:
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        self._background = []

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
        if self._stopping:
            return
        self._outboxes.add(outbox)

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
                        if command.settings.client_type == definition_pb2.ClientType.PUSH_CONSUMER:
                            self._push_clients.add(client_id)
                    if command.settings.WhichOneof("pub_sub") == "publishing":
                        topics = {t.name for t in command.settings.publishing.topics}
                        self.checks.join(outbox, topics, self._local(context))
            finally:
                await outbox.put(None)

        reader = asyncio.get_running_loop().create_task(read())
        try:
            while (item := await outbox.get()) is not None and not self._stopping:
                yield item
        finally:
            reader.cancel()
            self._outboxes.discard(outbox)
            self.checks.leave(outbox)
            self._subscribers.pop(client_id, None)
            self._push_clients.discard(client_id)
            self.renewals.drop_client(client_id)

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
        """Pops from the topic's readable queues (the shards keep what is in flight). A push consumer's
        receive asking for auto renewal (its telemetry stream connected here) gets its receipts renewed
        by this process until it acks, nacks or disconnects (consumer_tasks.renew_receipts)."""
        group, topic = request.group.name, request.message_queue.topic
        problem = _receive_problem(request)
        if problem is not None:
            yield service_pb2.ReceiveMessageResponse(status=problem)
            return
        invisible_s = (request.invisible_duration.ToMilliseconds() / 1000 if request.HasField("invisible_duration")
                       else self.default_invisible_s)
        wait_s = (request.long_polling_timeout.ToMilliseconds() / 1000 if request.HasField("long_polling_timeout")
                  else DEFAULT_LONG_POLL_S)
        remaining = context.time_remaining()
        wait_s = min(wait_s, MAX_LONG_POLL_S, max((remaining or wait_s) - 1.0, 0.0))
        subscription = request.filter_expression.expression.strip() or "*"
        deadline = time.monotonic() + wait_s
        client_id = _client_id(context)
        renew_for = client_id if request.auto_renew and client_id in self._push_clients else None
        local = self._local(context)  # one caller for every pop and renewal: authenticated once
        try:
            route = await self._route(topic.name, context)
            while True:
                found, looks = await self._take(group, topic, route, request.batch_size or 32, invisible_s,
                                                subscription, local, renew_for)
                if found or time.monotonic() >= deadline or self._stopping:
                    break
                await self._wait(topic.name, looks, deadline - time.monotonic(), subscription, context)
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

    async def _take(self, group: str, topic: definition_pb2.Resource, route: gateway_pb2.TopicRoute, batch: int,
                    invisible_s: float, subscription: str, local: LocalContext, renew_for: str | None
                    ) -> tuple[list[definition_pb2.Message], list[tuple[int, query_pb2.PopMessageResponse]]]:
        """Up to ``batch`` messages popped from the topic's readable queues (in-flight ones visible again
        first, then new ones), and what each queue's pop said of the queue (for a wait)."""
        out: list[definition_pb2.Message] = []
        looks: list[tuple[int, query_pb2.PopMessageResponse]] = []
        invisible_ms = int(invisible_s * 1000)
        for queue in route.queues:
            if len(out) >= batch or not queue.readable:
                continue
            answer = await self.pop.pop(local, group, topic.name, queue.queue_id, batch - len(out), invisible_ms,
                                        subscription, self.max_delivery_attempts)
            looks.append((queue.queue_id, answer))
            for popped in answer.messages:
                stored = popped.message
                receipt = Receipt(queue.queue_id, stored.queue_offset, popped.version)
                out.append(to_v2(stored, topic, queue.queue_id, receipt.encode(), invisible_ms,
                                 stored.reconsume_times + popped.attempts))
                if renew_for is not None:
                    self.renewals.add(Renewal(renew_for, group, topic.name, receipt, invisible_s,
                                              popped.visible_at_ms / 1000, time.time(), local))
        return out, looks

    async def _wait(self, topic: str, looks: list[tuple[int, query_pb2.PopMessageResponse]], wait_s: float,
                    subscription: str, context: Context) -> None:
        """Wait (at most ``wait_s``) until a receive may find something: a message arrives in a queue
        (mqstore's long-polling pulls at each queue's pop offset), an in-flight message becomes visible
        again, or the group acks or changes a message through this process. A queue whose next message
        waits for an earlier one of its FIFO group is looked at again every FIFO_RECHECK_S (the ack may
        come through another process)."""
        changed = self._changed
        now_ms = time.time() * 1000
        for _, look in looks:
            if look.next_visible_ms:
                wait_s = min(wait_s, (look.next_visible_ms - now_ms) / 1000)
            if look.fifo_blocked:
                wait_s = min(wait_s, FIFO_RECHECK_S)
        if wait_s <= 0:
            return
        waits: list[asyncio.Future[Any]] = [asyncio.ensure_future(changed.wait())]
        for queue_id, look in looks:
            if look.fifo_blocked:
                continue
            pull = query_pb2.PullMessageRequest(topic=topic, queue_id=queue_id, queue_offset=look.pop_offset,
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

    async def AckMessage(self, request: service_pb2.AckMessageRequest, context: Context
                         ) -> service_pb2.AckMessageResponse:
        entries = []
        first_failure = None
        local = self._local(context)
        for entry in request.entries:
            status = st.ok()
            try:
                receipt = Receipt.decode(entry.receipt_handle)
                await self.pop.ack(local, request.group.name, request.topic.name, receipt)
                self.renewals.forget(entry.receipt_handle)
                self._notify_change()
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
        """The answer's receipt handle is a new one (the old one is refused from then on); the message
        is no longer renewed (a push consumer's nack)."""
        seconds = request.invisible_duration.ToMilliseconds() / 1000
        if not 0 <= seconds <= MAX_INVISIBLE_S:
            return service_pb2.ChangeInvisibleDurationResponse(status=st.status(
                Code.ILLEGAL_INVISIBLE_TIME,
                f"invisible duration {seconds} s is not within 0..{MAX_INVISIBLE_S:.0f} s"))
        try:
            receipt = Receipt.decode(request.receipt_handle)
            answer = await self.pop.change_invisible(self._local(context), request.group.name, request.topic.name,
                                                     receipt, int(seconds * 1000))
        except BadReceiptHandle as exc:
            return service_pb2.ChangeInvisibleDurationResponse(status=st.status(Code.INVALID_RECEIPT_HANDLE, str(exc)))
        except MqstoreCallError as exc:
            return service_pb2.ChangeInvisibleDurationResponse(status=st.of_error(exc))
        self.renewals.forget(request.receipt_handle)
        self._notify_change()
        renewed = Receipt(receipt.queue_id, receipt.offset, answer.version)
        return service_pb2.ChangeInvisibleDurationResponse(status=st.ok(), receipt_handle=renewed.encode())

    async def ForwardMessageToDeadLetterQueue(self, request: service_pb2.ForwardMessageToDeadLetterQueueRequest,
                                              context: Context) -> service_pb2.ForwardMessageToDeadLetterQueueResponse:
        """The message goes to %DLQ%<group> (mqstore's ConsumerSendBack with delay level -1) and counts
        as acked. The receipt is checked first (and the message kept invisible while it moves)."""
        group, topic = request.group.name, request.topic.name
        local = self._local(context)
        try:
            receipt = Receipt.decode(request.receipt_handle)
            await self.pop.change_invisible(local, group, topic, receipt, FORWARD_CLAIM_MS, renew=True)
            send_back = gateway_pb2.ConsumerSendBackRequest(group=group, msg_id=request.message_id, delay_level=-1,
                                                            topic=topic)
            if 0 < request.delivery_attempt <= MAX_RECONSUME_TIMES_LIMIT:
                send_back.reconsume_times = request.delivery_attempt  # RECONSUME_TIMES: the deliveries
            await call(self.mq.ConsumerSendBack, send_back, local)
            await self.pop.ack(local, group, topic, receipt)
        except BadReceiptHandle as exc:
            return service_pb2.ForwardMessageToDeadLetterQueueResponse(
                status=st.status(Code.INVALID_RECEIPT_HANDLE, str(exc)))
        except MqstoreCallError as exc:
            return service_pb2.ForwardMessageToDeadLetterQueueResponse(
                status=st.of_error(exc, not_found=Code.MESSAGE_NOT_FOUND))
        self.renewals.forget(request.receipt_handle)
        self._notify_change()
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
    if not 0 <= request.batch_size <= MAX_BATCH_MESSAGES:
        return st.status(Code.BAD_REQUEST, f"batch_size {request.batch_size} is not within 1..{MAX_BATCH_MESSAGES}")
    if request.HasField("invisible_duration"):
        seconds = request.invisible_duration.ToMilliseconds() / 1000
        if not MIN_INVISIBLE_S <= seconds <= MAX_INVISIBLE_S:
            return st.status(Code.ILLEGAL_INVISIBLE_TIME, f"invisible duration {seconds} s is not within "
                             f"{MIN_INVISIBLE_S:.0f}..{MAX_INVISIBLE_S:.0f} s")
    if request.filter_expression.type == definition_pb2.FilterType.SQL:
        return st.status(Code.ILLEGAL_FILTER_EXPRESSION, "SQL92 filters are not supported by mqstore: filter by "
                         "tag ('TagA || TagB')")
    return None
