"""Gateway workers with real processes: ``mqstore up --gateway-workers 2`` and a standalone ``mqstore
gateway --workers 2`` in front of the same shard.

Many clients (each its own connection, so the kernel spreads them over the workers) send; every
acknowledged message is pulled back exactly once, round robin stays even, a sharding key still picks
one queue, tokens are checked by every worker. kill -9 of a worker: it is restarted, acknowledged
messages stay, new clients are served. A second group on a port in use exits 2; SIGTERM stops every
worker cleanly.
"""

from __future__ import annotations

import collections
import os
import re
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.services import free_port_block
from mqstore.v1 import commitlog_pb2, common_pb2, gateway_pb2, gateway_pb2_grpc, query_pb2
from tests.commitlog.commitlog_process import CHANNEL_OPTIONS, commitlog_env, mqstore_command
from tests.gateway.system_process import UpProcess, running_up

QUEUES = 8
PUT_OK = commitlog_pb2.PUT_MESSAGE_STATUS_PUT_OK
_STARTED = re.compile(r"gateway worker (\d+)/\d+ started \(pid (\d+)\)")


@pytest.fixture(scope="module")
def up2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpProcess]:
    metrics = free_port_block(6)  # commitlog, indexer, query, then one port per gateway worker
    with running_up(tmp_path_factory.mktemp("workers") / "store",
                    extra_args=["--gateway-workers", "2", "--metrics-base-port", str(metrics)]) as started:
        started.metrics_base_port = metrics
        _wait(lambda: len(_worker_pids(started.logs())) == 2 and _all_metrics_answer(started, 2), 30,
              "both workers serving")
        yield started


def _worker_pids(logs: str) -> dict[int, int]:
    """The latest pid of each worker, from the supervisor's log lines."""
    return {int(index): int(pid) for index, pid in _STARTED.findall(logs)}


def _worker_metrics(base: int, worker: int) -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{base + worker}/metrics", timeout=5).read().decode()


def _all_metrics_answer(up: UpProcess, workers: int) -> bool:
    try:
        for i in range(workers):
            _worker_metrics(up.metrics_base_port + 4, i)
    except OSError:
        return False
    return True


def _sent_by(metrics: str) -> float:
    match = re.search(r"^mqstore_gateway_sent_messages_total (\S+)$", metrics, re.M)
    return float(match.group(1)) if match else 0.0


def _wait(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"not reached in {timeout_s}s: {what}")
        time.sleep(0.1)


def _stub(channel: grpc.Channel) -> gateway_pb2_grpc.MessagingServiceStub:
    return gateway_pb2_grpc.MessagingServiceStub(channel)


def _pull_all(up: UpProcess, topic: str, expected: int, timeout_s: float = 30.0) -> list[tuple[int, bytes]]:
    """Every (queue id, body) of the topic, once the queues hold ``expected`` messages."""
    deadline = time.monotonic() + timeout_s
    while True:
        found: list[tuple[int, bytes]] = []
        for queue in range(QUEUES):
            offset = 0
            while True:
                answer = up.stub.Pull(query_pb2.PullMessageRequest(topic=topic, queue_id=queue, queue_offset=offset,
                                                                   max_messages=1024), timeout=10)
                found += [(queue, m.body) for m in answer.messages]
                if not answer.messages:
                    break
                offset = answer.next_begin_offset
        if len(found) >= expected or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


Sent = tuple[list[gateway_pb2.SendResult], list[bytes], list[bytes]]


def _send_from_clients(target: str, topic: str, clients: int, per_client: int, sharding_key: str = "",
                       label: str = "") -> Sent:
    """``clients`` threads, each on its own connection, sending unary Sends one at a time (bodies
    "topic-<label><client>-<i>"). Returns the
    results and the bodies acknowledged and failed (a failed send is not retried: it may be stored)."""
    results: list[gateway_pb2.SendResult] = []
    acked: list[bytes] = []
    failed: list[bytes] = []
    lock = threading.Lock()

    def client(index: int) -> None:
        with grpc.insecure_channel(target, options=CHANNEL_OPTIONS) as channel:
            stub = _stub(channel)
            for i in range(per_client):
                body = f"{topic}-{label}{index}-{i}".encode()
                try:
                    result = stub.Send(gateway_pb2.SendRequest(message=common_pb2.Message(topic=topic, body=body),
                                                               sharding_key=sharding_key), timeout=10)
                except grpc.RpcError as exc:
                    print(f"send {body!r} failed: {exc.code()} {exc.details()}")  # shown when a test fails
                    with lock:
                        failed.append(body)
                    continue
                with lock:
                    results.append(result)
                    acked.append(body)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    return results, acked, failed


def test_many_clients_over_two_workers_every_message_once_round_robin_even(up2: UpProcess) -> None:
    before = [_sent_by(_worker_metrics(up2.metrics_base_port + 4, i)) for i in range(2)]
    results, acked, failed = _send_from_clients(up2.gateway, "workers-rr", clients=16, per_client=40)
    assert not failed and len(acked) == 640
    # The kernel spread the 16 connections over both workers (all on one: probability 2^-15).
    after = [_sent_by(_worker_metrics(up2.metrics_base_port + 4, i)) for i in range(2)]
    assert all(a > b for a, b in zip(after, before, strict=True)), (before, after)
    assert sum(after) - sum(before) == 640
    # Each worker's rotation is even (counts differ by at most 1), so the sum over two by at most 2.
    per_queue = collections.Counter(r.queue_id for r in results)
    assert set(per_queue) == set(range(QUEUES)) and max(per_queue.values()) - min(per_queue.values()) <= 2
    pulled = _pull_all(up2, "workers-rr", 640)
    assert sorted(body for _, body in pulled) == sorted(acked)  # every acked message, exactly once


def test_a_sharding_key_picks_one_queue_whichever_worker_takes_the_send(up2: UpProcess) -> None:
    results, acked, failed = _send_from_clients(up2.gateway, "workers-ordered", clients=8, per_client=10,
                                                sharding_key="order-42")
    assert not failed and len({r.queue_id for r in results}) == 1
    queue = results[0].queue_id
    pulled = _pull_all(up2, "workers-ordered", 80)
    assert {q for q, _ in pulled} == {queue} and sorted(b for _, b in pulled) == sorted(acked)
    # Per client, the queue holds its messages in send order (ordered delivery).
    for client in range(8):
        mine = [b for _, b in pulled if b.startswith(f"workers-ordered-{client}-".encode())]
        assert mine == [f"workers-ordered-{client}-{i}".encode() for i in range(10)]


def test_kill_9_of_a_worker_is_noticed_and_it_is_restarted_without_losing_acked_messages(up2: UpProcess) -> None:
    victim = _worker_pids(up2.logs())[1]
    stop = threading.Event()
    outcome: dict[str, Sent] = {}

    def load() -> None:
        rounds = 0
        while not stop.is_set():
            outcome[f"round-{rounds}"] = _send_from_clients(up2.gateway, "workers-kill", clients=8, per_client=25,
                                                             label=f"r{rounds}-")
            rounds += 1

    sender = threading.Thread(target=load)
    sender.start()
    time.sleep(0.5)
    os.kill(victim, signal.SIGKILL)
    _wait(lambda: _worker_pids(up2.logs()).get(1, victim) != victim, 15, "worker 1 restarted")
    assert f"gateway worker 1 (pid {victim}) exited with signal SIGKILL: restarting it" in up2.logs()
    _wait(lambda: _all_metrics_answer(up2, 2), 30, "the new worker 1 serving /metrics")
    time.sleep(0.5)
    stop.set()
    sender.join(120)
    acked = [b for _, ok, _ in outcome.values() for b in ok]
    failed = {b for _, _, bad in outcome.values() for b in bad}
    pulled = collections.Counter(b for _, b in _pull_all(up2, "workers-kill", len(acked)))
    assert all(pulled[b] == 1 for b in acked), "an acknowledged message is missing or stored twice"
    assert set(pulled) <= set(acked) | failed and all(pulled[b] <= 1 for b in failed)
    # New clients are served by both workers again.
    before = [_sent_by(_worker_metrics(up2.metrics_base_port + 4, i)) for i in range(2)]
    _, ok, bad = _send_from_clients(up2.gateway, "workers-after", clients=16, per_client=5)
    assert not bad and len(ok) == 80
    after = [_sent_by(_worker_metrics(up2.metrics_base_port + 4, i)) for i in range(2)]
    assert all(a > b for a, b in zip(after, before, strict=True)), (before, after)


TOKENS = """\
tokens:
  - name: producer
    token: tok-workers
    produce: ["secured-*"]
"""


def _health(target: str) -> int:
    with grpc.insecure_channel(target, options=CHANNEL_OPTIONS) as channel:
        return health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service="mqstore.v1.MessagingService"), timeout=10,
            wait_for_ready=True).status


def test_a_standalone_worker_group_checks_tokens_in_every_worker_refuses_a_taken_port_and_stops_cleanly(
        up2: UpProcess, tmp_path: Path) -> None:
    (tmp_path / "tokens.yaml").write_text(TOKENS)
    port = free_port_block(1)
    metrics = free_port_block(2, avoid=range(port, port + 1))
    target = f"127.0.0.1:{port}"
    log_path = tmp_path / "gateway.log"
    command = [*mqstore_command(), "gateway", "--workers", "2", "--listen", target, "--commitlog", up2.commitlog,
               "--query", up2.query, "--auth-file", str(tmp_path / "tokens.yaml")]
    with open(log_path, "wb") as log_file:
        group = subprocess.Popen(command, env=commitlog_env({"MQSTORE_METRICS_PORT": str(metrics)}),
                                 stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file)
    try:
        _wait(lambda: len(_worker_pids(log_path.read_text())) == 2, 30, "two workers started")
        assert _health(target) == health_pb2.HealthCheckResponse.SERVING
        _wait(lambda: all(_metrics_ok(metrics + i) for i in range(2)), 30, "both workers serving /metrics")
        codes: list[grpc.StatusCode] = []
        for _ in range(16):  # 16 connections: both workers answer (all on one: probability 2^-15)
            with grpc.insecure_channel(target, options=CHANNEL_OPTIONS) as channel:
                try:
                    _stub(channel).Send(gateway_pb2.SendRequest(message=common_pb2.Message(
                        topic="secured-a", body=b"no token")), timeout=10)
                except grpc.RpcError as exc:
                    codes.append(exc.code())
                result = _stub(channel).Send(gateway_pb2.SendRequest(message=common_pb2.Message(
                    topic="secured-a", body=b"with token")), metadata=(("authorization", "Bearer tok-workers"),),
                    timeout=10)
                assert result.status == PUT_OK
        assert codes == [grpc.StatusCode.UNAUTHENTICATED] * 16
        calls = [_metrics_text(metrics + i) for i in range(2)]
        assert all('code="UNAUTHENTICATED"' in text and _sent_by(text) > 0 for text in calls)

        second = subprocess.run(command, env=commitlog_env({"MQSTORE_METRICS_PORT": str(metrics + 10)}),
                                stdin=subprocess.DEVNULL, capture_output=True, timeout=60)
        assert second.returncode == 2 and b"cannot listen on" in second.stderr, second.stderr[-2000:]
        assert _health(target) == health_pb2.HealthCheckResponse.SERVING

        pids = list(_worker_pids(log_path.read_text()).values())
        group.send_signal(signal.SIGTERM)
        assert group.wait(60) == 0, log_path.read_text()[-3000:]
        assert all(not Path(f"/proc/{pid}").exists() for pid in pids)
        assert "gateway workers stopped" in log_path.read_text()
    finally:
        if group.poll() is None:
            group.kill()
            group.wait()
        for pid in _worker_pids(log_path.read_text()).values():
            if Path(f"/proc/{pid}/cmdline").exists() and b"gateway" in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.kill(pid, signal.SIGKILL)


def _metrics_text(port: int) -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()


def _metrics_ok(port: int) -> bool:
    try:
        _metrics_text(port)
    except OSError:
        return False
    return True


def test_a_worker_that_cannot_start_stops_the_group_with_code_2(tmp_path: Path) -> None:
    """Worker 1's metrics port is taken: it exits 2 (bad settings), which a restart would not fix, so
    the supervisor stops worker 0 and exits 2 instead of restarting it forever."""
    port = free_port_block(1)
    metrics = free_port_block(2, avoid=range(port, port + 1))
    log_path = tmp_path / "gateway.log"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", metrics + 1))
        taken.listen()
        with open(log_path, "wb") as log_file:
            group = subprocess.run(
                [*mqstore_command(), "gateway", "--workers", "2", "--listen", f"127.0.0.1:{port}",
                 "--commitlog", "127.0.0.1:1", "--query", "127.0.0.1:2"],
                env=commitlog_env({"MQSTORE_METRICS_PORT": str(metrics)}), stdin=subprocess.DEVNULL,
                stdout=log_file, stderr=log_file, timeout=60, check=False)
    logs = log_path.read_text()
    assert group.returncode == 2, logs[-3000:]
    assert "gateway worker 1 (pid" in logs and "exited with code 2" in logs and "stopping the group" in logs
    assert all(not Path(f"/proc/{pid}").exists() for pid in _worker_pids(logs).values())


def test_a_topic_created_through_one_worker_is_found_at_once_by_every_worker(up2: UpProcess) -> None:
    """Each worker has just read its route table (a miss made it), then one worker creates a topic: a read
    of the topic on every connection finds it at once, though every other worker's table predates it
    (a miss within the table's refresh pause asks the shards for that topic alone)."""
    channels = [grpc.insecure_channel(up2.gateway, options=CHANNEL_OPTIONS) for _ in range(16)]
    try:
        stubs = [_stub(c) for c in channels]
        for round_ in range(3):
            topic = f"workers-created-{round_}"
            for stub in stubs:  # every worker's table read a moment ago
                with pytest.raises(grpc.RpcError) as missing:
                    stub.GetQueueOffsets(query_pb2.GetQueueOffsetRangeRequest(topic=f"absent-{round_}"), timeout=10)
                assert missing.value.code() == grpc.StatusCode.NOT_FOUND
            stubs[0].CreateTopic(commitlog_pb2.TopicRequest(topic=common_pb2.TopicConfig(
                topic=topic, read_queue_nums=2, write_queue_nums=2, perm=6)), timeout=10)
            for stub in stubs:
                found = stub.GetQueueOffsets(query_pb2.GetQueueOffsetRangeRequest(topic=topic, queue_id=1), timeout=10)
                assert (found.min_offset, found.max_offset) == (0, 0)
    finally:
        for channel in channels:
            channel.close()
