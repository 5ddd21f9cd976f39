"""Consumer groups with tokens on (``mqstore up --auth-file``): a member must be allowed to consume
every topic it names; DescribeGroups shows only queues of topics the caller may consume; one tenant
neither sees nor removes nor impersonates another tenant's members (a test per RPC that takes a group or
a client id, with two tokens)."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from gateway.auth import ANONYMOUS, Principal
from gateway.groups import _visible_members
from mqstore.v1 import gateway_pb2, groups_pb2, query_pb2
from tests.gateway import test_gateway_auth as auth
from tests.gateway.system_process import UpProcess, running_up

#: Tenant B: its own topic and its group's retry topic; tenant A is test_gateway_auth's orders-consumer.
TENANT_B = (("authorization", "Bearer tok-payments-team"),)
TOKENS = auth.TOKENS + """  - name: payments-team
    token: tok-payments-team
    produce: ["payments"]
    consume: ["payments", "%RETRY%payGroup"]
"""
B_GROUP, B_MEMBER = "payGroup", "b@pay-1"


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpProcess]:
    root = tmp_path_factory.mktemp("groups-auth")
    (root / "tokens.yaml").write_text(TOKENS)
    with running_up(root / "store", extra_args=["--auth-file", str(root / "tokens.yaml")]) as started:
        yield started


def _b_joins(up: UpProcess) -> None:
    """B's member of B's group, with a committed offset on B's topic."""
    request = groups_pb2.HeartbeatRequest(group=B_GROUP, client_id=B_MEMBER, topics=["payments", "%RETRY%payGroup"],
                                          assigned_queues=[groups_pb2.QueueRef(topic="payments", queue_id=0)])
    up.stub.Heartbeat(request, timeout=10, metadata=TENANT_B)
    up.stub.Send(auth.message("payments"), timeout=10, metadata=TENANT_B)
    up.stub.CommitOffset(query_pb2.UpdateConsumerOffsetRequest(consumer_group=B_GROUP, topic="payments", queue_id=0,
                                                               offset=0), timeout=10, metadata=TENANT_B)


def _b_members(up: UpProcess) -> list[str]:
    (group,) = up.stub.DescribeGroups(groups_pb2.DescribeGroupsRequest(group=B_GROUP), timeout=10,
                                      metadata=TENANT_B).groups
    return [m.client_id for m in group.members]


def _heartbeat(up: UpProcess, topics: list[str], metadata: tuple[tuple[str, str], ...] | None) -> object:
    request = groups_pb2.HeartbeatRequest(group="securedGroup", client_id="c@1", topics=topics)
    return up.stub.Heartbeat(request, timeout=10, metadata=metadata)


def test_members_need_consume_permission_on_their_topics(secured: UpProcess) -> None:
    assert list(_heartbeat(secured, ["orders"], auth.CONSUMER).member_ids) == ["c@1"]  # type: ignore[attr-defined]
    for topics, metadata, code in ((["orders", "payments"], auth.CONSUMER, grpc.StatusCode.PERMISSION_DENIED),
                                   (["orders"], auth.PRODUCER, grpc.StatusCode.PERMISSION_DENIED),
                                   (["orders"], None, grpc.StatusCode.UNAUTHENTICATED)):
        with pytest.raises(grpc.RpcError) as caught:
            _heartbeat(secured, topics, metadata)
        assert caught.value.code() == code, caught.value.details()


def test_describe_shows_only_topics_the_caller_may_consume(secured: UpProcess) -> None:
    for topic in ("orders", "orders-private"):
        secured.stub.Send(auth.message(topic), timeout=10, metadata=auth.ADMIN if topic != "orders" else
                          auth.PRODUCER)
        secured.stub.CommitOffset(query_pb2.UpdateConsumerOffsetRequest(consumer_group="seenGroup", topic=topic,
                                                                        queue_id=0, offset=0), timeout=10,
                                  metadata=auth.ADMIN)
    request = groups_pb2.DescribeGroupsRequest(group="seenGroup")
    (mine,) = secured.stub.DescribeGroups(request, timeout=10, metadata=auth.CONSUMER).groups
    assert {q.topic for q in mine.queues} == {"orders"}
    (everything,) = secured.stub.DescribeGroups(request, timeout=10, metadata=auth.ADMIN).groups
    assert {q.topic for q in everything.queues} == {"orders", "orders-private"}


def test_describe_of_another_tenants_group_is_denied(secured: UpProcess) -> None:
    _b_joins(secured)
    assert auth.code_of(secured.stub.DescribeGroups, groups_pb2.DescribeGroupsRequest(group=B_GROUP),
                        auth.CONSUMER) == grpc.StatusCode.PERMISSION_DENIED
    listed = secured.stub.DescribeGroups(groups_pb2.DescribeGroupsRequest(), timeout=10, metadata=auth.CONSUMER)
    assert B_GROUP not in {g.group for g in listed.groups}
    assert B_MEMBER not in {m.client_id for g in listed.groups for m in g.members}
    assert _b_members(secured) == [B_MEMBER]


def test_unregister_of_another_tenants_member_is_denied(secured: UpProcess) -> None:
    _b_joins(secured)
    for client_id in (B_MEMBER, "no-such@member"):  # denied whether or not the member exists: no probing
        request = groups_pb2.UnregisterConsumerRequest(group=B_GROUP, client_id=client_id)
        assert auth.code_of(secured.stub.UnregisterConsumer, request, auth.CONSUMER) == \
            grpc.StatusCode.PERMISSION_DENIED
    assert _b_members(secured) == [B_MEMBER]
    request = groups_pb2.UnregisterConsumerRequest(group=B_GROUP, client_id=B_MEMBER)
    secured.stub.UnregisterConsumer(request, timeout=10, metadata=TENANT_B)
    assert _b_members(secured) == []


def test_heartbeat_neither_takes_over_nor_shows_another_tenants_member(secured: UpProcess) -> None:
    _b_joins(secured)
    takeover = groups_pb2.HeartbeatRequest(group=B_GROUP, client_id=B_MEMBER, topics=["orders"])
    assert auth.code_of(secured.stub.Heartbeat, takeover, auth.CONSUMER) == grpc.StatusCode.PERMISSION_DENIED
    joined = secured.stub.Heartbeat(groups_pb2.HeartbeatRequest(group=B_GROUP, client_id="a@orders-1",
                                                                topics=["orders"]),
                                    timeout=10, metadata=auth.CONSUMER)
    assert list(joined.member_ids) == ["a@orders-1"]
    assert [m.client_id for m in joined.members] == ["a@orders-1"]
    secured.stub.UnregisterConsumer(groups_pb2.UnregisterConsumerRequest(group=B_GROUP, client_id="a@orders-1"),
                                    timeout=10, metadata=auth.CONSUMER)
    assert _b_members(secured) == [B_MEMBER]


def test_offsets_of_another_tenants_group_are_denied(secured: UpProcess) -> None:
    _b_joins(secured)
    commit = query_pb2.UpdateConsumerOffsetRequest(consumer_group=B_GROUP, topic="payments", queue_id=0, offset=1)
    query = query_pb2.QueryConsumerOffsetRequest(consumer_group=B_GROUP, topic="payments", queue_id=0)
    assert auth.code_of(secured.stub.CommitOffset, commit, auth.CONSUMER) == grpc.StatusCode.PERMISSION_DENIED
    assert auth.code_of(secured.stub.QueryOffset, query, auth.CONSUMER) == grpc.StatusCode.PERMISSION_DENIED
    assert secured.stub.QueryOffset(query, timeout=10, metadata=TENANT_B).offset == 0


def test_send_back_into_another_tenants_group_is_denied(secured: UpProcess) -> None:
    _b_joins(secured)
    sent = secured.stub.Send(auth.message("orders"), timeout=10, metadata=auth.PRODUCER)
    into_b = gateway_pb2.ConsumerSendBackRequest(group=B_GROUP, msg_id=sent.offset_msg_id, topic="orders")
    assert auth.code_of(secured.stub.ConsumerSendBack, into_b, auth.CONSUMER) == grpc.StatusCode.PERMISSION_DENIED
    own = gateway_pb2.ConsumerSendBackRequest(group="ordersGroup", msg_id=sent.offset_msg_id, topic="orders")
    secured.stub.ConsumerSendBack(own, timeout=10, metadata=auth.CONSUMER)


def test_a_member_is_shown_with_only_the_callers_topics() -> None:
    caller = Principal("a", consume=("orders",))
    shared = groups_pb2.GroupMember(client_id="m@1", topics=["orders", "payments"],
                                    assigned_queues=[groups_pb2.QueueRef(topic="orders", queue_id=0),
                                                     groups_pb2.QueueRef(topic="payments", queue_id=1)])
    foreign = groups_pb2.GroupMember(client_id="m@2", topics=["payments"])
    (shown,) = _visible_members(caller, [shared, foreign])
    assert shown.client_id == "m@1" and list(shown.topics) == ["orders"]
    assert [(q.topic, q.queue_id) for q in shown.assigned_queues] == [("orders", 0)]
    assert _visible_members(ANONYMOUS, [shared, foreign]) == [shared, foreign]
