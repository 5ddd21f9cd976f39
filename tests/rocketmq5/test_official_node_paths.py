"""The official RocketMQ 5 Node.js client's PushConsumer and TransactionChecker against ``mqstore up``.

Both verify the ``body_digest`` of every message they get: a digest they cannot match makes the
PushConsumer discard the message as corrupted (it is nacked until it reaches the DLQ) and the checker
fail to decode the half (it is never answered). RocketMQ's proxy sends MD5 in uppercase hex, which every
official client checks the same way; so does the gateway.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mqstore.v1 import query_pb2
from tests.gateway.system_process import UpProcess, running_up
from tests.rocketmq5.test_official_node_client import node_client  # noqa: F401 - the npm ci fixture
from tests.rocketmq5.topics import create_topic, stored

ATTEMPTS = 2
ENV = {"MQSTORE_RMQ5_MAX_DELIVERY_ATTEMPTS": str(ATTEMPTS), "MQSTORE_TRANSACTION_TIMEOUT_MS": "1000",
       "MQSTORE_TRANSACTION_CHECK_INTERVAL_MS": "500"}


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpProcess]:
    with running_up(tmp_path_factory.mktemp("up") / "store", ENV) as started:
        yield started


def _node(script: str, node_dir: Path, tmp_path: Path, *args: str, timeout: float = 120) -> dict[str, Any]:
    done = subprocess.run(["node", script, *args], cwd=node_dir, env={**os.environ, "HOME": str(tmp_path)},
                          capture_output=True, text=True, timeout=timeout)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, f"node failed ({done.returncode}):\n{done.stdout}\n{done.stderr[-5000:]}"
    assert "corrupted" not in done.stdout + done.stderr and "Failed to decode" not in done.stdout + done.stderr
    result: dict[str, Any] = json.loads(lines[-1][len("RESULT "):])
    return result


def _send(up: UpProcess, topic: str, *bodies: bytes) -> list[str]:
    from apache.rocketmq.v2 import definition_pb2 as d
    from apache.rocketmq.v2 import service_pb2 as s
    from apache.rocketmq.v2 import service_pb2_grpc

    v2 = service_pb2_grpc.MessagingServiceStub(up.channel)
    ids = []
    for body in bodies:
        message = d.Message(topic=d.Resource(name=topic), body=body, system_properties=d.SystemProperties(
            tag="P", message_type=d.MessageType.NORMAL, body_encoding=d.Encoding.IDENTITY))
        answer = v2.SendMessage(s.SendMessageRequest(messages=[message]), timeout=10)
        assert answer.status.code == d.Code.OK, answer.status
        ids.append(answer.entries[0].message_id)
    return ids


def test_the_node_push_consumer_consumes_retries_and_dead_letters(up: UpProcess, node_client: Path,  # noqa: F811
                                                                  tmp_path: Path) -> None:
    topic, group = "rmq5-node-push", "rmq5-node-push-group"
    create_topic(up, topic, 2)
    good, bad = _send(up, topic, b"good", b"bad")
    seen = _node("push.js", node_client, tmp_path, up.gateway, topic, group, "bad", "9000")["seen"]
    assert [(m["id"], m["attempt"]) for m in seen if m["body"] == "good"] == [(good, 1)]
    assert [(m["id"], m["attempt"]) for m in seen if m["body"] == "bad"] == [(bad, n) for n in range(1, ATTEMPTS + 1)]
    dlq = up.stub.Pull(query_pb2.PullMessageRequest(topic=f"%DLQ%{group}", queue_id=0, queue_offset=0,
                                                    long_poll_ms=3000), timeout=10)
    assert [(m.uniq_key, m.body) for m in dlq.messages] == [(bad, b"bad")]


def test_the_node_transaction_checker_commits_and_rolls_back(up: UpProcess, node_client: Path,  # noqa: F811
                                                             tmp_path: Path) -> None:
    topic = "rmq5-node-tx"
    create_topic(up, topic, 1)
    result = _node("checker.js", node_client, tmp_path, up.gateway, topic, "30000")
    sent, checked = result["sent"], result["checked"]
    assert sorted(c["body"] for c in checked) == ["commit me", "roll me back"], checked
    committed = stored(up, sent["commit me"], topic)
    assert (committed.topic, committed.body, committed.tags) == (topic, b"commit me", "NodeTx")
    pulled = up.stub.Pull(query_pb2.PullMessageRequest(topic=topic, queue_id=0, queue_offset=0, long_poll_ms=1000),
                          timeout=10)
    assert [m.body for m in pulled.messages] == [b"commit me"], "the rolled-back half is never visible"
