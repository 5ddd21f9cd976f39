"""The gateway's pure parts: queue selection, fault windows, UNIQ_KEYs, token checks, the retry rule."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import math
from pathlib import Path
from typing import Any

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.auth import Action, PermissionDeniedError, UnauthenticatedError, load_token_table
from gateway.queue_selector import FaultTable, QueueSelector
from gateway.resilience import BackendError, RetryPolicy, backend_error
from gateway.route import TopicRoute
from gateway.send_batcher import SendBatcher
from gateway.settings import ShardSettings, load_gateway_settings
from gateway.uniq_key_maker import UniqKeyGenerator
from mqstore.v1 import commitlog_pb2, common_pb2, gateway_pb2
from services.server.status import RefusedMessage
from services.store.config import ConfigError
from services.store.formats.java_hash import java_string_hash
from services.store.formats.uniq_key import decode_uniq_key


class FakeShard:
    """Stands in for a ShardClient in a route: the selector only reads its name."""

    def __init__(self, name: str) -> None:
        self.name = name


def route(*shards: tuple[str, int, int, int]) -> TopicRoute:
    pairs: list[Any] = [(FakeShard(name), common_pb2.TopicConfig(topic="t", read_queue_nums=r, write_queue_nums=w,
                                                                 perm=6))
                        for name, r, w, _ in shards]
    return TopicRoute.build("t", pairs)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_route_ids_run_across_shards_and_follow_queue_counts() -> None:
    r = route(("a", 4, 2, 0), ("b", 3, 3, 0))
    assert [(q.queue_id, q.shard.name, q.shard_queue_id, q.writable, q.readable) for q in r.queues] == [
        (0, "a", 0, True, True), (1, "a", 1, True, True), (2, "a", 2, False, True), (3, "a", 3, False, True),
        (4, "b", 0, True, True), (5, "b", 1, True, True), (6, "b", 2, True, True)]
    assert [q.queue_id for q in r.writable] == [0, 1, 4, 5, 6]
    assert {q.base for q in r.queues if q.shard.name == "b"} == {4}


@given(st.text(min_size=1, max_size=40), st.integers(min_value=1, max_value=64))
def test_a_sharding_key_always_picks_rocketmqs_hash_queue(key: str, queues: int) -> None:
    r = route(("a", queues, queues, 0))
    selector = QueueSelector(latency_aware=False, faults=FaultTable(1, 60))
    expected = abs(int(math.fmod(java_string_hash(key), queues)))  # Java: abs(hashCode % n), % truncating
    assert selector.select(r, sharding_key=key).queue_id == expected


def test_round_robin_is_even() -> None:
    selector = QueueSelector(latency_aware=False, faults=FaultTable(1, 60))
    r = route(("a", 4, 4, 0), ("b", 4, 4, 0))
    counts = collections.Counter(selector.select(r).queue_id for _ in range(800))
    assert set(counts.values()) == {100}


def test_latency_aware_avoids_slow_and_failing_shards_for_rocketmqs_windows() -> None:
    clock = Clock()
    faults = FaultTable(initial_backoff_s=1, max_backoff_s=8, clock=clock)
    selector = QueueSelector(latency_aware=True, faults=faults)
    r = route(("a", 2, 2, 0), ("b", 2, 2, 0))
    faults.record("b", 0.549, failed=False)  # under 550 ms: no penalty
    assert {selector.select(r).shard.name for _ in range(8)} == {"a", "b"}
    faults.record("b", 0.550, failed=False)  # 550 ms: 30 s out (RocketMQ's table)
    assert not faults.available("b", clock.now + 29.9) and faults.available("b", clock.now + 30)
    assert {selector.select(r).shard.name for _ in range(8)} == {"a"}
    faults.record("b", 0.010, failed=False)
    assert {selector.select(r).shard.name for _ in range(8)} == {"a", "b"}
    backoffs = []
    for _ in range(5):
        faults.record("a", 1.0, failed=True)
        fault = faults.snapshot()["a"]
        backoffs.append(fault.available_at - clock.now)
    assert backoffs == [1, 2, 4, 8, 8]
    assert {selector.select(r).shard.name for _ in range(8)} == {"b"}
    faults.record("b", 1.0, failed=True)  # every shard out: fall back to all queues
    assert {selector.select(r).shard.name for _ in range(8)} == {"a", "b"}
    # A retry avoids the shard that just failed, whatever the policy.
    plain = QueueSelector(latency_aware=False, faults=FaultTable(1, 60))
    assert {plain.select(r, avoid_shard="a").shard.name for _ in range(8)} == {"b"}


def test_uniq_keys_are_unique_ordered_and_decodable() -> None:
    generator = UniqKeyGenerator(ip="10.1.2.3", pid=0x12345)
    keys = [generator.next() for _ in range(70_000)]
    assert len(set(keys)) == len(keys)
    assert all(len(k) == 32 and k == k.upper() for k in keys[:100])
    decoded = decode_uniq_key(keys[5])
    assert (decoded.ip, decoded.pid, decoded.counter) == ("10.1.2.3", 0x2345, 5)
    assert keys[0][:20] == keys[-1][:20]  # ip + pid + the per-process random part stay


def test_tokens_are_checked_by_digest_and_topic_globs(tmp_path: Path) -> None:
    path = tmp_path / "tokens.yaml"
    path.write_text("tokens:\n  - {name: app, token: app-token-1, produce: [\"orders-*\"], consume: [orders]}\n"
                    "  - {name: ops, token: ops-token-1, admin: true}\n")
    table = load_token_table(path)
    app = table.authenticate([("authorization", "Bearer app-token-1")])
    assert app.name == "app" and app.may(Action.PRODUCE, "orders-eu") and not app.may(Action.PRODUCE, "orders")
    assert app.may(Action.CONSUME, "orders") and not app.may(Action.ADMIN, "orders")
    with pytest.raises(PermissionDeniedError, match="may not consume from topic 'orders-eu'"):
        table.authorize(app, Action.CONSUME, "orders-eu")
    with pytest.raises(UnauthenticatedError):
        table.authenticate([("authorization", "Bearer app-token-2")])
    with pytest.raises(UnauthenticatedError):
        table.authenticate([])
    assert table.authenticate([("authorization", "BEARER ops-token-1")]).admin
    assert not load_token_table(None).enabled


def test_gateway_settings_refuse_mistakes(tmp_path: Path) -> None:
    path = tmp_path / "gateway.yaml"
    for content, fragment in (("shards: []\n", "at least one shard"),
                              ("shards: [{commitlog: a:1}]\n", "commitlog and query"),
                              ("queue_selection: fastest\n", "queue_selection"),
                              ("retry_attempts: 0\n", "positive"),
                              ("listn: x\n", "unknown gateway settings"),
                              ("shards: [{name: x, commitlog: a:1, query: b:1}, {name: x, commitlog: c:1, "
                               "query: d:1}]\n", "unique")):
        path.write_text(content)
        with pytest.raises(ConfigError, match=fragment):
            load_gateway_settings(path)
    path.write_text("shards: [{commitlog: '127.0.0.1:1', query: '127.0.0.1:2'}]\n")
    assert load_gateway_settings(path).shards == (ShardSettings("shard-0", "127.0.0.1:1", "127.0.0.1:2"),)


class FakeRpcError(grpc.aio.AioRpcError):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details, None)


@pytest.mark.parametrize("code, details, retried_read, retried_send", [
    (grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses; last error: refused", True, True),
    (grpc.StatusCode.UNAVAILABLE, "UnavailableError: the commitlog is not writable (stopping)", True, True),
    (grpc.StatusCode.UNAVAILABLE, "Socket closed", True, False),  # the send may have been written
    (grpc.StatusCode.RESOURCE_EXHAUSTED, "broker busy", True, True),
    (grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded", False, False),
    (grpc.StatusCode.INVALID_ARGUMENT, "bad", False, False),
])
def test_the_retry_rule(code: grpc.StatusCode, details: str, retried_read: bool, retried_send: bool) -> None:
    error = backend_error("the commitlog of shard-0 (127.0.0.1:1)", FakeRpcError(code, details))
    policy = RetryPolicy(attempts=3, initial_backoff_s=0.001, max_backoff_s=0.002)

    async def run(kind: str) -> int:
        calls = 0

        async def call() -> str:
            nonlocal calls
            calls += 1
            if calls < 3:
                raise error
            return "ok"

        with contextlib.suppress(BackendError):
            await (policy.read(call) if kind == "read" else policy.send(call))
        return calls

    assert asyncio.run(run("read")) == (3 if retried_read else 1)
    assert asyncio.run(run("send")) == (3 if retried_send else 1)
    if code == grpc.StatusCode.UNAVAILABLE:
        assert error.code == grpc.StatusCode.UNAVAILABLE and "shard-0" in error.details


def test_the_kubernetes_gateway_settings_load() -> None:
    """deploy/k8s/base/config/gateway.yaml (the gateway-settings ConfigMap) is a valid settings file."""
    settings = load_gateway_settings(Path(__file__).parents[2] / "deploy/k8s/base/config/gateway.yaml")
    assert settings.listen == "0.0.0.0:9876" and settings.auth_file and settings.queue_selection == "latency"
    assert [s.commitlog for s in settings.shards] == ["shard-0.shard:9901"]  # deploy/k8s/base/shard.yaml's pod


class FakeCommitLogShard:
    """Stands in for a ShardClient's commitlog: AppendBatch refuses messages carrying a "bad" property,
    all or nothing, naming the first ("message #i", and its position as the status's detail) as the
    commitlog does."""

    name = "shard-0"

    def __init__(self) -> None:
        self.calls: list[int] = []
        self.append_batch_bytes = object()

    async def on_commitlog(self, call: object, data: bytes, timeout: float) -> commitlog_pb2.AppendBatchResponse:
        request = commitlog_pb2.AppendBatchRequest.FromString(data)
        self.calls.append(len(request.messages))
        await asyncio.sleep(0.005)  # the append and its flush: later Sends gather meanwhile
        bad = [i for i, m in enumerate(request.messages) if "bad" in m.properties]
        if bad:
            where = f"message #{bad[0]}: " if len(request.messages) > 1 else ""
            refused = RefusedMessage(bad[0], "PROPERTIES_SIZE_EXCEEDED: too long") if where else None
            raise BackendError(grpc.StatusCode.INVALID_ARGUMENT, f"PROPERTIES_SIZE_EXCEEDED: {where}too long",
                               refused=refused)
        return commitlog_pb2.AppendBatchResponse(results=[
            commitlog_pb2.AppendResult(status=1, topic=m.topic, queue_offset=int(m.body)) for m in request.messages])


def test_concurrent_sends_share_append_batches_and_a_refused_one_fails_alone() -> None:
    shard = FakeCommitLogShard()

    async def run() -> list[commitlog_pb2.AppendResult | BaseException]:
        batcher = SendBatcher(shard, timeout_s=5)  # type: ignore[arg-type]

        async def send(i: int) -> commitlog_pb2.AppendResult:
            message = common_pb2.Message(topic="t", body=str(i).encode(), properties={"bad": "1"} if i == 17 else {})
            return await batcher.send(gateway_pb2.SendRequest(message=message).SerializeToString())

        outcomes = await asyncio.gather(*(send(i) for i in range(64)), return_exceptions=True)
        await batcher.close()
        return outcomes

    outcomes = asyncio.run(run())
    refused = outcomes[17]
    assert isinstance(refused, BackendError) and refused.code == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.details == "PROPERTIES_SIZE_EXCEEDED: too long"  # its own error, no batch position
    assert [o.queue_offset for o in outcomes if not isinstance(o, BaseException)] == \
        [i for i in range(64) if i != 17]  # every other Send got its own result
    assert len(shard.calls) <= 6, f"64 concurrent Sends took {len(shard.calls)} AppendBatch calls"
    assert sum(shard.calls) - len(shard.calls) < 64 * 2  # the refused batch was sent again once, without it
