"""Two shards behind one gateway: route queue ids across shards, offset ids routed by store host, queries
merged, and what happens when a shard is slow (SIGSTOP) or dies (kill -9). Real processes: two
commitlog/indexer/query triples and a gateway with latency-aware queue selection."""

from __future__ import annotations

import collections
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from mqstore.v1 import commitlog_pb2, common_pb2, gateway_pb2, gateway_pb2_grpc, query_pb2
from tests.commitlog.commitlog_process import ServiceProcess, free_port, spawn_service
from tests.query.query_process import System

GATEWAY_SETTINGS = """
shards:
  - {{name: shard-a, commitlog: "{a_commitlog}", query: "{a_query}"}}
  - {{name: shard-b, commitlog: "{b_commitlog}", query: "{b_query}"}}
queue_selection: latency
backend_timeout_ms: 1000
fault_initial_backoff_ms: 2000
"""


class GatewayProcess(ServiceProcess):
    service_name = "mqstore.v1.MessagingService"


@dataclass
class Cluster:
    a: System
    b: System
    gateway: GatewayProcess
    stub: gateway_pb2_grpc.MessagingServiceStub


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("shards")
    # Distinct store hosts, so offset msg ids tell the shards apart.
    a = System.start(root / "a", {"MQSTORE_LISTEN_PORT": "10911"})
    b = System.start(root / "b", {"MQSTORE_LISTEN_PORT": "10912"})
    settings = root / "gateway.yaml"
    settings.write_text(GATEWAY_SETTINGS.format(a_commitlog=a.commitlog.address, a_query=a.query.address,
                                                b_commitlog=b.commitlog.address, b_query=b.query.address))
    port = free_port()
    log_path = root / "gateway.log"
    gateway = GatewayProcess(root, port, spawn_service(["gateway", "--config", str(settings), "--listen",
                                                        f"127.0.0.1:{port}"], None, log_path), log_path)
    try:
        gateway.wait_serving()
        yield Cluster(a, b, gateway, gateway_pb2_grpc.MessagingServiceStub(gateway.channel))
    finally:
        for handle in (a.commitlog, b.commitlog):
            if handle.running:
                os.kill(handle.pid, signal.SIGCONT)
        try:
            assert gateway.stop() == 0, gateway.logs()[-3000:]
        finally:
            gateway.kill9()
            for system in (a, b):
                system.kill_all()


def send(cluster: Cluster, topic: str, body: bytes = b"x", timeout: float = 10,
         **kwargs: object) -> gateway_pb2.SendResult:
    properties = kwargs.pop("properties", {})
    request = gateway_pb2.SendRequest(message=common_pb2.Message(topic=topic, body=body, properties=properties),
                                      **kwargs)  # type: ignore[arg-type]
    return cluster.stub.Send(request, timeout=timeout)


def create(cluster: Cluster, topic: str, queues: int = 4) -> None:
    config = common_pb2.TopicConfig(topic=topic, read_queue_nums=queues, write_queue_nums=queues, perm=6)
    cluster.stub.CreateTopic(commitlog_pb2.TopicRequest(topic=config), timeout=10)


def pull_until(cluster: Cluster, topic: str, queue_id: int, count: int) -> list[query_pb2.StoredMessage]:
    response = cluster.stub.Pull(query_pb2.PullMessageRequest(topic=topic, queue_id=queue_id, long_poll_ms=3000),
                                 timeout=10)
    deadline = time.monotonic() + 10
    while len(response.messages) < count and time.monotonic() < deadline:
        response = cluster.stub.Pull(query_pb2.PullMessageRequest(topic=topic, queue_id=queue_id, long_poll_ms=500),
                                     timeout=10)
    return list(response.messages)


def test_a_topic_route_numbers_queues_across_shards(cluster: Cluster) -> None:
    create(cluster, "spread")
    route = cluster.stub.GetRoute(gateway_pb2.GetRouteRequest(topic="spread"), timeout=10)
    assert [(q.queue_id, q.shard, q.shard_queue_id) for q in route.queues] == [
        *((i, "shard-a", i) for i in range(4)), *((4 + i, "shard-b", i) for i in range(4))]
    listed = {t.topic: t for t in cluster.stub.ListTopics(commitlog_pb2.ListTopicsRequest(), timeout=10).topics}
    assert listed["spread"].write_queue_nums == 8


def test_sends_reads_and_lookups_use_route_queue_ids(cluster: Cluster) -> None:
    create(cluster, "routed")
    results = [send(cluster, "routed", f"m{i}".encode(), properties={"KEYS": "shared-key"}) for i in range(16)]
    assert collections.Counter(r.shard for r in results) == {"shard-a": 8, "shard-b": 8}
    on_b = next(r for r in results if r.shard == "shard-b")
    assert on_b.queue_id >= 4
    pulled = pull_until(cluster, "routed", on_b.queue_id, 2)
    assert {m.queue_id for m in pulled} == {on_b.queue_id}
    # Both id kinds find a shard-b message, with its route queue id.
    for msg_id in (on_b.offset_msg_id, on_b.msg_id):
        found = cluster.stub.GetMessage(query_pb2.ViewMessageRequest(msg_id=msg_id), timeout=10).message
        assert (found.uniq_key, found.queue_id, found.store_host) == (on_b.msg_id, on_b.queue_id, "127.0.0.1:10912")
    # A key query merges both shards.
    deadline = time.monotonic() + 10
    found_ids: set[str] = set()
    while len(found_ids) < 16 and time.monotonic() < deadline:
        answer = cluster.stub.QueryByKey(query_pb2.QueryMessageRequest(topic="routed", key="shared-key", max_num=64),
                                         timeout=10)
        found_ids = {m.uniq_key for m in answer.messages}
    assert found_ids == {r.msg_id for r in results}
    # Consumer offsets live with the queue's shard.
    commit = query_pb2.UpdateConsumerOffsetRequest(consumer_group="g", topic="routed", queue_id=6, offset=1)
    cluster.stub.CommitOffset(commit, timeout=10)
    assert cluster.stub.QueryOffset(query_pb2.QueryConsumerOffsetRequest(consumer_group="g", topic="routed",
                                                                         queue_id=6), timeout=10).offset == 1
    assert cluster.b.query.stub.QueryConsumerOffset(query_pb2.QueryConsumerOffsetRequest(
        consumer_group="g", topic="routed", queue_id=2), timeout=10).offset == 1


def test_a_slow_shard_is_avoided_and_an_ambiguous_send_is_not_retried(cluster: Cluster) -> None:
    """SIGSTOP shard-b's commitlog: the send that lands there times out (DEADLINE_EXCEEDED: it may have
    been written, so the gateway does not retry it); the following sends avoid shard-b."""
    create(cluster, "slow")
    assert len(cluster.stub.GetRoute(gateway_pb2.GetRouteRequest(topic="slow"), timeout=10).queues) == 8
    os.kill(cluster.b.commitlog.pid, signal.SIGSTOP)
    try:
        outcomes = []
        for i in range(8):
            try:
                outcomes.append(send(cluster, "slow", f"s{i}".encode()).shard)
            except grpc.RpcError as error:
                assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED, error.details()
                assert "shard-b" in (error.details() or "")
                outcomes.append("timeout")
        assert outcomes.count("timeout") == 1, outcomes
        assert outcomes[outcomes.index("timeout") + 1:] == ["shard-a"] * (7 - outcomes.index("timeout"))
    finally:
        os.kill(cluster.b.commitlog.pid, signal.SIGCONT)
    time.sleep(2.5)  # the fault backoff ends: shard-b takes sends again
    assert "shard-b" in {send(cluster, "slow").shard for _ in range(8)}


def test_a_dead_shard_sends_are_retried_elsewhere_and_reads_say_unavailable(cluster: Cluster) -> None:
    """kill -9 shard-b's commitlog: a connect that fails proves nothing was written, so the send is
    retried on shard-a; every acknowledged message is stored exactly once."""
    create(cluster, "dead")
    assert len(cluster.stub.GetRoute(gateway_pb2.GetRouteRequest(topic="dead"), timeout=10).queues) == 8
    cluster.b.commitlog.kill9()
    results = [send(cluster, "dead", f"d{i}".encode()) for i in range(12)]
    assert {r.shard for r in results} == {"shard-a"}
    per_queue = collections.Counter(r.queue_id for r in results)
    stored = [m.body for q, n in per_queue.items() for m in pull_until(cluster, "dead", q, n)]
    assert sorted(stored) == sorted(f"d{i}".encode() for i in range(12))
    with pytest.raises(grpc.RpcError) as error:
        send(cluster, "dead", queue_id=5)
    assert error.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "shard-b" in (error.value.details() or "") and cluster.b.commitlog.address in (error.value.details() or "")
    # Reads of a shard whose query service is gone: retried, then UNAVAILABLE naming it.
    cluster.b.query.kill9()
    started = time.monotonic()
    with pytest.raises(grpc.RpcError) as error:
        cluster.stub.Pull(query_pb2.PullMessageRequest(topic="dead", queue_id=5), timeout=10)
    assert error.value.code() == grpc.StatusCode.UNAVAILABLE
    details = error.value.details() or ""
    assert "query service of shard-b" in details and cluster.b.query.address in details
    assert time.monotonic() - started < 5, "a dead backend fails fast (connection refused), after its retries"
    # shard-a still answers.
    assert cluster.stub.Pull(query_pb2.PullMessageRequest(topic="dead", queue_id=0), timeout=10).status


def test_a_gateway_log_has_no_tracebacks(cluster: Cluster, tmp_path: Path) -> None:
    assert "Traceback" not in cluster.gateway.logs()
