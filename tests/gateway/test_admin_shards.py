"""Status and topic deletion over two shards: two ``mqstore up`` systems behind a third gateway (real
processes). Every shard is in the status; a deletion removes the topic's ConsumeQueues on every shard
that has it and names those shards."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from mqstore.v1 import admin_pb2, commitlog_pb2, common_pb2, gateway_pb2, gateway_pb2_grpc
from tests.commitlog.commitlog_process import ServiceProcess, free_port, spawn_service
from tests.gateway.system_process import UpProcess, start_up

GATEWAY_SETTINGS = """
shards:
  - {{name: shard-a, commitlog: "{a}:{a1}", query: "{a}:{a3}"}}
  - {{name: shard-b, commitlog: "{b}:{b1}", query: "{b}:{b3}"}}
"""


class GatewayProcess(ServiceProcess):
    service_name = "mqstore.v1.MessagingService"


@dataclass
class TwoShards:
    a: UpProcess
    b: UpProcess
    stub: gateway_pb2_grpc.MessagingServiceStub


@pytest.fixture(scope="module")
def two_shards(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwoShards]:
    root = tmp_path_factory.mktemp("admin-shards")
    a = start_up(root / "a")
    b = start_up(root / "b")
    settings = root / "gateway.yaml"
    settings.write_text(GATEWAY_SETTINGS.format(a="127.0.0.1", a1=a.base_port + 1, a3=a.base_port + 3,
                                                b="127.0.0.1", b1=b.base_port + 1, b3=b.base_port + 3))
    port = free_port()
    log_path = root / "gateway.log"
    gateway = GatewayProcess(root, port, spawn_service(["gateway", "--config", str(settings), "--listen",
                                                        f"127.0.0.1:{port}"], None, log_path), log_path)
    try:
        gateway.wait_serving()
        yield TwoShards(a, b, gateway_pb2_grpc.MessagingServiceStub(gateway.channel))
        assert gateway.stop() == 0, gateway.logs()[-3000:]
        assert a.stop() == 0 and b.stop() == 0
    finally:
        gateway.kill9()
        a.kill_all()
        b.kill_all()


def test_status_has_every_shard(two_shards: TwoShards) -> None:
    status = two_shards.stub.GetClusterStatus(admin_pb2.GetClusterStatusRequest(), timeout=10)
    assert [s.name for s in status.shards] == ["shard-a", "shard-b"] and status.healthy
    assert all(len(s.services) == 4 and s.healthy for s in status.shards)


def test_delete_removes_the_topic_on_every_shard_that_has_it(two_shards: TwoShards) -> None:
    stub = two_shards.stub
    stub.CreateTopic(commitlog_pb2.TopicRequest(topic=common_pb2.TopicConfig(
        topic="Both", read_queue_nums=2, write_queue_nums=2, perm=6)), timeout=10)
    for queue_id in range(4):  # route queues 0-1 on shard-a, 2-3 on shard-b
        stub.Send(gateway_pb2.SendRequest(message=common_pb2.Message(topic="Both", body=b"x"), queue_id=queue_id),
                  timeout=10)
    # Only on shard-b: sent through b's own gateway.
    two_shards.b.stub.Send(gateway_pb2.SendRequest(message=common_pb2.Message(topic="OnlyB", body=b"y")), timeout=10)

    both_dirs = [up.store / "indexer" / "consumequeue" / "Both" for up in (two_shards.a, two_shards.b)]
    _wait_for(lambda: all(d.exists() for d in both_dirs))
    deleted = stub.DeleteTopic(admin_pb2.DeleteTopicRequest(topic="Both"), timeout=10)
    assert list(deleted.shards) == ["shard-a", "shard-b"] and deleted.deleted_queues == 4
    assert not any(d.exists() for d in both_dirs)

    only_b = stub.DeleteTopic(admin_pb2.DeleteTopicRequest(topic="OnlyB"), timeout=10)
    assert list(only_b.shards) == ["shard-b"]
    topics = {t.topic for t in stub.ListTopics(commitlog_pb2.ListTopicsRequest(), timeout=10).topics}
    assert not {"Both", "OnlyB"} & topics


def _wait_for(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)
