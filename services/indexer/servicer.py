"""IndexerService: queue units, queue offsets, offset by time, key lookups, dispatch status, arrivals."""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from collections.abc import Callable, Iterator

import grpc

from mqstore.v1 import admin_pb2, indexer_pb2, indexer_pb2_grpc
from services.indexer import metrics as indexer_metrics
from services.indexer.indexer_store import ArrivalBatch, IndexerStore
from services.indexer.reput import ReputService
from services.indexer.topic_deletion import DELETE_WAIT_S, delete_topic
from services.server.status import RpcEdge
from services.store.errors import InvalidArgumentError, NotFoundError
from services.store.formats.consume_queue import ConsumeQueue
from services.store.rules.key_query import MAX_HITS_WALKED
from services.store.rules.names import check_deletable_topic, check_key, check_queue, check_topic_name

log = logging.getLogger(__name__)

SERVICE_NAME: str = indexer_pb2.DESCRIPTOR.services_by_name["IndexerService"].full_name
DEFAULT_MAX_COUNT = 32
MAX_COUNT = 1024
DEFAULT_MAX_NUM = 64
MAX_NUM = 1024
INT64_MAX = 2**63 - 1
# Per WatchArrivals subscriber: arrivals waiting to be sent; a slow subscriber loses the oldest.
ARRIVAL_QUEUE_DEPTH = 4096
HEARTBEAT_S = 1.0

StoreTimeReader = Callable[[int, int], int]
MinOffsetReader = Callable[[], int]


class ArrivalHub:
    """Fans dispatch arrivals out to WatchArrivals subscribers, each with a bounded queue."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._subscribers: list[queue.Queue[ArrivalBatch | None]] = []

    def publish(self, arrivals: ArrivalBatch) -> None:
        with self._lock:
            subscribers = list(self._subscribers)
        for q in subscribers:
            try:
                q.put_nowait(arrivals)
            except queue.Full:  # drop the oldest: the newest max offset is what matters (a reader of the
                # files also re-checks a unit it finds invalid, so a dropped truncation costs a retry)
                try:
                    q.get_nowait()
                    q.put_nowait(arrivals)
                except (queue.Empty, queue.Full):
                    pass

    def subscribe(self) -> queue.Queue[ArrivalBatch | None]:
        q: queue.Queue[ArrivalBatch | None] = queue.Queue(ARRIVAL_QUEUE_DEPTH)
        with self._lock:
            self._subscribers.append(q)
        return q

    def unsubscribe(self, q: queue.Queue[ArrivalBatch | None]) -> None:
        with self._lock:
            self._subscribers.remove(q)

    def end_streams(self) -> None:
        """Wake every subscriber with the end of its stream (None), at a stop: a stream waiting for its next
        heartbeat would hold its worker thread, and so the process's exit, for up to a heartbeat."""
        with self._lock:
            subscribers = list(self._subscribers)
        for q in subscribers:
            while True:
                try:
                    q.put_nowait(None)
                    break
                except queue.Full:
                    with contextlib.suppress(queue.Empty):
                        q.get_nowait()


#: Every RPC's error path: a domain error ends the call with its status.
rpc = RpcEdge(indexer_pb2.DESCRIPTOR.services_by_name["IndexerService"])


def _check_queue_args(topic: str, queue_id: int) -> None:
    """The same rules as every other edge (``services/store/rules/names.py``): a name of dots only, or any
    other illegal topic, is refused before it can name a directory."""
    check_queue(topic, queue_id)


class IndexerServicer(indexer_pb2_grpc.IndexerServiceServicer):  # type: ignore[misc]
    def __init__(self, store: IndexerStore, reput: ReputService, hub: ArrivalHub,
                 store_time_of: StoreTimeReader, commitlog_min_offset: MinOffsetReader = lambda: 0) -> None:
        self.store = store
        self.reput = reput
        self.hub = hub
        self.store_time_of = store_time_of
        self.commitlog_min_offset = commitlog_min_offset
        self.stopping = threading.Event()

    def _queue(self, topic: str, queue_id: int) -> ConsumeQueue:
        _check_queue_args(topic, queue_id)
        found = self.store.queue(topic, queue_id)
        if found is None:
            raise NotFoundError(f"queue {topic}/{queue_id} has no messages in this indexer (unknown topic or "
                                "queue id, or nothing dispatched yet)")
        return found

    @rpc
    def GetQueueEntries(self, request: indexer_pb2.GetQueueEntriesRequest,
                        context: grpc.ServicerContext) -> indexer_pb2.GetQueueEntriesResponse:
        if request.from_offset < 0:
            raise InvalidArgumentError(f"from_offset {request.from_offset} is negative")
        count = request.max_count or DEFAULT_MAX_COUNT
        if not 1 <= count <= MAX_COUNT:
            raise InvalidArgumentError(f"max_count {request.max_count} must be within 0..{MAX_COUNT} "
                                       f"(0 means {DEFAULT_MAX_COUNT})")
        cq = self._queue(request.topic, request.queue_id)
        units = cq.get_units(request.from_offset, count)
        indexer_metrics.observe_queue_read(len(units))
        return indexer_pb2.GetQueueEntriesResponse(
            units=[indexer_pb2.QueueUnit(queue_offset=q, commitlog_offset=o, size=s, tags_code=t)
                   for o, s, t, q in units],
            min_offset=cq.min_offset_in_queue, max_offset=cq.max_offset_in_queue)

    @rpc
    def GetQueueOffsets(self, request: indexer_pb2.GetQueueOffsetsRequest,
                        context: grpc.ServicerContext) -> indexer_pb2.QueueOffsets:
        cq = self._queue(request.topic, request.queue_id)
        return _queue_offsets(cq)

    @rpc
    def GetOffsetByTime(self, request: indexer_pb2.GetOffsetByTimeRequest,
                        context: grpc.ServicerContext) -> indexer_pb2.GetOffsetByTimeResponse:
        """RocketMQ's getOffsetInQueueByTime: the file by mtime (``consume_queue.py`` keeps the mtimes
        of files this indexer built at their last unit's store time), then the nearest unit in it."""
        if request.timestamp < 0:
            raise InvalidArgumentError(f"timestamp {request.timestamp} is negative")
        cq = self._queue(request.topic, request.queue_id)
        return indexer_pb2.GetOffsetByTimeResponse(
            offset=cq.get_offset_in_queue_by_time(request.timestamp, self.store_time_of, self.commitlog_min_offset()))

    @rpc
    def QueryByKey(self, request: indexer_pb2.QueryByKeyRequest,
                   context: grpc.ServicerContext) -> indexer_pb2.QueryByKeyResponse:
        end = request.end_timestamp or INT64_MAX
        max_num = request.max_num or DEFAULT_MAX_NUM
        check_topic_name(request.topic)
        check_key(request.key)
        if request.begin_timestamp < 0 or request.begin_timestamp > end:
            raise InvalidArgumentError(f"begin_timestamp {request.begin_timestamp} must be within 0..end "
                                       f"timestamp {end}")
        if not 1 <= max_num <= MAX_NUM:
            raise InvalidArgumentError(f"max_num {request.max_num} must be within 0..{MAX_NUM} "
                                       f"(0 means {DEFAULT_MAX_NUM})")
        if not 0 <= request.skip <= MAX_HITS_WALKED - max_num:
            raise InvalidArgumentError(f"skip {request.skip} must be within 0..{MAX_HITS_WALKED - max_num} "
                                       f"(skip + max_num is at most {MAX_HITS_WALKED})")
        result = self.store.query_by_key(request.topic, request.key, max_num, request.begin_timestamp, end,
                                         request.skip)
        return indexer_pb2.QueryByKeyResponse(
            commitlog_offsets=result.phy_offsets,
            index_last_update_timestamp=result.index_last_update_timestamp,
            index_last_update_phy_offset=result.index_last_update_phy_offset)

    @rpc
    def GetDispatchStatus(self, request: indexer_pb2.GetDispatchStatusRequest,
                          context: grpc.ServicerContext) -> indexer_pb2.DispatchStatus:
        reput, lag = self.reput, self.reput.lag
        return indexer_pb2.DispatchStatus(
            reput_offset=self.store.reput_offset, commitlog_max_offset=lag.commitlog_max_offset,
            behind_bytes=reput.behind_bytes, behind_ms=reput.behind_ms, connected=lag.connected,
            commitlog_incarnation=lag.commitlog_incarnation, dispatched_records=self.store.dispatched_records)

    @rpc
    def WatchArrivals(self, request: indexer_pb2.WatchArrivalsRequest,
                      context: grpc.ServicerContext) -> Iterator[indexer_pb2.Arrival]:
        subscription = self.hub.subscribe()
        try:
            while context.is_active() and not self.stopping.is_set():
                try:
                    arrivals = subscription.get(timeout=HEARTBEAT_S)
                except queue.Empty:
                    continue
                if arrivals is None:  # the service stops
                    return
                reput, truncated = arrivals.reput_offset, arrivals.truncated
                for (topic, queue_id), max_offset in arrivals.maxima.items():
                    yield indexer_pb2.Arrival(topic=topic, queue_id=queue_id, max_offset=max_offset,
                                              reput_offset=reput, truncated=truncated)
                if truncated and not arrivals.maxima:
                    yield indexer_pb2.Arrival(reput_offset=reput, truncated=True)
                if arrivals.deleted:
                    yield indexer_pb2.Arrival(topic=arrivals.deleted, reput_offset=reput, deleted=True)
        finally:
            self.hub.unsubscribe(subscription)

    @rpc
    def DeleteTopic(self, request: admin_pb2.DeleteTopicRequest,
                    context: grpc.ServicerContext) -> admin_pb2.DeleteTopicResponse:
        check_deletable_topic(request.topic)
        if request.commitlog_offset < 0:
            raise InvalidArgumentError(f"commitlog_offset {request.commitlog_offset} is negative")
        deleted = delete_topic(self.store, request.topic, request.commitlog_offset,
                               context.time_remaining() or DELETE_WAIT_S)
        return admin_pb2.DeleteTopicResponse(deleted_queues=deleted)

    @rpc
    def ListQueues(self, request: indexer_pb2.ListQueuesRequest,
                   context: grpc.ServicerContext) -> indexer_pb2.ListQueuesResponse:
        return indexer_pb2.ListQueuesResponse(queues=[_queue_offsets(cq) for cq in self.store.consume_queues.queues()])


def _queue_offsets(cq: ConsumeQueue) -> indexer_pb2.QueueOffsets:
    return indexer_pb2.QueueOffsets(topic=cq.topic, queue_id=cq.queue_id, min_offset=cq.min_offset_in_queue,
                                    max_offset=cq.max_offset_in_queue, max_physic_offset=cq.max_physic_offset)
