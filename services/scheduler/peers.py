"""The scheduler's gRPC clients: the indexer (published max offsets of SCHEDULE_TOPIC_XXXX's queues,
arrivals) and the commitlog service (AppendBatch of the due messages)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import grpc
from mqstore.v1 import commitlog_pb2, commitlog_pb2_grpc, common_pb2, indexer_pb2, indexer_pb2_grpc

from services.server.channels import aio_channel
from services.store.message import Message

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
    return common_pb2.Message(topic=msg.topic, queue_id=msg.queue_id, body=msg.body, flag=msg.flag,
                              properties=msg.properties, born_timestamp=msg.born_timestamp, born_host=msg.born_host,
                              sys_flag=msg.sys_flag, reconsume_times=msg.reconsume_times,
                              prepared_transaction_offset=msg.prepared_transaction_offset)


class CommitLogPeer:
    def __init__(self, address: str) -> None:
        self.address = address
        self._channel = aio_channel(address, CHANNEL_OPTIONS)
        self._stub = commitlog_pb2_grpc.CommitLogServiceStub(self._channel)

    async def append(self, messages: Sequence[Message]) -> list[commitlog_pb2.AppendResult]:
        """One AppendBatch; a result per message. AioRpcError when the call fails (nothing known stored)."""
        request = commitlog_pb2.AppendBatchRequest(messages=[message_to_proto(m) for m in messages])
        response = await self._stub.AppendBatch(request, timeout=CALL_TIMEOUT_S)
        return list(response.results)

    async def close(self) -> None:
        await self._channel.close(None)
