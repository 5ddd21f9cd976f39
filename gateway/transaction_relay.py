"""Transactional messages at the gateway: half sends, ends and the check relay (docs/transactions.md).

* **Half send**: a Send whose message has ``TRAN_MSG`` = "true" and ``PGROUP``. The real queue is
  chosen as for any send; the record stored is the half (``services/store/rules/transaction_records.py``) under
  ``RMQ_SYS_TRANS_HALF_TOPIC`` queue 0, appended with ``transaction_flow``. Batches and streams refuse
  transactional messages (RocketMQ refuses transactional batches): a half is sent alone.
* **EndTransaction**: the half is found by its offset msg id (which names its shard), the token must
  be allowed to produce to its real topic, and the shard's scheduler ends it (the one writer of the
  shard's op records: a second end applies nothing).
* **TransactionChecks**: a producer holds a stream per producer group; while a group has at least
  one such stream on this gateway, the gateway watches every shard's scheduler for the group's checks
  and hands each to one of the group's streams (round robin). Answers come back on the same stream
  and are ended as EndTransaction with ``from_transaction_check``.
* **Who is asked**: a check carries the half's body and its answer decides the transaction, so it goes
  only to a :class:`CheckReceiver` (a v1 stream, or a RocketMQ 5 producer: rocketmq5/checks.py) whose
  token may produce to the half's real topic (and, for a RocketMQ 5 producer, that publishes it). The
  schedulers are told those topics with each watch, so a half no receiver may be asked about is not
  checked (no check of its transactionCheckMax spent) and waits for the next round.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeAlias

import grpc

from gateway.auth import Action, AuthError, PermissionDeniedError, Principal
from gateway.message_finder import MessageFinder
from gateway.resilience import BackendError
from gateway.route import QueueRoute, RouteTable, TopicRoute
from gateway.shard import ShardClient
from gateway.wire import Undecodable
from mqstore.v1 import commitlog_pb2, common_pb2, gateway_pb2, query_pb2, scheduler_pb2, transaction_pb2
from services.store.errors import InvalidArgumentError, StoreError
from services.store.formats.message import PROPERTY_REAL_QUEUE_ID, PROPERTY_REAL_TOPIC, TRANSACTION_NOT_TYPE
from services.store.formats.message_id import MessageIdKind, check_message_id
from services.store.rules import transaction_records as tx
from services.store.rules.names import check_producer_group
from services.store.rules.producer_message import refuse_transactional

log = logging.getLogger(__name__)

#: after a broken WatchChecks stream (the scheduler restarting)
REWATCH_S = 1.0
_RESOLUTIONS = (transaction_pb2.COMMIT, transaction_pb2.ROLLBACK, transaction_pb2.UNKNOWN)


def is_transactional(message: common_pb2.Message) -> bool:
    return tx.is_transactional(message.properties)


def refuse_in_batch(message: common_pb2.Message, index: int | None) -> None:
    """Batches and streams: INVALID_ARGUMENT for a transactional message (RocketMQ refuses them too)."""
    refuse_transactional(message.properties, index)


def half_message(message: common_pb2.Message, shard_queue_id: int) -> common_pb2.Message:
    """parseHalfMessageInner on the wire form: ``message``, bound for ``shard_queue_id`` of its topic."""
    half = common_pb2.Message()
    half.CopyFrom(message)
    half.properties[PROPERTY_REAL_TOPIC] = message.topic
    half.properties[PROPERTY_REAL_QUEUE_ID] = str(shard_queue_id)
    half.topic = tx.HALF_TOPIC
    half.queue_id = 0
    half.sys_flag = tx.reset_transaction_type(message.sys_flag, TRANSACTION_NOT_TYPE)
    return half


AppendResult: TypeAlias = commitlog_pb2.AppendResult
Append: TypeAlias = Callable[[TopicRoute, str, "int | None", Callable[[QueueRoute], Awaitable[AppendResult]]],
                             Awaitable[tuple[QueueRoute, AppendResult]]]


async def send_half(append: Append, route: TopicRoute, sharding_key: str, explicit: int | None,
                    message: common_pb2.Message, timeout: float) -> tuple[QueueRoute, AppendResult]:
    """The half of ``message`` on the queue the selector picks (``append``: the servicer's send with
    retries), stored with ``transaction_flow``."""
    tx.check_half_properties(message.properties)

    async def send(queue: QueueRoute) -> AppendResult:
        request = commitlog_pb2.AppendRequest(message=half_message(message, queue.shard_queue_id),
                                              transaction_flow=True)
        result: AppendResult = await queue.shard.on_commitlog(queue.shard.commitlog.Append, request, timeout)
        return result

    return await append(route, sharding_key, explicit, send)


class Authorize(Protocol):
    def __call__(self, topic: str) -> None: ...


def check_end_request(request: transaction_pb2.EndTransactionRequest) -> None:
    check_producer_group(request.producer_group)
    if not request.offset_msg_id:
        raise InvalidArgumentError("offset_msg_id is empty: give the half send's offset_msg_id")
    check_message_id(request.offset_msg_id, MessageIdKind.OFFSET)
    if request.resolution not in _RESOLUTIONS:
        raise InvalidArgumentError(f"resolution {request.resolution} is not COMMIT, ROLLBACK or UNKNOWN")


class Transactions:
    """Ends and the check relay of one gateway process."""

    def __init__(self, shards: Sequence[ShardClient], routes: RouteTable, finder: MessageFinder) -> None:
        self.shards = tuple(shards)
        self.routes = routes
        self.finder = finder
        self._receivers: dict[str, list[CheckReceiver]] = {}
        #: group -> (the topics its watches name, one watch task per shard)
        self._watches: dict[str, tuple[tuple[str, ...], list[asyncio.Task[None]]]] = {}
        self._turn = 0
        self._stopping = asyncio.Event()

    def stopping(self) -> None:
        """The gateway is stopping: end every TransactionChecks stream and scheduler watch now (producers
        reconnect to the next gateway), so the stop does not wait out the drain grace on streams that
        never end by themselves."""
        self._stopping.set()
        for _, tasks in self._watches.values():
            for task in tasks:
                task.cancel()

    async def close(self) -> None:
        self.stopping()
        self._watches.clear()

    # -- ends ----------------------------------------------------------------------------------------
    async def end(self, request: transaction_pb2.EndTransactionRequest, authorize: Authorize,
                  timeout: float) -> gateway_pb2.EndTransactionResult:
        check_end_request(request)
        view = query_pb2.ViewMessageRequest(msg_id=request.offset_msg_id, kind=query_pb2.MESSAGE_ID_KIND_OFFSET)
        found, shard = await self.finder.find(view, request.offset_msg_id, timeout)
        half = found.message
        if half.topic != tx.HALF_TOPIC:
            raise InvalidArgumentError(f"offset_msg_id {request.offset_msg_id} names a message of topic "
                                       f"{half.topic!r}, "
                                       f"not a half ({tx.HALF_TOPIC}): give the half send's offset_msg_id")
        real_topic = half.properties.get(PROPERTY_REAL_TOPIC, "")
        authorize(real_topic)
        answer = await shard.on_scheduler(
            shard.transactions.EndHalf,
            scheduler_pb2.EndHalfRequest(request=request, commitlog_offset=half.commitlog_offset), timeout)
        result = gateway_pb2.EndTransactionResult(applied=answer.applied)
        if answer.HasField("committed"):
            c = answer.committed
            route = await self.routes.route(c.topic)
            base = route.bases.get(shard, 0) if route is not None else 0
            result.committed.MergeFrom(gateway_pb2.SendResult(
                status=c.status, uniq_key=half.uniq_key or request.transaction_id,
                msg_id=half.uniq_key or request.transaction_id, offset_msg_id=c.msg_id,
                topic=c.topic, queue_id=c.queue_id + base, queue_offset=c.queue_offset,
                store_timestamp=c.store_timestamp, shard=shard.name))
        return result

    # -- the check relay -----------------------------------------------------------------------------
    def join(self, group: str, receiver: CheckReceiver) -> None:
        """``receiver`` is asked about ``group``'s halves of the topics it takes from now on."""
        self._receivers.setdefault(group, []).append(receiver)
        self._rewatch(group)

    def leave(self, group: str, receiver: CheckReceiver) -> None:
        receivers = self._receivers.get(group, [])
        if receiver in receivers:
            receivers.remove(receiver)
        if not receivers:
            self._receivers.pop(group, None)
        self._rewatch(group)

    def _rewatch(self, group: str) -> None:
        """Watches of ``group`` on every shard that name the topics its receivers take (new ones first,
        then the old ones cancelled: no moment without a watch); none when no receiver is left."""
        topics = tuple(sorted({t for r in self._receivers.get(group, ()) for t in r.topics}))
        current = self._watches.get(group)
        if current is not None and current[0] == topics:
            return
        if topics:
            self._watches[group] = (topics, [
                asyncio.get_running_loop().create_task(self._watch(group, topics, shard), name=f"watch-checks-{group}")
                for shard in self.shards])
        else:
            self._watches.pop(group, None)
        for task in current[1] if current is not None else ():
            task.cancel()

    async def checks(self, requests: AsyncIterator[transaction_pb2.TransactionCheckStreamRequest],
                     principal: Principal, end: Callable[[transaction_pb2.EndTransactionRequest], Awaitable[object]]
                     ) -> AsyncIterator[transaction_pb2.TransactionCheck]:
        """One producer's TransactionChecks stream: the first request names its group, later ones answer.
        It is asked about the group's halves of the topics ``principal`` may produce to."""
        first = await anext(aiter(requests), None)
        if first is None:
            return
        if type(first) is Undecodable:
            raise InvalidArgumentError(first.reason)
        if first.WhichOneof("kind") != "producer_group":
            raise InvalidArgumentError("the first message of a TransactionChecks stream must be producer_group")
        group = first.producer_group
        check_producer_group(group)
        topics = ("*",) if principal.admin else principal.produce
        if not topics:
            raise PermissionDeniedError(f"token {principal.name!r} may produce to no topic, so it answers no "
                                        f"transaction check (of producer group {group!r}): use a token with a "
                                        "produce list")
        queue: asyncio.Queue[transaction_pb2.TransactionCheck] = asyncio.Queue()
        receiver = CheckReceiver(topics, lambda topic: principal.may(Action.PRODUCE, topic), queue.put_nowait)
        self.join(group, receiver)
        reader = asyncio.create_task(self._answers(group, requests, end))
        stopping = asyncio.ensure_future(self._stopping.wait())
        try:
            while True:
                getter = asyncio.ensure_future(queue.get())
                done, _ = await asyncio.wait((getter, reader, stopping), return_when=asyncio.FIRST_COMPLETED)
                if getter in done:
                    yield getter.result()
                    continue
                getter.cancel()
                if stopping in done:
                    return  # the gateway stops
                reader.result()  # an error in the answers ends the stream with it
                return  # the producer closed its side
        finally:
            reader.cancel()
            stopping.cancel()
            self.leave(group, receiver)
            # Checks handed to this producer and not sent: the scheduler checks them again next interval.

    async def _answers(self, group: str, requests: AsyncIterator[transaction_pb2.TransactionCheckStreamRequest],
                       end: Callable[[transaction_pb2.EndTransactionRequest], Awaitable[object]]) -> None:
        async for request in requests:
            if type(request) is Undecodable:
                raise InvalidArgumentError(request.reason)
            if request.WhichOneof("kind") != "answer":
                raise InvalidArgumentError("after producer_group, a TransactionChecks stream carries only answers")
            answer = request.answer
            if not answer.producer_group:
                answer.producer_group = group
            answer.from_transaction_check = True
            try:
                await end(answer)
            except (BackendError, StoreError, AuthError) as exc:  # one bad answer must not end the stream
                # RocketMQ's broker logs a failed check answer too: the half is checked again.
                log.warning("transaction check answer for %s of group %r not applied: %s", answer.offset_msg_id,
                            group, getattr(exc, "details", str(exc)))

    async def _watch(self, group: str, topics: tuple[str, ...], shard: ShardClient) -> None:
        while not self._stopping.is_set():
            call = shard.transactions.WatchChecks(scheduler_pb2.WatchChecksRequest(producer_group=group,
                                                                                   topics=topics))
            try:
                async for check in call:
                    check.shard = shard.name
                    # The scheduler names the shard's queue: the producer knows the route's.
                    route = await self.routes.route(check.message.topic)
                    if route is not None:
                        check.message.queue_id += route.bases.get(shard, 0)
                    self._hand_out(group, check)
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.CANCELLED:
                    return
                log.debug("check stream of group %r from %s broke: %s", group, shard.name, exc.code())
            finally:
                call.cancel()
            await asyncio.sleep(REWATCH_S)

    def _hand_out(self, group: str, check: transaction_pb2.TransactionCheck) -> None:
        """To the next receiver of ``group`` (round robin) that may be asked about the half's topic; none
        when the last such one left meanwhile (the half is checked again next interval)."""
        receivers = [r for r in self._receivers.get(group, ()) if r.takes(check.message.topic)]
        if not receivers:
            log.info("transaction check of %s (topic %r, group %r): no producer that may be asked is connected "
                     "any more", check.transaction_id, check.message.topic, group)
            return
        self._turn += 1
        receivers[self._turn % len(receivers)].deliver(check)


@dataclass(eq=False)
class CheckReceiver:
    """A producer that may be asked about halves: ``topics``, the patterns the schedulers are told (the
    token file's rule, fnmatch); ``takes``, whether it may be asked about a topic (its token may produce
    to it, and for a RocketMQ 5 producer it publishes it); ``deliver``, how a check reaches it."""

    topics: tuple[str, ...]
    takes: Callable[[str], bool]
    deliver: Callable[[transaction_pb2.TransactionCheck], None]
