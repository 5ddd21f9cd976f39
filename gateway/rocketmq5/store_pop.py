"""The shards' pop RPCs (query service: PopMessage, AckPopped, ChangePoppedInvisibleTime,
ClaimExhausted) for the RocketMQ 5 servicer: a route queue id becomes its shard and the shard's queue
id, the caller is authorized as an mqstore.v1 Pull of the topic is, and failures become
:class:`MqstoreCallError` (NOT_FOUND and FAILED_PRECONDITION of a receipt: :class:`BadReceiptHandle`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import grpc

from gateway.rocketmq5.inflight import BadReceiptHandle, Receipt
from gateway.rocketmq5.local_call import LocalContext, MqstoreCallError
from gateway.route import QueueRoute
from gateway.shard import ShardClient
from gateway.wire import status_of
from mqstore.v1 import query_pb2

if TYPE_CHECKING:
    from gateway.servicer import MessagingServicer

T = TypeVar("T")
#: What the query service answers for a receipt that names no message in flight, or an earlier hand-out.
RECEIPT_PROBLEMS = (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION)


async def _mapped(work: Callable[[], Awaitable[T]]) -> T:
    try:
        return await work()
    except MqstoreCallError:
        raise
    except Exception as exc:
        status = status_of(exc)
        if status is None:
            raise
        raise MqstoreCallError(*status) from None


class StorePop:
    def __init__(self, mq: MessagingServicer) -> None:
        self.mq = mq

    async def _queue(self, local: LocalContext, topic: str, queue_id: int) -> QueueRoute:
        return await self.mq._readable_queue(local, topic, queue_id)  # type: ignore[arg-type]

    async def _call(self, local: LocalContext, shard: ShardClient, method: str, request: Any) -> Any:
        timeout = self.mq._timeout(local)  # type: ignore[arg-type]
        return await shard.on_query(getattr(shard.query, method), request, timeout)

    async def pop(self, local: LocalContext, group: str, topic: str, queue_id: int, max_messages: int,
                  invisible_ms: int, subscription: str, max_attempts: int) -> query_pb2.PopMessageResponse:
        async def work() -> query_pb2.PopMessageResponse:
            queue = await self._queue(local, topic, queue_id)
            request = query_pb2.PopMessageRequest(consumer_group=group, topic=topic, queue_id=queue.shard_queue_id,
                                                  max_messages=max_messages, invisible_ms=invisible_ms,
                                                  subscription=subscription, max_attempts=max_attempts)
            answer: query_pb2.PopMessageResponse = await self._call(local, queue.shard, "PopMessage", request)
            return answer

        return await _mapped(work)

    async def _on_receipt(self, local: LocalContext, group: str, topic: str, receipt: Receipt, method: str,
                          request: Any) -> Any:
        async def work() -> Any:
            queue = await self._queue(local, topic, receipt.queue_id)
            request.ref.CopyFrom(query_pb2.PoppedRef(consumer_group=group, topic=topic, queue_id=queue.shard_queue_id,
                                                     queue_offset=receipt.offset, version=receipt.version))
            return await self._call(local, queue.shard, method, request)

        try:
            return await _mapped(work)
        except MqstoreCallError as exc:
            if exc.code in RECEIPT_PROBLEMS:
                raise BadReceiptHandle(f"receipt handle {receipt.encode()!r}: {exc.details}") from None
            raise

    async def ack(self, local: LocalContext, group: str, topic: str, receipt: Receipt) -> None:
        await self._on_receipt(local, group, topic, receipt, "AckPopped", query_pb2.AckPoppedRequest())

    async def change_invisible(self, local: LocalContext, group: str, topic: str, receipt: Receipt,
                               invisible_ms: int, renew: bool = False
                               ) -> query_pb2.ChangePoppedInvisibleTimeResponse:
        request = query_pb2.ChangePoppedInvisibleTimeRequest(invisible_ms=invisible_ms, renew=renew)
        answer: query_pb2.ChangePoppedInvisibleTimeResponse = await self._on_receipt(
            local, group, topic, receipt, "ChangePoppedInvisibleTime", request)
        return answer

    async def claim_exhausted(self, shard: ShardClient, max_attempts: int, claim_ms: int,
                              timeout_s: float) -> query_pb2.ClaimExhaustedResponse:
        request = query_pb2.ClaimExhaustedRequest(max_attempts=max_attempts, claim_ms=claim_ms)
        answer: query_pb2.ClaimExhaustedResponse = await _mapped(
            lambda: shard.on_query(shard.query.ClaimExhausted, request, timeout_s))
        return answer

    async def ack_claimed(self, shard: ShardClient, ref: query_pb2.PoppedRef, timeout_s: float) -> None:
        await _mapped(lambda: shard.on_query(shard.query.AckPopped, query_pb2.AckPoppedRequest(ref=ref), timeout_s))
