"""Operator RPCs through ``mqstore up`` (real processes, small geometry so a topic spans several
ConsumeQueue files): ``mqstore status`` and ``mqstore topics delete``."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from bench.services import free_port_block
from mqstore.v1 import admin_pb2, commitlog_pb2_grpc, common_pb2, gateway_pb2, indexer_pb2_grpc, query_pb2
from services.store.formats.message import SCHEDULE_TOPIC
from services.store.formats.topics_file import read_topics
from tests.commitlog.commitlog_process import commitlog_env, mqstore_command
from tests.gateway.system_process import UpProcess, start_up
from tests.geometry import SMALL

COUNT = 700  # more than two ConsumeQueue files of SMALL's 300 units, over 8 queues: one queue gets ~88


@pytest.fixture(scope="module")
def admin_up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpProcess]:
    store = tmp_path_factory.mktemp("admin-up") / "store"
    started = start_up(store, {**SMALL.env(), "MQSTORE_MAPPED_FILE_SIZE_CONSUME_QUEUE": str(20 * 30)})
    try:
        yield started
        assert started.stop() == 0, started.logs()[-5000:]
    finally:
        started.kill_all()


def mqstore(up: UpProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*mqstore_command(), *args, "--gateway", up.gateway], capture_output=True, text=True,
                          timeout=60, check=False, env=commitlog_env())


def send(up: UpProcess, topic: str, bodies: list[bytes], queue_id: int = 0) -> list[gateway_pb2.SendResult]:
    return [up.stub.Send(gateway_pb2.SendRequest(message=common_pb2.Message(topic=topic, body=body),
                                                 queue_id=queue_id), timeout=10) for body in bodies]


def pull_all(up: UpProcess, topic: str, queue_id: int, until: int) -> list[query_pb2.StoredMessage]:
    """Every message of the queue from its min offset up to queue offset ``until`` (waits for dispatch)."""
    offsets = up.stub.GetQueueOffsets(query_pb2.GetQueueOffsetRangeRequest(topic=topic, queue_id=queue_id),
                                      timeout=10)
    offset, messages = offsets.min_offset, []
    deadline = time.monotonic() + 30
    while offset < until:
        assert time.monotonic() < deadline, f"{topic}/{queue_id} stopped at {offset} of {until}"
        response = up.stub.Pull(query_pb2.PullMessageRequest(topic=topic, queue_id=queue_id, queue_offset=offset,
                                                             max_messages=256, long_poll_ms=200), timeout=10)
        messages.extend(response.messages)
        offset = max(offset, response.next_begin_offset)
    return messages


def test_status_shows_every_service_serving_offsets_watermarks_and_counts(admin_up: UpProcess) -> None:
    send(admin_up, "StatusTopic", [b"x"] * 3)
    status = admin_up.stub.GetClusterStatus(admin_pb2.GetClusterStatusRequest(), timeout=10)
    assert status.healthy and len(status.shards) == 1
    shard = status.shards[0]
    assert {s.name: s.state for s in shard.services} == {
        "commitlog": "SERVING", "indexer": "SERVING", "query": "SERVING", "scheduler": "SERVING"}
    assert shard.max_offset > shard.min_offset >= 0
    assert 0 <= shard.flush_lag_bytes <= shard.max_offset
    assert shard.disk_clean_ratio == pytest.approx(0.75) and shard.disk_refuse_ratio == pytest.approx(0.90)
    assert 0 < shard.disk_used_ratio < 1 and not shard.disk_full
    assert shard.reput_offset <= shard.max_offset and shard.dispatch_lag_bytes >= 0
    assert status.topic_count >= 1 and shard.topic_count == status.topic_count

    done = mqstore(admin_up, "status", "--json")
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["healthy"] is True and answer["shards"][0]["services"][0]["state"] == "SERVING"
    assert isinstance(answer["shards"][0]["max_offset"], int)
    table = mqstore(admin_up, "status")
    assert table.returncode == 0, table.stderr
    assert "shard-0" in table.stdout and "up" in table.stdout and "75.0%" in table.stdout
    assert "90.0%" in table.stdout and "healthy" in table.stderr


def test_status_exits_non_zero_and_names_the_services_that_are_down(tmp_path: Path) -> None:
    """A gateway whose shard's services do not exist: every one UNREACHABLE, exit 1."""
    port = free_port_block(1)
    dead = free_port_block(5, avoid=range(port, port + 1))
    log_path = tmp_path / "gateway.log"
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen([*mqstore_command(), "gateway", "--listen", f"127.0.0.1:{port}",
                                 "--commitlog", f"127.0.0.1:{dead + 1}", "--query", f"127.0.0.1:{dead + 3}"],
                                env=commitlog_env(), stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file)
    try:
        deadline = time.monotonic() + 60
        while True:
            done = subprocess.run([*mqstore_command(), "status", "--gateway", f"127.0.0.1:{port}", "--timeout", "5"],
                                  capture_output=True, text=True, timeout=60, check=False, env=commitlog_env())
            if "UNAVAILABLE" not in done.stderr or "127.0.0.1:" + str(port) not in done.stderr:
                break  # the gateway answered (not: the gateway itself is not up yet)
            assert time.monotonic() < deadline, log_path.read_text()[-3000:]
            time.sleep(0.2)
        assert done.returncode == 1, done.stdout + done.stderr
        assert "DOWN" in done.stdout and "NOT HEALTHY" in done.stderr
        assert f"shard-0 indexer (127.0.0.1:{dead + 2})" in done.stderr  # the derived indexer address
    finally:
        proc.terminate()
        proc.wait(30)


def test_topics_delete_removes_config_and_consume_queues_and_a_new_send_recreates_the_topic(
        admin_up: UpProcess) -> None:
    topic = "DeleteMe"
    old = send(admin_up, topic, [b"old-%d" % i for i in range(COUNT // 8)], queue_id=2)
    assert len(pull_all(admin_up, topic, 2, old[-1].queue_offset + 1)) == len(old)
    cq_dir = admin_up.store / "indexer" / "consumequeue" / topic
    assert len(list((cq_dir / "2").iterdir())) >= 2  # spans several ConsumeQueue files

    done = mqstore(admin_up, "topics", "delete", topic, "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"topic": topic, "shards": ["shard-0"], "deleted_queues": 1}
    assert not cq_dir.exists()
    listed = mqstore(admin_up, "topics", "list", "--json")
    assert topic not in listed.stdout
    stored = read_topics(admin_up.store / "config" / "topics.json")  # the snapshot and its journal
    assert topic not in stored.topics and topic in stored.deleted
    with pytest.raises(grpc.RpcError) as pulled:
        admin_up.stub.Pull(query_pb2.PullMessageRequest(topic=topic, queue_id=2, queue_offset=0), timeout=10)
    assert pulled.value.code() == grpc.StatusCode.NOT_FOUND

    again = mqstore(admin_up, "topics", "delete", topic)
    assert again.returncode == 1 and "NOT_FOUND" in again.stderr and "does not exist" in again.stderr

    # Auto-create brings it back: only the new messages are there, their queue offsets go on.
    new = send(admin_up, topic, [b"new-%d" % i for i in range(5)], queue_id=2)
    assert new[0].queue_offset == old[-1].queue_offset + 1
    bodies = [m.body for m in pull_all(admin_up, topic, 2, new[-1].queue_offset + 1)]
    assert bodies == [b"new-%d" % i for i in range(5)]
    assert topic not in read_topics(admin_up.store / "config" / "topics.json").deleted


@pytest.mark.parametrize("topic", [SCHEDULE_TOPIC, "RMQ_SYS_TRANS_HALF_TOPIC", "TBW102"])
def test_topics_delete_refuses_system_topics(admin_up: UpProcess, topic: str) -> None:
    # The gateway, and the commitlog and indexer themselves (an internal caller may not drop them either).
    with grpc.insecure_channel(admin_up.commitlog) as commitlog, grpc.insecure_channel(admin_up.indexer) as indexer:
        for stub in (admin_up.stub, commitlog_pb2_grpc.CommitLogServiceStub(commitlog),
                     indexer_pb2_grpc.IndexerServiceStub(indexer)):
            with pytest.raises(grpc.RpcError) as refused:
                stub.DeleteTopic(admin_pb2.DeleteTopicRequest(topic=topic), timeout=10)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, type(stub).__name__
            assert "system topic" in (refused.value.details() or "")


def test_topics_delete_of_a_bad_name_is_invalid_argument(admin_up: UpProcess) -> None:
    with pytest.raises(grpc.RpcError) as refused:
        admin_up.stub.DeleteTopic(admin_pb2.DeleteTopicRequest(topic=".."), timeout=10)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_version_and_the_deprecated_commit_option(admin_up: UpProcess) -> None:
    version = subprocess.run([*mqstore_command(), "--version"], capture_output=True, text=True, timeout=30,
                             check=True)
    assert version.stdout.startswith("mqstore ") and version.stdout.split()[1][0].isdigit()
    send(admin_up, "OffsetTopic", [b"a", b"b"], queue_id=0)
    old = mqstore(admin_up, "offset", "--topic", "OffsetTopic", "--group", "g1", "--queue", "0", "--commit", "1")
    assert old.returncode == 0, old.stderr
    assert "deprecated: use 'offset commit --to 1'" in old.stderr
    new = mqstore(admin_up, "offset", "commit", "--topic", "OffsetTopic", "--group", "g1", "--queue", "0",
                  "--to", "2")
    assert new.returncode == 0 and "deprecated" not in new.stderr, new.stderr
