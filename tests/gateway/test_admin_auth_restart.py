"""Topic deletion with auth on, and across a restart (``mqstore up``, real processes): only admin
tokens delete, any token may see the status, and a deleted topic stays deleted when the commitlog
starts again over records of it (topic discovery must not bring it back)."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from mqstore.v1 import admin_pb2, commitlog_pb2, common_pb2, gateway_pb2
from tests.gateway.system_process import start_up

TOKENS = """\
tokens:
  - name: producer
    token: tok-producer
    produce: ["gone", "kept"]
  - name: ops
    token: tok-ops-admin
    admin: true
"""
PRODUCER = (("authorization", "Bearer tok-producer"),)
ADMIN = (("authorization", "Bearer tok-ops-admin"),)


def _code(call: object) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as failed:
        call()  # type: ignore[operator]
    return failed.value.code()


def test_only_admin_tokens_delete_and_a_deleted_topic_stays_deleted_after_a_restart(tmp_path: Path) -> None:
    (tmp_path / "tokens.yaml").write_text(TOKENS)
    extra = ["--auth-file", str(tmp_path / "tokens.yaml")]
    store = tmp_path / "store"
    up = start_up(store, extra_args=extra)
    try:
        for topic in ("gone", "kept"):
            up.stub.Send(gateway_pb2.SendRequest(message=common_pb2.Message(topic=topic, body=b"x")), timeout=10,
                         metadata=PRODUCER)
        delete = admin_pb2.DeleteTopicRequest(topic="gone")
        assert _code(lambda: up.stub.DeleteTopic(delete, timeout=10)) == grpc.StatusCode.UNAUTHENTICATED
        assert _code(lambda: up.stub.DeleteTopic(delete, timeout=10, metadata=PRODUCER)) == \
            grpc.StatusCode.PERMISSION_DENIED
        status = up.stub.GetClusterStatus(admin_pb2.GetClusterStatusRequest(), timeout=10, metadata=PRODUCER)
        assert status.healthy
        assert list(up.stub.DeleteTopic(delete, timeout=10, metadata=ADMIN).shards) == ["shard-0"]
        assert up.stop() == 0, up.logs()[-5000:]
    finally:
        up.kill_all()

    up = start_up(store, extra_args=extra)
    try:
        topics = {t.topic for t in up.stub.ListTopics(commitlog_pb2.ListTopicsRequest(), timeout=10,
                                                      metadata=ADMIN).topics}
        assert "kept" in topics and "gone" not in topics
        assert not (store / "indexer" / "consumequeue" / "gone").exists()
        assert up.stop() == 0, up.logs()[-5000:]
    finally:
        up.kill_all()
