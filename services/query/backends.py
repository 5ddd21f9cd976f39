"""asyncio clients of the indexer and the commitlog service: protobuf stays here, callers get
dataclasses and domain errors.

Every call has a deadline. A backend that cannot be reached (or is stopping) becomes
UnavailableError, so the caller can retry; an error that can only come from a bug on our side (we
validate before calling) becomes a plain StoreError, i.e. INTERNAL.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import grpc

from mqstore.v1 import commitlog_pb2, commitlog_pb2_grpc, common_pb2, indexer_pb2, indexer_pb2_grpc
from services.server.channels import aio_channel
from services.store.errors import DataLossError, FailedPreconditionError, OutOfRangeError, StoreError, UnavailableError
from services.store.metadata_log import OffsetChange, PopChange, metadata_message

MIB = 1024 * 1024
CALL_TIMEOUT_S = 5.0
# A ReadBatch answer is at most 64 MiB of data plus framing.
CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 80 * MIB),
    ("grpc.max_send_message_length", 16 * MIB),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.keepalive_time_ms", 30_000),
]
_RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED,
              grpc.StatusCode.RESOURCE_EXHAUSTED}


class QueueUnit(NamedTuple):
    """One ConsumeQueue unit. A tuple: a pull handles up to 1024 of them per request."""

    queue_offset: int
    commitlog_offset: int
    size: int
    tags_code: int


@dataclass(slots=True, frozen=True)
class QueueEntries:
    """Units from an offset on, with the queue's offsets at the time they were read.
    ``known`` is False for a queue the indexer has never seen (RocketMQ: an empty queue)."""

    units: list[QueueUnit]
    min_offset: int
    max_offset: int
    known: bool = True


@dataclass(slots=True, frozen=True)
class KeyHits:
    """Index hits for topic#key, newest first (hash collisions included)."""

    commitlog_offsets: list[int]
    index_last_update_timestamp: int
    index_last_update_phy_offset: int


@dataclass(slots=True, frozen=True)
class StoreInfo:
    """What the query service needs to know of the commitlog."""

    min_offset: int
    max_offset: int
    mapped_file_size: int
    store_host: str
    incarnation: str
    #: [start, end) commitlog ranges recovery quarantined: reads of them answer DATA_LOSS
    quarantined: tuple[tuple[int, int], ...] = ()


@dataclass(slots=True, frozen=True)
class QueueArrival:
    topic: str
    queue_id: int
    max_offset: int
    #: the indexer's reput offset after these units (0 from an indexer that does not say)
    reput_offset: int = 0
    #: the commitlog was truncated: max offsets learned before may be too high
    truncated: bool = False
    #: the topic's queues were deleted (queue_id and max_offset are 0): forget them
    deleted: bool = False


def _translate(service: str, address: str, exc: grpc.aio.AioRpcError) -> StoreError:
    code = exc.code()
    text = f"{service} at {address}: {code.name}: {exc.details()}"
    if code in _RETRYABLE:
        return UnavailableError(f"{text}; retry")
    if code == grpc.StatusCode.OUT_OF_RANGE:
        return OutOfRangeError(text)
    if code == grpc.StatusCode.DATA_LOSS:  # a quarantined commitlog range: passed through as DATA_LOSS
        return DataLossError(text)
    return StoreError(text)


class IndexerClient:
    def __init__(self, address: str) -> None:
        self.address = address
        self._channel = aio_channel(address, CHANNEL_OPTIONS)
        self._stub = indexer_pb2_grpc.IndexerServiceStub(self._channel)

    async def close(self) -> None:
        await self._channel.close(None)

    def _error(self, exc: grpc.aio.AioRpcError) -> StoreError:
        return _translate("indexer", self.address, exc)

    async def queue_entries(self, topic: str, queue_id: int, from_offset: int, max_count: int) -> QueueEntries:
        request = indexer_pb2.GetQueueEntriesRequest(topic=topic, queue_id=queue_id, from_offset=from_offset,
                                                     max_count=max_count)
        try:
            response = await self._stub.GetQueueEntries(request, timeout=CALL_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                return QueueEntries([], 0, 0, known=False)
            raise self._error(exc) from None
        units = [QueueUnit(u.queue_offset, u.commitlog_offset, u.size, u.tags_code) for u in response.units]
        return QueueEntries(units, response.min_offset, response.max_offset)

    async def queue_offsets(self, topic: str, queue_id: int) -> tuple[int, int] | None:
        """(min offset, max offset), or None for a queue the indexer has never seen."""
        request = indexer_pb2.GetQueueOffsetsRequest(topic=topic, queue_id=queue_id)
        try:
            response = await self._stub.GetQueueOffsets(request, timeout=CALL_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                return None
            raise self._error(exc) from None
        return response.min_offset, response.max_offset

    async def offset_by_time(self, topic: str, queue_id: int, timestamp: int) -> int | None:
        request = indexer_pb2.GetOffsetByTimeRequest(topic=topic, queue_id=queue_id, timestamp=timestamp)
        try:
            response = await self._stub.GetOffsetByTime(request, timeout=CALL_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                return None
            raise self._error(exc) from None
        return int(response.offset)

    async def query_by_key(self, topic: str, key: str, max_num: int, begin: int, end: int,
                           skip: int = 0) -> KeyHits:
        """``end`` 0 = no upper bound; ``skip``: hits passed over first (a walk's next page)."""
        request = indexer_pb2.QueryByKeyRequest(topic=topic, key=key, max_num=max_num, begin_timestamp=begin,
                                                end_timestamp=end, skip=skip)
        try:
            response = await self._stub.QueryByKey(request, timeout=CALL_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            raise self._error(exc) from None
        return KeyHits(list(response.commitlog_offsets), response.index_last_update_timestamp,
                       response.index_last_update_phy_offset)

    async def topics(self) -> list[str]:
        """Every topic with at least one dispatched message, sorted."""
        return sorted({topic for topic, _, _, _ in await self.queues()})

    async def queues(self) -> list[tuple[str, int, int, int]]:
        """(topic, queue id, min offset, max offset) of every ConsumeQueue, in one call."""
        try:
            response = await self._stub.ListQueues(indexer_pb2.ListQueuesRequest(), timeout=CALL_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            raise self._error(exc) from None
        return [(q.topic, q.queue_id, q.min_offset, q.max_offset) for q in response.queues]

    async def arrivals(self) -> AsyncIterator[QueueArrival]:
        """The WatchArrivals stream, until it ends; UnavailableError when it breaks."""
        call = self._stub.WatchArrivals(indexer_pb2.WatchArrivalsRequest())
        try:
            async for arrival in call:
                yield QueueArrival(arrival.topic, arrival.queue_id, arrival.max_offset, arrival.reput_offset,
                                   arrival.truncated, arrival.deleted)
        except grpc.aio.AioRpcError as exc:
            raise self._error(exc) from None
        finally:
            call.cancel()


class CommitLogClient:
    def __init__(self, address: str) -> None:
        self.address = address
        self._channel = aio_channel(address, CHANNEL_OPTIONS)
        self._stub = commitlog_pb2_grpc.CommitLogServiceStub(self._channel)

    async def close(self) -> None:
        await self._channel.close(None)

    def _error(self, exc: grpc.aio.AioRpcError) -> StoreError:
        return _translate("commitlog service", self.address, exc)

    async def store_info(self) -> StoreInfo:
        """wait_for_ready: with reads from the files this is refreshed every second, so the channel sees a
        commitlog restart and backs off; a request that needs the view waits for the reconnect (within
        the deadline) instead of failing fast in the backoff."""
        try:
            info = await self._stub.GetStoreInfo(commitlog_pb2.GetStoreInfoRequest(), timeout=CALL_TIMEOUT_S,
                                                 wait_for_ready=True)
        except grpc.aio.AioRpcError as exc:
            raise self._error(exc) from None
        return StoreInfo(info.min_offset, info.max_offset, info.mapped_file_size, info.store_host, info.incarnation,
                         tuple((r.start_offset, r.end_offset) for r in info.quarantined_ranges))

    async def append_metadata(self, change: OffsetChange | PopChange) -> int:
        """Log a consumer offset or pop state change (a replicated shard's, offset_log.py); returns its queue offset in
        the metadata topic. A follower's FAILED_PRECONDITION (naming the leader) and SYNC_MASTER's
        UNAVAILABLE (the followers lack it) come back with the commitlog's own words."""
        message = metadata_message(change)
        request = commitlog_pb2.AppendRequest(metadata_flow=True, message=common_pb2.Message(
            topic=message.topic, queue_id=message.queue_id, body=message.body, properties=message.properties,
            born_timestamp=message.born_timestamp))
        try:
            result = await self._stub.Append(request, timeout=CALL_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.FAILED_PRECONDITION:
                raise FailedPreconditionError(exc.details() or "") from None
            raise self._error(exc) from None
        return int(result.queue_offset)

    async def read(self, offset: int, size: int) -> bytes:
        """OutOfRangeError when the range is not (or no longer) in the log."""
        try:
            response = await self._stub.Read(commitlog_pb2.ReadRequest(offset=offset, size=size),
                                             timeout=CALL_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            raise self._error(exc) from None
        return bytes(response.data)

    async def read_batch(self, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        """One entry per (offset, size) range; OutOfRangeError if any range is not in the log."""
        request = commitlog_pb2.ReadBatchRequest(
            ranges=[commitlog_pb2.ByteRange(offset=offset, size=size) for offset, size in ranges])
        try:
            response = await self._stub.ReadBatch(request, timeout=CALL_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            raise self._error(exc) from None
        return list(response.data)
