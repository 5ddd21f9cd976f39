"""The scheduler's gRPC clients: the indexer (published max offsets of SCHEDULE_TOPIC_XXXX's queues,
arrivals) and the commitlog service (AppendBatch of the due messages, the log's end)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence

import grpc

from mqstore.v1 import commitlog_pb2, commitlog_pb2_grpc, common_pb2, indexer_pb2, indexer_pb2_grpc
from services.server.channels import aio_channel
from services.store.formats.message import STOREHOSTADDRESS_V6_FLAG, Message
from services.store.rules.names import is_group_topic

log = logging.getLogger(__name__)

CALL_TIMEOUT_S = 10.0
CHANNEL_OPTIONS = [("grpc.max_send_message_length", 64 * 1024 * 1024),
                   ("grpc.initial_reconnect_backoff_ms", 100), ("grpc.max_reconnect_backoff_ms", 1000)]
#: statuses under which the message is stored (only a replica or flush wait failed)
STORED = frozenset({commitlog_pb2.PUT_MESSAGE_STATUS_PUT_OK, commitlog_pb2.PUT_MESSAGE_STATUS_FLUSH_DISK_TIMEOUT,
                    commitlog_pb2.PUT_MESSAGE_STATUS_FLUSH_SLAVE_TIMEOUT,
                    commitlog_pb2.PUT_MESSAGE_STATUS_SLAVE_NOT_AVAILABLE})
#: statuses that will not change on a retry: the message is passed over (else it would block its level)
REFUSED = frozenset({commitlog_pb2.PUT_MESSAGE_STATUS_MESSAGE_ILLEGAL,
                     commitlog_pb2.PUT_MESSAGE_STATUS_PROPERTIES_SIZE_EXCEEDED})


class IndexerPeer:
    def __init__(self, address: str) -> None:
        self.address = address
        self._channel = aio_channel(address, CHANNEL_OPTIONS)
        self._stub = indexer_pb2_grpc.IndexerServiceStub(self._channel)

    async def queue_offsets(self, topic: str, queue_id: int) -> tuple[int, int] | None:
        """(min offset, max offset) the indexer published; None for a queue it has never seen."""
        try:
            response = await self._stub.GetQueueOffsets(
                indexer_pb2.GetQueueOffsetsRequest(topic=topic, queue_id=queue_id), timeout=CALL_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                return None
            raise
        return response.min_offset, response.max_offset

    async def reput_offset(self) -> int:
        """The next commitlog offset the indexer dispatches: the units of every record below it are
        written."""
        status = await self._stub.GetDispatchStatus(indexer_pb2.GetDispatchStatusRequest(), timeout=CALL_TIMEOUT_S)
        return int(status.reput_offset)

    async def arrivals(self) -> AsyncIterator[tuple[str, int, int]]:
        """(topic, queue id, max offset) per arrival until the stream ends or breaks (AioRpcError)."""
        call = self._stub.WatchArrivals(indexer_pb2.WatchArrivalsRequest())
        try:
            async for arrival in call:
                yield arrival.topic, arrival.queue_id, arrival.max_offset
        finally:
            call.cancel()

    async def close(self) -> None:
        await self._channel.close(None)


def message_to_proto(msg: Message) -> common_pb2.Message:
    """The wire form. The store-host IPv6 bit is left out (a producer may not set it): the commitlog
    service sets both IPv6 bits from the hosts it writes, so the stored sys_flag is the same."""
    return common_pb2.Message(topic=msg.topic, queue_id=msg.queue_id, body=msg.body, flag=msg.flag,
                              properties=msg.properties, born_timestamp=msg.born_timestamp, born_host=msg.born_host,
                              sys_flag=msg.sys_flag & ~STOREHOSTADDRESS_V6_FLAG, reconsume_times=msg.reconsume_times,
                              prepared_transaction_offset=msg.prepared_transaction_offset)


class CommitLogPeer:
    def __init__(self, address: str) -> None:
        self.address = address
        self._channel = aio_channel(address, CHANNEL_OPTIONS)
        self._stub = commitlog_pb2_grpc.CommitLogServiceStub(self._channel)

    async def append(self, messages: Sequence[Message]) -> list[commitlog_pb2.AppendResult]:
        """A result per message stored or refused, in order (appended as due messages,
        ``scheduled_delivery``: their DELAY / TIMER_* properties do not park them again); fewer results
        than messages when a call failed after the ones answered (the rest must be tried again).
        AioRpcError when nothing was answered.

        One AppendBatch normally. A consumer group's %RETRY% / %DLQ% topic (a send-back delivered after
        its delay) is written only through Append with ``group_flow``; and a batch the store refuses as a
        whole (INVALID_ARGUMENT) is retried one message at a time, so that only the refused message gets
        a MESSAGE_ILLEGAL result and the others are delivered."""
        if not any(is_group_topic(m.topic) for m in messages):
            request = commitlog_pb2.AppendBatchRequest(messages=[message_to_proto(m) for m in messages],
                                                       scheduled_delivery=True)
            try:
                response = await self._stub.AppendBatch(request, timeout=CALL_TIMEOUT_S)
                return list(response.results)
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.INVALID_ARGUMENT:
                    raise
        results: list[commitlog_pb2.AppendResult] = []
        for message in messages:
            request_one = commitlog_pb2.AppendRequest(message=message_to_proto(message),
                                                      group_flow=is_group_topic(message.topic),
                                                      scheduled_delivery=True)
            try:
                results.append(await self._stub.Append(request_one, timeout=CALL_TIMEOUT_S))
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.INVALID_ARGUMENT:
                    if not results:
                        raise
                    return results
                log.error("the commitlog service refused a delayed message for %s queue %d: %s", message.topic,
                          message.queue_id, exc.details())
                results.append(commitlog_pb2.AppendResult(status=commitlog_pb2.PUT_MESSAGE_STATUS_MESSAGE_ILLEGAL))
        return results

    async def append_metadata(self, message: Message) -> None:
        """A replicated shard's metadata record (``metadata_flow``: services/store/metadata_log.py).
        AioRpcError when it was not acknowledged."""
        request = commitlog_pb2.AppendRequest(message=message_to_proto(message), metadata_flow=True)
        await self._stub.Append(request, timeout=CALL_TIMEOUT_S)

    async def log_end(self) -> int:
        """The commitlog's max offset: the records below it are whole in the files, and an append sent
        after the answer lies at or past it."""
        info = await self._stub.GetStoreInfo(commitlog_pb2.GetStoreInfoRequest(), timeout=CALL_TIMEOUT_S)
        return int(info.max_offset)

    async def close(self) -> None:
        await self._channel.close(None)
