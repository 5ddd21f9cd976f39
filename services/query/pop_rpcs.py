"""The query service's pop RPCs (PopMessage, AckPopped, ChangePoppedInvisibleTime, ClaimExhausted): a
mixin of :class:`services.query.servicer.QueryServicer`; the work is :mod:`services.query.pop`."""

from __future__ import annotations

from typing import Any

from mqstore.v1 import query_pb2
from services.query.convert import add_messages
from services.query.edge import rpc
from services.query.pop import PopService, Ref


def _ref(ref: query_pb2.PoppedRef) -> Ref:
    return Ref(ref.consumer_group, ref.topic, ref.queue_id, ref.queue_offset, ref.version)


class PopRpcs:
    _pop: PopService

    def _check_running(self) -> None:
        """QueryServicer's: UNAVAILABLE while stopping."""

    async def _offset_commit_durable(self) -> None:
        """QueryServicer's: under syncConsumerOffsetCommit, the committed offsets are on disk."""

    @rpc
    async def PopMessage(self, request: query_pb2.PopMessageRequest, context: Any) -> query_pb2.PopMessageResponse:
        self._check_running()
        result = await self._pop.pop(request.consumer_group, request.topic, request.queue_id,
                                     request.max_messages, request.invisible_ms, request.subscription,
                                     request.max_attempts)
        response = query_pb2.PopMessageResponse(pop_offset=result.pop_offset, fifo_blocked=result.fifo_blocked,
                                                next_visible_ms=result.next_visible_ms)
        holder = query_pb2.PullMessageResponse()
        add_messages(holder.messages, [p.message for p in result.messages])
        for popped, message in zip(result.messages, holder.messages, strict=True):
            response.messages.add(message=message, attempts=popped.attempts, version=popped.version,
                                  visible_at_ms=popped.visible_at_ms)
        return response

    @rpc
    async def AckPopped(self, request: query_pb2.AckPoppedRequest, context: Any) -> query_pb2.AckPoppedResponse:
        self._check_running()
        committed = await self._pop.ack(_ref(request.ref))
        await self._offset_commit_durable()
        return query_pb2.AckPoppedResponse(committed_offset=committed)

    @rpc
    async def ChangePoppedInvisibleTime(self, request: query_pb2.ChangePoppedInvisibleTimeRequest,
                                        context: Any) -> query_pb2.ChangePoppedInvisibleTimeResponse:
        self._check_running()
        entry = await self._pop.change_invisible_time(_ref(request.ref), request.invisible_ms, request.renew)
        return query_pb2.ChangePoppedInvisibleTimeResponse(version=entry.version, visible_at_ms=entry.visible_at_ms,
                                                           attempts=entry.attempts)

    @rpc
    async def ClaimExhausted(self, request: query_pb2.ClaimExhaustedRequest,
                             context: Any) -> query_pb2.ClaimExhaustedResponse:
        self._check_running()
        claimed = await self._pop.claim_exhausted(request.max_attempts, request.claim_ms, request.max_messages)
        response = query_pb2.ClaimExhaustedResponse()
        for c in claimed:
            ref = query_pb2.PoppedRef(consumer_group=c.ref.group, topic=c.ref.topic, queue_id=c.ref.queue_id,
                                      queue_offset=c.ref.offset, version=c.ref.version)
            response.messages.add(ref=ref, msg_id=c.msg_id, attempts=c.attempts, reconsume_times=c.reconsume_times)
        return response
