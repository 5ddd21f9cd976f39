"""Consumer groups with two shards behind one gateway (real processes): a heartbeat reaches every
shard's query service and the answer is their union, so the group goes on when one query service dies;
DescribeGroups numbers queues by route (shard b's after shard a's) with each shard's offsets."""

from __future__ import annotations

import time

from mqstore.v1 import groups_pb2, query_pb2
from tests.gateway import test_gateway_shards as shards
from tests.gateway.test_gateway_shards import Cluster, create, send

#: The two-shard system of test_gateway_shards (module scope: this module starts its own).
cluster = shards.cluster

GROUP = "shardedGroup"


def _heartbeat(cluster: Cluster, client_id: str, topic: str, *queues: int) -> groups_pb2.HeartbeatResponse:
    request = groups_pb2.HeartbeatRequest(group=GROUP, client_id=client_id, topics=[topic],
                                          rebalance_interval_ms=500, member_timeout_ms=1500)
    for q in queues:
        request.assigned_queues.add(topic=topic, queue_id=q)
    return cluster.stub.Heartbeat(request, timeout=10)


def test_route_queue_ids_and_offsets_of_both_shards(cluster: Cluster) -> None:
    topic = "groupsSharded"
    create(cluster, topic, queues=2)  # route queues 0, 1 on shard-a; 2, 3 on shard-b
    for _ in range(4):
        send(cluster, topic, queue_id=3)
    deadline = time.monotonic() + 10
    while cluster.stub.GetQueueOffsets(query_pb2.GetQueueOffsetRangeRequest(topic=topic, queue_id=3),
                                       timeout=10).max_offset < 4:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    cluster.stub.CommitOffset(query_pb2.UpdateConsumerOffsetRequest(consumer_group=GROUP, topic=topic, queue_id=3,
                                                                    offset=1), timeout=10)
    _heartbeat(cluster, "m@1", topic, 0, 1)
    answer = _heartbeat(cluster, "m@2", topic, 2, 3)
    assert list(answer.member_ids) == ["m@1", "m@2"]
    (described,) = cluster.stub.DescribeGroups(groups_pb2.DescribeGroupsRequest(group=GROUP), timeout=10).groups
    rows = [(q.queue_id, q.shard, q.max_offset, q.committed_offset, q.lag, q.owner_client_id)
            for q in described.queues]
    assert rows == [(0, "shard-a", 0, -1, 0, "m@1"), (1, "shard-a", 0, -1, 0, "m@1"),
                    (2, "shard-b", 0, -1, 0, "m@2"), (3, "shard-b", 4, 1, 3, "m@2")]
    assert described.total_lag == 3


def test_heartbeats_go_on_when_one_query_service_is_gone(cluster: Cluster) -> None:
    topic = "groupsShardDown"
    create(cluster, topic, queues=1)
    _heartbeat(cluster, "d@1", topic, 0)
    cluster.a.query.kill9()
    answer = _heartbeat(cluster, "d@2", topic, 1)
    assert "d@1" in answer.member_ids and "d@2" in answer.member_ids, "shard b still knows both members"
