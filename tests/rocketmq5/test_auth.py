"""Tokens with RocketMQ 5's protocol: the client's access key is the gateway's token (its signature's
``Credential=<AK>``). Without a known one a call is UNAUTHORIZED; outside the token's topics FORBIDDEN;
with it, the send goes through (a real system started with ``mqstore up --auth-file``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from mqstore.apache.rocketmq.v2 import definition_pb2 as d
from mqstore.apache.rocketmq.v2 import service_pb2 as s
from mqstore.apache.rocketmq.v2 import service_pb2_grpc
from mqstore.v1 import commitlog_pb2, common_pb2
from tests.gateway.system_process import UpProcess, running_up

TOKENS = """
tokens:
  - name: orders-producer
    token: tok-orders-producer
    produce: ["orders"]
  - name: ops
    token: tok-ops-admin-1
    admin: true
"""


def signed(access_key: str) -> tuple[tuple[str, str], ...]:
    """What a RocketMQ 5 client sends (Signature.metadata of the Python client)."""
    return (("authorization", f"MQv2-HMAC-SHA1 Credential={access_key}, SignedHeaders=x-mq-date-time, "
             "Signature=0123456789ABCDEF"), ("x-mq-date-time", "20261125T000000Z"))


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpProcess]:
    root = tmp_path_factory.mktemp("auth")
    (root / "tokens.yaml").write_text(TOKENS)
    with running_up(root / "store", extra_args=["--auth-file", str(root / "tokens.yaml")]) as started:
        yield started


def test_the_access_key_is_the_token(secured: UpProcess) -> None:
    for topic in ("orders", "payments"):
        config = common_pb2.TopicConfig(topic=topic, read_queue_nums=1, write_queue_nums=1, perm=6)
        secured.stub.CreateTopic(commitlog_pb2.TopicRequest(topic=config), timeout=10,
                                 metadata=(("authorization", "Bearer tok-ops-admin-1"),))
    v2 = service_pb2_grpc.MessagingServiceStub(secured.channel)

    def send(topic: str, metadata: tuple[tuple[str, str], ...]) -> d.Status:
        message = d.Message(topic=d.Resource(name=topic), body=b"x", system_properties=d.SystemProperties(
            message_type=d.MessageType.NORMAL, body_encoding=d.Encoding.IDENTITY))
        return v2.SendMessage(s.SendMessageRequest(messages=[message]), timeout=10, metadata=metadata).status

    assert send("orders", signed("")).code == d.Code.UNAUTHORIZED
    assert send("orders", signed("tok-unknown")).code == d.Code.UNAUTHORIZED
    forbidden = send("payments", signed("tok-orders-producer"))
    assert forbidden.code == d.Code.FORBIDDEN and "payments" in forbidden.message
    assert send("orders", signed("tok-orders-producer")).code == d.Code.OK
