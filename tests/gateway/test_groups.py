"""Consumer group membership through the gateway against a real system (``mqstore up``): heartbeats,
expiry after the member's timeout, unregistering, DescribeGroups' lag, and bad input."""

from __future__ import annotations

import time

import grpc
import pytest

from mqstore.v1 import commitlog_pb2, common_pb2, gateway_pb2, groups_pb2, query_pb2
from tests.gateway.system_process import UpProcess


def _heartbeat(up: UpProcess, group: str, client_id: str, topics: list[str] | None = None,
               assigned: list[tuple[str, int]] | None = None, **timing: int) -> groups_pb2.HeartbeatResponse:
    request = groups_pb2.HeartbeatRequest(group=group, client_id=client_id, topics=topics or [],
                                          allocation_strategy="average", **timing)
    for topic, queue_id in assigned or []:
        request.assigned_queues.add(topic=topic, queue_id=queue_id)
    return up.stub.Heartbeat(request, timeout=10)


def _describe(up: UpProcess, group: str) -> groups_pb2.GroupDescription:
    answer = up.stub.DescribeGroups(groups_pb2.DescribeGroupsRequest(group=group), timeout=10)
    (description,) = answer.groups
    return description


def test_members_join_expire_and_unregister(up: UpProcess) -> None:
    group = "groupsMembership"
    first = _heartbeat(up, group, "host@1", ["GroupsT"], rebalance_interval_ms=200, member_timeout_ms=600)
    assert list(first.member_ids) == ["host@1"]
    assert (first.rebalance_interval_ms, first.member_timeout_ms) == (200, 600)
    second = _heartbeat(up, group, "host@2", ["GroupsT"], [("GroupsT", 0)], rebalance_interval_ms=200,
                        member_timeout_ms=600)
    assert list(second.member_ids) == ["host@1", "host@2"]
    assert [(q.topic, q.queue_id) for q in second.members[1].assigned_queues] == [("GroupsT", 0)]
    # host@1 stops heartbeating: dropped after its timeout; host@2 keeps going.
    deadline = time.monotonic() + 5
    while True:
        answer = _heartbeat(up, group, "host@2", ["GroupsT"], rebalance_interval_ms=200, member_timeout_ms=600)
        if list(answer.member_ids) == ["host@2"]:
            break
        assert time.monotonic() < deadline, "host@1 was never dropped"
        time.sleep(0.1)
    up.stub.UnregisterConsumer(groups_pb2.UnregisterConsumerRequest(group=group, client_id="host@2"), timeout=10)
    assert list(_describe(up, group).members) == []


def test_default_timing_is_rocketmqs_interval_and_three_of_them(up: UpProcess) -> None:
    answer = _heartbeat(up, "groupsDefaults", "c@1")
    assert (answer.rebalance_interval_ms, answer.member_timeout_ms) == (20_000, 60_000)


def test_describe_groups_lag_is_max_minus_committed(up: UpProcess) -> None:
    group, topic = "groupsLag", "GroupsLagTopic"
    up.stub.CreateTopic(commitlog_pb2.TopicRequest(topic=common_pb2.TopicConfig(
        topic=topic, read_queue_nums=2, write_queue_nums=2, perm=6)), timeout=10)
    for i in range(5):
        up.stub.Send(gateway_pb2.SendRequest(message=common_pb2.Message(topic=topic, body=b"m%d" % i), queue_id=0),
                     timeout=10)
    up.stub.Send(gateway_pb2.SendRequest(message=common_pb2.Message(topic=topic, body=b"x"), queue_id=1), timeout=10)
    deadline = time.monotonic() + 10
    while up.stub.GetQueueOffsets(query_pb2.GetQueueOffsetRangeRequest(topic=topic, queue_id=0),
                                  timeout=10).max_offset < 5:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    up.stub.CommitOffset(query_pb2.UpdateConsumerOffsetRequest(consumer_group=group, topic=topic, queue_id=0,
                                                               offset=2), timeout=10)
    _heartbeat(up, group, "owner@1", [topic], [(topic, 0)])
    description = _describe(up, group)
    assert [m.client_id for m in description.members] == ["owner@1"]
    rows = [(q.topic, q.queue_id, q.max_offset, q.committed_offset, q.lag, q.owner_client_id)
            for q in description.queues]
    assert rows == [(topic, 0, 5, 2, 3, "owner@1"), (topic, 1, 1, -1, 1, "")]
    assert description.total_lag == 4
    everything = up.stub.DescribeGroups(groups_pb2.DescribeGroupsRequest(), timeout=10)
    assert group in [g.group for g in everything.groups]
    up.stub.UnregisterConsumer(groups_pb2.UnregisterConsumerRequest(group=group, client_id="owner@1"), timeout=10)


@pytest.mark.parametrize(("group", "client_id", "fields", "says"), [
    ("", "c@1", {}, "consumer group is empty"),
    ("g h", "c@1", {}, "illegal characters"),
    ("groupsBad", "", {}, "client_id is empty"),
    ("groupsBad", "c 1", {}, "client_id 'c 1' has illegal characters"),
    ("groupsBad", "c/1", {}, "illegal characters"),
    ("groupsBad", "c" * 256, {}, "longer than 255"),
    ("groupsBad", "c@1", {"rebalance_interval_ms": 50}, "rebalance_interval_ms 50 must be within 100..600000"),
    ("groupsBad", "c@1", {"rebalance_interval_ms": 1000, "member_timeout_ms": 500}, "member_timeout_ms 500"),
    ("groupsBad", "c@1", {"rebalance_interval_ms": -1}, "rebalance_interval_ms -1"),
])
def test_bad_heartbeats_are_invalid_argument(up: UpProcess, group: str, client_id: str, fields: dict[str, int],
                                            says: str) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        _heartbeat(up, group, client_id, ["GroupsT"], **fields)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value.details()
    assert says in (caught.value.details() or "")


def test_a_queue_of_a_topic_not_named_is_invalid_argument(up: UpProcess) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        _heartbeat(up, "groupsBad", "c@1", ["GroupsT"], [("Other", 0)])
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "Other/0 is of a topic the heartbeat does not name" in (caught.value.details() or "")


@pytest.mark.parametrize(("group", "client_id"), [("", "c@1"), ("groupsBad", ""), ("groupsBad", "a b")])
def test_bad_unregister_and_describe_are_invalid_argument(up: UpProcess, group: str, client_id: str) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        up.stub.UnregisterConsumer(groups_pb2.UnregisterConsumerRequest(group=group, client_id=client_id),
                                   timeout=10)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as caught:
        up.stub.DescribeGroups(groups_pb2.DescribeGroupsRequest(group="bad group"), timeout=10)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
