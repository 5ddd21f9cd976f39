"""Acceptance with the official RocketMQ 5 Python client (rocketmq-python-client, pinned in
requirements.lock) against ``mqstore up``: its producer sends normal, delayed, FIFO and transactional
messages; its SimpleConsumer receives, acks, changes an invisible duration and sees the message again;
every message reads the same through mqstore.v1 (ids are UNIQ_KEYs, same tags, keys, properties)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.gateway.system_process import UpProcess
from tests.rocketmq5.topics import create_topic, stored

REPO = Path(__file__).resolve().parents[2]
DELAY_S = 3


def official(scenario: str, endpoint: str, home: Path, timeout_s: float = 90, extra_env: dict[str, str] | None = None,
             **args: Any) -> dict[str, Any]:
    """One scenario of tests/rocketmq5/official_client.py in a process of its own (HOME: the client's
    log directory)."""
    env = {**os.environ, "HOME": str(home), **(extra_env or {})}
    done = subprocess.run([sys.executable, "-m", "tests.rocketmq5.official_client", scenario, endpoint,
                           json.dumps(args)], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, f"{scenario} failed ({done.returncode}):\n{done.stdout[-3000:]}\n" \
                                           f"{done.stderr[-5000:]}"
    result: dict[str, Any] = json.loads(lines[-1][len("RESULT "):])
    return result


def test_produce_and_simple_consume_with_the_official_client(up: UpProcess, tmp_path: Path) -> None:
    topic, fifo_topic = "rmq5-orders", "rmq5-fifo"
    create_topic(up, topic, 4)
    create_topic(up, fifo_topic, 4)
    sent = official("produce", up.gateway, tmp_path, topic=topic, fifo_topic=fifo_topic, delay_s=DELAY_S,
                    fifo_count=5)

    # Read through mqstore.v1: the ids are UNIQ_KEYs, tags/keys/properties are RocketMQ's.
    normal = stored(up, sent["normal"])
    assert (normal.topic, normal.body, normal.tags, normal.uniq_key) == (topic, b"normal body", "TagA", sent["normal"])
    assert sorted(normal.keys.split()) == ["order-1", "user-7"]
    assert normal.properties["color"] == "blue"
    assert stored(up, sent["fifo"][0]).properties["__SHARDINGKEY"] == "group-1"
    assert len({stored(up, i).queue_id for i in sent["fifo"]}) == 1, "one message group, one queue"
    committed = stored(up, sent["commit"], topic)
    assert (committed.topic, committed.body, committed.keys) == (topic, b"commit body", "tx-commit")

    got = official("consume", up.gateway, tmp_path, topic=topic, group="rmq5-simple", expect=3,
                   invisible_s=20, keep="normal body", change_s=2, wait_s=40)
    by_body = {m["body"]: m for m in got["received"]}
    assert set(by_body) == {"normal body", "delayed body", "commit body"}, "a rolled back half is never seen"
    first = by_body["normal body"]
    assert (first["id"], first["tag"], first["keys"], first["properties"], first["attempt"]) == (
        sent["normal"], "TagA", ["order-1", "user-7"], {"color": "blue"}, 1)
    assert by_body["delayed body"]["id"] == sent["delayed"]
    assert by_body["delayed body"]["at"] >= sent["delay_due_s"] - 1, "a delayed message comes at its time"
    assert by_body["commit body"]["id"] == sent["commit"]
    # Not acked, invisible for 2 s instead of 20: it comes back (second attempt) after about 2 s.
    [back] = got["again"]
    assert (back["id"], back["attempt"]) == (sent["normal"], 2)
    assert 1.5 <= back["at"] - first["changed_at"] < 15

    fifo = official("consume_fifo", up.gateway, tmp_path, topic=fifo_topic, group="rmq5-fifo-group", expect=5,
                    wait_s=40)
    assert fifo["order"] == [f"fifo {i}" for i in range(5)]
    assert max(fifo["batches"]) == 1, "a message group's next message waits for the ack of the one before"
