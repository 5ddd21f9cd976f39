"""Consumer group membership without processes: the query service's member table (expiry per member,
its bound) and the gateway's union of the shards' answers."""

from __future__ import annotations

import pytest

from gateway.groups import _union
from mqstore.v1 import groups_pb2
from services.query.consumer_manager import GroupMembers
from services.store.errors import InvalidArgumentError, ResourceExhaustedError
from services.store.rules.group_membership import check_client_id, member_timing


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_each_member_expires_after_its_own_timeout() -> None:
    clock = Clock()
    members = GroupMembers(clock)
    members.heartbeat("g", "fast", ("t",), (("t", 0),), "average", 100, 300)
    members.heartbeat("g", "slow", ("t",), (), "average", 1000, 3000)
    clock.now += 0.5
    assert [m.client_id for m in members.live("g")] == ["slow"]
    assert members.count == 1
    clock.now += 3
    assert members.live("g") == [] and members.groups() == [] and members.count == 0


def test_a_heartbeat_refreshes_and_unregister_forgets() -> None:
    clock = Clock()
    members = GroupMembers(clock)
    for _ in range(5):
        members.heartbeat("g", "a", ("t",), (), "average", 100, 300)
        clock.now += 0.2
    assert [m.client_id for m in members.live("g")] == ["a"]
    assert members.unregister("g", "a") and not members.unregister("g", "a")
    assert members.groups() == []


def test_the_table_is_bounded() -> None:
    members = GroupMembers(Clock(), max_members=2)
    members.heartbeat("g", "a", (), (), "", 100, 300)
    members.heartbeat("h", "b", (), (), "", 100, 300)
    members.heartbeat("g", "a", (), (), "", 100, 300)  # a known member is always refreshed
    with pytest.raises(ResourceExhaustedError, match="2 consumer group members"):
        members.heartbeat("g", "c", (), (), "", 100, 300)


def test_timing_defaults_and_bounds() -> None:
    assert member_timing(0, 0) == member_timing(20_000, 60_000)
    assert member_timing(500, 0).member_timeout_ms == 1500
    with pytest.raises(InvalidArgumentError, match="rebalance_interval_ms 99"):
        member_timing(99, 0)
    with pytest.raises(InvalidArgumentError, match="member_timeout_ms 3600001"):
        member_timing(1000, 3_600_001)


def test_the_union_keeps_each_members_latest_heartbeat() -> None:
    older = groups_pb2.GroupMember(client_id="b", last_heartbeat_ms=1, assigned_queues=[groups_pb2.QueueRef(
        topic="t", queue_id=0)])
    newer = groups_pb2.GroupMember(client_id="b", last_heartbeat_ms=2)
    other = groups_pb2.GroupMember(client_id="a", last_heartbeat_ms=1)
    merged = _union([[older, other], [newer]])
    assert [(m.client_id, m.last_heartbeat_ms, len(m.assigned_queues)) for m in merged] == [("a", 1, 0), ("b", 2, 0)]


@pytest.mark.parametrize("client_id", ["ab\n", "a b", "a/b", ""])
def test_a_client_id_must_be_legal_as_a_whole(client_id: str) -> None:
    with pytest.raises(InvalidArgumentError, match="client_id"):
        check_client_id(client_id)
    check_client_id("10.0.0.1@4242#a:b|c%d-e_f.g")
