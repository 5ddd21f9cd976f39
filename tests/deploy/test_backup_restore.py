"""Backup and restore as docs/backup.md describes it for Kubernetes (a VolumeSnapshot of a stopped
shard's volume, a new volume made from it): a system stopped cleanly, its store directory copied as a
snapshot would copy it, a new system started on the copy alone finds every message, by queue offset
and by key, and the consumer group's committed offsets."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from mqstore.v1 import common_pb2, gateway_pb2, query_pb2
from tests.gateway.system_process import start_up

TOPICS = ("orders", "audit")
PER_TOPIC = 150
GROUP = "billing"


def _send_all(stub: object) -> list[tuple[gateway_pb2.SendResult, common_pb2.Message]]:
    sent = []
    for topic in TOPICS:
        batch = [common_pb2.Message(topic=topic, body=f"{topic}-{i}".encode() * (1 + i % 7),
                                    properties={"KEYS": f"{topic}-key-{i}"}) for i in range(PER_TOPIC)]
        results = stub.SendBatch(gateway_pb2.SendBatchRequest(messages=batch), timeout=30).results  # type: ignore[attr-defined]
        sent += list(zip(results, batch, strict=True))
    return sent


def test_a_copy_of_a_cleanly_stopped_store_serves_every_message(tmp_path: Path) -> None:
    store = tmp_path / "store"
    up = start_up(store)
    try:
        sent = _send_all(up.stub)
        committed = {(r.topic, r.queue_id): r.queue_offset + 1 for r, _ in sent if r.topic == "orders"}
        for (topic, queue_id), offset in committed.items():
            up.stub.CommitOffset(query_pb2.UpdateConsumerOffsetRequest(
                consumer_group=GROUP, topic=topic, queue_id=queue_id, offset=offset), timeout=10)
        assert up.stop() == 0, up.logs()[-3000:]
    finally:
        up.kill_all()
    assert not (store / "abort").exists(), "a clean stop leaves no abort file"

    # What restoring a snapshot gives: the same files on a new volume. --sparse keeps preallocated files small.
    restored = tmp_path / "restored" / "store"
    restored.parent.mkdir()
    subprocess.run(["cp", "-a", "--sparse=always", str(store), str(restored)], check=True)
    shutil.rmtree(store)  # the restored system has only the copy

    second = start_up(restored)
    try:
        queues: dict[tuple[str, int], list[tuple[int, bytes, str]]] = {}
        for result, message in sent:
            queues.setdefault((result.topic, result.queue_id), []).append(
                (result.queue_offset, message.body, result.uniq_key))
        for (topic, queue_id), expected in queues.items():
            pulled = second.stub.Pull(query_pb2.PullMessageRequest(
                topic=topic, queue_id=queue_id, queue_offset=0, max_messages=1024, max_bytes=32 << 20),
                timeout=10).messages
            assert [(m.queue_offset, m.body, m.uniq_key) for m in pulled] == sorted(expected), (topic, queue_id)
        for i in (0, PER_TOPIC // 2, PER_TOPIC - 1):
            found = second.stub.QueryByKey(query_pb2.QueryMessageRequest(topic="audit", key=f"audit-key-{i}"),
                                           timeout=10).messages
            assert [m.body for m in found] == [f"audit-{i}".encode() * (1 + i % 7)]
        for (topic, queue_id), offset in committed.items():
            answer = second.stub.QueryOffset(query_pb2.QueryConsumerOffsetRequest(
                consumer_group=GROUP, topic=topic, queue_id=queue_id), timeout=10)
            assert answer.offset == offset
        assert second.stop() == 0, second.logs()[-3000:]
    finally:
        second.kill_all()
