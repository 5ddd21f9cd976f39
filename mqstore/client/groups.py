"""Consumer groups as an administrator sees them (``DescribeGroups``; ``mqstore groups``): members,
the queues each holds, and lag per queue, like ``kafka-consumer-groups --describe``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mqstore.client.connection import Endpoint
from mqstore.v1 import groups_pb2


@dataclass(frozen=True, slots=True)
class GroupMemberInfo:
    client_id: str
    topics: list[str]
    last_heartbeat_ms: int
    #: (topic, queue id) the member reports it consumes.
    queues: list[tuple[str, int]]
    allocation_strategy: str

    def to_json(self) -> dict[str, Any]:
        return {"client_id": self.client_id, "topics": self.topics, "last_heartbeat_ms": self.last_heartbeat_ms,
                "queues": [{"topic": t, "queue_id": q} for t, q in self.queues],
                "allocation_strategy": self.allocation_strategy}


@dataclass(frozen=True, slots=True)
class QueueLag:
    topic: str
    queue_id: int
    max_offset: int
    #: -1: the group never committed an offset for the queue.
    committed_offset: int
    lag: int
    #: The member that consumes the queue now ("" when none does).
    owner: str
    shard: str

    def to_json(self) -> dict[str, Any]:
        return {"topic": self.topic, "queue_id": self.queue_id, "max_offset": self.max_offset,
                "committed_offset": self.committed_offset, "lag": self.lag, "owner": self.owner, "shard": self.shard}


@dataclass(frozen=True, slots=True)
class GroupInfo:
    group: str
    members: list[GroupMemberInfo]
    queues: list[QueueLag]
    total_lag: int

    @classmethod
    def from_proto(cls, pb: Any) -> GroupInfo:
        members = [GroupMemberInfo(m.client_id, list(m.topics), m.last_heartbeat_ms,
                                   [(q.topic, q.queue_id) for q in m.assigned_queues], m.allocation_strategy)
                   for m in pb.members]
        queues = [QueueLag(q.topic, q.queue_id, q.max_offset, q.committed_offset, q.lag, q.owner_client_id, q.shard)
                  for q in pb.queues]
        return cls(pb.group, members, queues, pb.total_lag)

    def to_json(self) -> dict[str, Any]:
        return {"group": self.group, "members": [m.to_json() for m in self.members],
                "queues": [q.to_json() for q in self.queues], "total_lag": self.total_lag}


def describe_groups(endpoint: Endpoint, group: str | None = None, *, timeout: float | None = None) -> list[GroupInfo]:
    """One group (an unknown one is described empty), or every group with live members or offsets."""
    request = groups_pb2.DescribeGroupsRequest(group=group or "")
    response = endpoint.connection.call("DescribeGroups", request, timeout)
    return [GroupInfo.from_proto(g) for g in response.groups]
