"""Consumer groups with tokens on (``mqstore up --auth-file``): a member must be allowed to consume
every topic it names; DescribeGroups shows only queues of topics the caller may consume."""

from __future__ import annotations

import grpc
import pytest

from mqstore.v1 import groups_pb2, query_pb2
from tests.gateway import test_gateway_auth as auth
from tests.gateway.system_process import UpProcess

#: The system with tokens of test_gateway_auth (module scope: this module starts its own).
secured = auth.secured


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
