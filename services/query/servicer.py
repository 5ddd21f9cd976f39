"""QueryService: the gRPC edge of the query service, on a ``grpc.aio`` server.

Each handler validates and converts its request, calls one domain object, and maps a domain error to
exactly one status code. Handlers are coroutines: a long poll is a suspended coroutine, not a held
thread, so thousands can wait at once.
"""

from __future__ import annotations

import time

import grpc

from mqstore.v1 import query_pb2, query_pb2_grpc
from services.query import metrics
from services.query.consumer_manager import GroupMembers
from services.query.consumer_offsets import ConsumerOffsetTable
from services.query.convert import (
    pull_query_from_proto,
    pull_result_to_proto,
    query_response,
    view_response,
)
from services.query.edge import rpc
from services.query.group_rpcs import GroupRpcs
from services.query.lookup import MessageLookup
from services.query.offset_log import OffsetLog
from services.query.pop import PopService
from services.query.pop_checkpoints import PopCheckpointTable
from services.query.pop_rpcs import PopRpcs
from services.query.pull import Puller
from services.query.queue_offset_lookup import QueueOffsets
from services.store.errors import NotFoundError, OutOfRangeError, StoreError, UnavailableError
from services.store.formats.message_id import message_id_kind
from services.store.metadata_log import OffsetChange
from services.store.rules.cold_read import NEXT_FROM_FOLLOWER
from services.store.rules.names import check_group, check_offset, check_queue

SERVICE_NAME: str = query_pb2.DESCRIPTOR.services_by_name["QueryService"].full_name
# A long poll answers this much before the call's deadline, so the answer arrives in time.
DEADLINE_MARGIN_S = 0.1

Context = grpc.aio.ServicerContext[object, object]


class QueryServicer(GroupRpcs, PopRpcs, query_pb2_grpc.QueryServiceServicer):  # type: ignore[misc]
    def __init__(self, puller: Puller, lookup: MessageLookup, offsets: QueueOffsets,
                 consumer_offsets: ConsumerOffsetTable, max_long_poll_ms: int,
                 members: GroupMembers | None = None, pops: PopCheckpointTable | None = None,
                 sync_offset_commits: bool = False) -> None:
        self._puller = puller
        self._lookup = lookup
        self._offsets = offsets
        self._consumer_offsets = consumer_offsets
        #: Set on a replicated shard: commits go through the log (services/query/offset_log.py).
        self.offset_log: OffsetLog | None = None
        self._members = members if members is not None else GroupMembers()
        pops = pops if pops is not None else PopCheckpointTable(consumer_offsets.path.parent)
        self._pop = PopService(pops, consumer_offsets, puller, offsets)
        self._max_long_poll_ms = max_long_poll_ms
        self._sync_offset_commits = sync_offset_commits
        self._stopping = False

    def replicate_offsets(self, offset_log: OffsetLog) -> None:
        """A replicated shard: commits and the offsets pops move go through the log (offset_log.py)."""
        self.offset_log = self._pop.offset_log = offset_log

    def begin_shutdown(self) -> None:
        """New calls fail UNAVAILABLE; waiting long polls are released by the arrival watcher's stop."""
        self._stopping = True

    def _check_running(self) -> None:
        if self._stopping:
            raise UnavailableError("the query service is stopping: retry on another instance or later")

    @rpc
    async def PullMessage(self, request: query_pb2.PullMessageRequest,
                          context: Context) -> query_pb2.PullMessageResponse:
        started = time.monotonic()
        try:
            self._check_running()
            query = pull_query_from_proto(request, self._max_long_poll_ms)
            remaining = context.time_remaining()
            deadline = None if remaining is None else started + remaining - DEADLINE_MARGIN_S
            result = await self._puller.pull(query, deadline, request.raw_records)
        except StoreError:
            metrics.PULL_LATENCY.observe(time.monotonic() - started)
            raise
        metrics.observe_pull(result, time.monotonic() - started)
        if result.cold:
            context.set_trailing_metadata(((NEXT_FROM_FOLLOWER, str(result.next_begin_offset)),))
        return pull_result_to_proto(result)

    @rpc
    async def ViewMessage(self, request: query_pb2.ViewMessageRequest,
                          context: Context) -> query_pb2.ViewMessageResponse:
        self._check_running()
        message, found_by = await self._lookup.view(request.msg_id, request.topic,
                                                    message_id_kind(request.kind))
        metrics.VIEW_LOOKUPS.inc()
        metrics.LOOKUP_MESSAGES.inc()
        return view_response(message, found_by)

    @rpc
    async def QueryMessage(self, request: query_pb2.QueryMessageRequest,
                           context: Context) -> query_pb2.QueryMessageResponse:
        self._check_running()
        result = await self._lookup.query(request.topic, request.key, request.begin_timestamp,
                                          request.end_timestamp, request.max_num)
        metrics.KEY_LOOKUPS.inc()
        metrics.LOOKUP_MESSAGES.inc(len(result.messages))
        return query_response(result)

    @rpc
    async def SearchOffset(self, request: query_pb2.SearchOffsetRequest,
                           context: Context) -> query_pb2.SearchOffsetResponse:
        self._check_running()
        offset = await self._offsets.offset_by_time(request.topic, request.queue_id, request.timestamp)
        return query_pb2.SearchOffsetResponse(offset=offset)

    @rpc
    async def GetQueueOffsetRange(self, request: query_pb2.GetQueueOffsetRangeRequest,
                                  context: Context) -> query_pb2.QueueOffsetRange:
        self._check_running()
        min_offset, max_offset = await self._offsets.offset_range(request.topic, request.queue_id)
        return query_pb2.QueueOffsetRange(topic=request.topic, queue_id=request.queue_id, min_offset=min_offset,
                                          max_offset=max_offset)

    @rpc
    async def GetEarliestMsgStoreTime(self, request: query_pb2.GetEarliestMsgStoreTimeRequest,
                                      context: Context) -> query_pb2.GetEarliestMsgStoreTimeResponse:
        self._check_running()
        stamp = await self._offsets.earliest_store_time(request.topic, request.queue_id)
        return query_pb2.GetEarliestMsgStoreTimeResponse(store_timestamp=stamp)

    @rpc
    async def UpdateConsumerOffset(self, request: query_pb2.UpdateConsumerOffsetRequest,
                                   context: Context) -> query_pb2.UpdateConsumerOffsetResponse:
        self._check_running()
        check_group(request.consumer_group)
        check_queue(request.topic, request.queue_id)
        check_offset("offset", request.offset)
        await self._check_committable(request.topic, request.queue_id, request.offset)
        if self.offset_log is None:
            self._consumer_offsets.commit(request.consumer_group, request.topic, request.queue_id, request.offset)
        else:  # a replicated shard: through the log, offset_log.py
            await self.offset_log.commit(OffsetChange(request.consumer_group, request.topic, request.queue_id,
                                                      request.offset))
        await self._offset_commit_durable()
        metrics.OFFSET_COMMITS.inc()
        return query_pb2.UpdateConsumerOffsetResponse()

    async def _offset_commit_durable(self) -> None:
        """With syncConsumerOffsetCommit (SYNC_FLUSH), wait until the offsets committed so far are on disk,
        so an answered commit survives a power cut; else the periodic write keeps them."""
        if not self._sync_offset_commits:
            return
        try:
            await self._consumer_offsets.durable()
        except OSError as exc:
            raise UnavailableError(f"the consumer offset is set but could not be made durable ({exc}): commit "
                                   "it again") from exc

    async def _check_committable(self, topic: str, queue_id: int, offset: int) -> None:
        """A group consumes at most up to the queue's max offset (the next one to be written): an offset
        past it names no message a consumer could have read, and would skip every message until the
        queue caught up with it."""
        _, max_offset = await self._offsets.offset_range(topic, queue_id)
        if offset > max_offset:
            raise OutOfRangeError(f"offset {offset} is past the max offset {max_offset} of {topic}/{queue_id}: "
                                  "commit the offset after the last message consumed (at most the max offset)")

    @rpc
    async def QueryConsumerOffset(self, request: query_pb2.QueryConsumerOffsetRequest,
                                  context: Context) -> query_pb2.QueryConsumerOffsetResponse:
        self._check_running()
        check_group(request.consumer_group)
        check_queue(request.topic, request.queue_id)
        if self.offset_log is not None:
            await self.offset_log.caught_up()
        offset = self._consumer_offsets.query(request.consumer_group, request.topic, request.queue_id)
        if offset is None:
            raise NotFoundError(f"group {request.consumer_group!r} has committed no offset for "
                                f"{request.topic}/{request.queue_id}")
        return query_pb2.QueryConsumerOffsetResponse(offset=offset)
