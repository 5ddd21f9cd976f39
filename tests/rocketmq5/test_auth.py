"""Tokens with RocketMQ 5's protocol: a client signs its requests (``MQv2-HMAC-SHA1``) with a token's
name as access key and the token as secret key; the gateway verifies the signature. A wrong secret or an
unknown key is UNAUTHORIZED; outside the token's topics FORBIDDEN; with it, the send goes through (a real
system started with ``mqstore up --auth-file``, and the official Python client)."""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from apache.rocketmq.v2 import definition_pb2 as d
from apache.rocketmq.v2 import service_pb2 as s
from apache.rocketmq.v2 import service_pb2_grpc
from mqstore.v1 import commitlog_pb2, common_pb2
from tests.gateway.system_process import UpProcess, running_up
from tests.rocketmq5.test_official_python_client import official

TOKENS = """
tokens:
  - name: orders-producer
    token: tok-orders-producer
    produce: ["orders"]
  - name: ops
    token: tok-ops-admin-1
    admin: true
"""


def signed(access_key: str, secret: str) -> tuple[tuple[str, str], ...]:
    """What a RocketMQ 5 client sends (Signature.metadata of the Python client)."""
    date_time = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    signature = hmac.new(secret.encode(), date_time.encode(), hashlib.sha1).hexdigest()
    return (("authorization", f"MQv2-HMAC-SHA1 Credential={access_key}, SignedHeaders=x-mq-date-time, "
             f"Signature={signature}"), ("x-mq-date-time", date_time))


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

    assert send("orders", signed("", "tok-orders-producer")).code == d.Code.UNAUTHORIZED
    assert send("orders", signed("tok-unknown", "tok-orders-producer")).code == d.Code.UNAUTHORIZED
    assert send("orders", signed("orders-producer", "wrong-secret")).code == d.Code.UNAUTHORIZED
    assert send("orders", signed("tok-orders-producer", "anything")).code == d.Code.UNAUTHORIZED, \
        "the token is the secret: it is never sent, and is no access key"
    forbidden = send("payments", signed("orders-producer", "tok-orders-producer"))
    assert forbidden.code == d.Code.FORBIDDEN and "payments" in forbidden.message
    assert send("orders", signed("orders-producer", "tok-orders-producer")).code == d.Code.OK


def test_the_official_client_signs_with_the_secret(secured: UpProcess, tmp_path: Path) -> None:
    right = official("signed_send", secured.gateway, tmp_path, topic="orders", ak="orders-producer",
                     sk="tok-orders-producer")
    assert "sent" in right, right
    home = tmp_path / "wrong"
    home.mkdir()
    wrong = official("signed_send", secured.gateway, home, topic="orders", ak="orders-producer",
                     sk="not-the-secret", timeout_s=120)
    assert "sent" not in wrong, wrong
    client_log = (home / "logs" / "rocketmq_python" / "rocketmq_client.log").read_text()
    assert "40100, unknown access key or wrong secret key" in client_log, "the route lookup was UNAUTHORIZED"
