"""The official client's PushConsumer against ``mqstore up``: its listener consumes, a message the
listener fails comes back (next delivery attempt, after the retry delay) and ends in %DLQ%<group> after
the group's max delivery attempts (MQSTORE_RMQ5_MAX_DELIVERY_ATTEMPTS, 2 here), readable through
mqstore.v1."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from apache.rocketmq.v2 import definition_pb2 as d
from apache.rocketmq.v2 import service_pb2 as s
from apache.rocketmq.v2 import service_pb2_grpc
from mqstore.v1 import query_pb2
from tests.gateway.system_process import UpProcess, running_up
from tests.rocketmq5.test_official_python_client import official
from tests.rocketmq5.topics import create_topic

ATTEMPTS = 2


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpProcess]:
    settings = {"MQSTORE_RMQ5_MAX_DELIVERY_ATTEMPTS": str(ATTEMPTS)}
    with running_up(tmp_path_factory.mktemp("up") / "store", settings) as started:
        yield started


def test_push_consumer_retries_then_dead_letters(up: UpProcess, tmp_path: Path) -> None:
    topic, group = "rmq5-push", "rmq5-push-group"
    create_topic(up, topic, 2)
    v2 = service_pb2_grpc.MessagingServiceStub(up.channel)
    for body in (b"good", b"bad"):
        message = d.Message(topic=d.Resource(name=topic), body=body, system_properties=d.SystemProperties(
            tag="P", message_type=d.MessageType.NORMAL, body_encoding=d.Encoding.IDENTITY))
        assert v2.SendMessage(s.SendMessageRequest(messages=[message]), timeout=10).status.code == d.Code.OK

    seen = official("push", up.gateway, tmp_path, topic=topic, group=group, fail="bad", attempts=ATTEMPTS,
                    wait_s=40, linger_s=7)["seen"]
    assert [m["attempt"] for m in seen if m["body"] == "good"] == [1]
    bad = [m for m in seen if m["body"] == "bad"]
    assert [m["attempt"] for m in bad] == list(range(1, ATTEMPTS + 1)), "retried, then not delivered again"
    assert bad[1]["at"] - bad[0]["at"] >= 0.9, "the retry waits for the group's first retry delay (1 s)"

    dlq = up.stub.Pull(query_pb2.PullMessageRequest(topic=f"%DLQ%{group}", queue_id=0, queue_offset=0,
                                                    long_poll_ms=3000), timeout=10)
    assert [m.body for m in dlq.messages] == [b"bad"]
    assert dlq.messages[0].uniq_key == bad[0]["id"]
