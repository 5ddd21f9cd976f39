"""A fresh store's footprint on disk, as ``make run`` makes it: RocketMQ's default geometry (1 GiB
commitlog files, 300,000-unit ConsumeQueue files, 5M-slot index files), 100 topics of 8 queues with
10 messages each. Its files are sparse: they take the disk their data takes (the commitlog a
reservation ahead of its writer), not their size."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import grpc

from mqstore.v1 import commitlog_pb2, commitlog_pb2_grpc, common_pb2, query_pb2
from tests.commitlog.commitlog_process import CHANNEL_OPTIONS
from tests.gateway.system_process import UpProcess, start_up

MIB = 1024 * 1024
TOPICS, QUEUES, MESSAGES = 100, 8, 10
#: The settings of ``make run`` (the defaults), over the small commitlog files the tests use elsewhere.
MAKE_RUN_ENV = {"MQSTORE_MAPPED_FILE_SIZE_COMMIT_LOG": str(1024 * MIB), "MQSTORE_MAX_MESSAGE_SIZE": str(4 * MIB)}


def disk_usage_bytes(path: Path) -> int:
    """``du -s``: the blocks the files take, not their sizes."""
    done = subprocess.run(["du", "-s", "-B1", str(path)], capture_output=True, text=True, timeout=60, check=True)
    return int(done.stdout.split()[0])


def append_topics(up: UpProcess) -> None:
    with grpc.insecure_channel(up.commitlog, options=CHANNEL_OPTIONS) as channel:
        commitlog = commitlog_pb2_grpc.CommitLogServiceStub(channel)
        messages = [common_pb2.Message(topic=f"Footprint{t}", queue_id=i % QUEUES, body=b"f" * 200,
                                       properties={"KEYS": f"key-{t}-{i}"})
                    for t in range(TOPICS) for i in range(QUEUES * MESSAGES)]
        for start in range(0, len(messages), 1000):
            commitlog.AppendBatch(commitlog_pb2.AppendBatchRequest(messages=messages[start:start + 1000]), timeout=60)


def wait_indexed(up: UpProcess, topic: str, key: str) -> None:
    """The indexer dispatches in commitlog order: once the last message is indexed, all are."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if up.stub.QueryByKey(query_pb2.QueryMessageRequest(topic=topic, key=key), timeout=5).messages:
                return
        except grpc.RpcError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{key} was not indexed in 60 s:\n{up.logs()[-3000:]}")


def test_a_fresh_store_of_800_queues_with_10_messages_each_takes_under_200_mb(tmp_path: Path) -> None:
    store = tmp_path / "store"
    up = start_up(store, env_overrides=MAKE_RUN_ENV)
    try:
        append_topics(up)
        wait_indexed(up, f"Footprint{TOPICS - 1}", f"key-{TOPICS - 1}-{QUEUES * MESSAGES - 1}")
        queues = [p for p in (store / "indexer" / "consumequeue").glob("Footprint*/*") if p.is_dir()]
        assert len(queues) == TOPICS * QUEUES
        used = disk_usage_bytes(store)
        print(f"du -s of a fresh store with {len(queues)} queues of {MESSAGES} messages: {used / MIB:.1f} MiB")
        assert used < 200 * MIB, f"{used / MIB:.1f} MiB:\n" + subprocess.run(
            ["du", "-a", "-B1", "-d", "3", str(store)], capture_output=True, text=True, check=False).stdout[-4000:]
        assert up.stop() == 0, up.logs()[-3000:]
    finally:
        up.kill_all()
