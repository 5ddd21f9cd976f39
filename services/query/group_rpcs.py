"""The query service's consumer group RPCs (Heartbeat, UnregisterConsumer, DescribeGroups): a mixin of
:class:`services.query.servicer.QueryServicer`, kept apart so that membership stays one concept."""

from __future__ import annotations

from typing import Any

from mqstore.v1 import groups_pb2
from services.query.consumer_manager import GroupMembers, Member
from services.query.consumer_offsets import ConsumerOffsetTable
from services.query.edge import rpc
from services.store.rules.group_membership import check_heartbeat, check_member
from services.store.rules.names import check_group


def member_to_proto(member: Member, out: groups_pb2.GroupMember) -> None:
    out.client_id = member.client_id
    out.topics.extend(member.topics)
    out.last_heartbeat_ms = member.last_heartbeat_ms
    out.allocation_strategy = member.strategy
    for topic, queue_id in member.assigned:
        out.assigned_queues.add(topic=topic, queue_id=queue_id)


class GroupRpcs:
    _members: GroupMembers
    _consumer_offsets: ConsumerOffsetTable

    def _check_running(self) -> None:
        """QueryServicer's: UNAVAILABLE while stopping."""

    @rpc
    async def Heartbeat(self, request: groups_pb2.HeartbeatRequest, context: Any) -> groups_pb2.HeartbeatResponse:
        assigned = [(q.topic, q.queue_id) for q in request.assigned_queues]
        self._check_running()
        timing = check_heartbeat(request.group, request.client_id, list(request.topics), assigned,
                                 request.allocation_strategy, request.rebalance_interval_ms,
                                 request.member_timeout_ms)
        live = self._members.heartbeat(request.group, request.client_id, tuple(request.topics), tuple(assigned),
                                       request.allocation_strategy, timing.rebalance_interval_ms,
                                       timing.member_timeout_ms)
        response = groups_pb2.HeartbeatResponse(member_ids=[m.client_id for m in live],
                                                rebalance_interval_ms=timing.rebalance_interval_ms,
                                                member_timeout_ms=timing.member_timeout_ms)
        for member in live:
            member_to_proto(member, response.members.add())
        return response

    @rpc
    async def UnregisterConsumer(self, request: groups_pb2.UnregisterConsumerRequest,
                                 context: Any) -> groups_pb2.UnregisterConsumerResponse:
        check_member(request.group, request.client_id)
        self._members.unregister(request.group, request.client_id)
        return groups_pb2.UnregisterConsumerResponse()

    @rpc
    async def DescribeGroups(self, request: groups_pb2.DescribeGroupsRequest,
                             context: Any) -> groups_pb2.DescribeGroupsResponse:
        """Members and committed offsets (shard queue ids); max offsets and lag are the gateway's."""
        if request.group:
            check_group(request.group)
        offsets = self._consumer_offsets
        names = [request.group] if request.group else sorted(set(self._members.groups()) | set(offsets.groups()))
        response = groups_pb2.DescribeGroupsResponse()
        for name in names:
            description = response.groups.add(group=name)
            for member in self._members.live(name):
                member_to_proto(member, description.members.add())
            for (topic, queue_id), offset in sorted(offsets.offsets_of(name).items()):
                description.queues.add(topic=topic, queue_id=queue_id, committed_offset=offset)
        return response
