"""slaveReadEnable through the gateway (``mqstore up --replicas 3``): a consumer far behind the log's end
pulls from an in-sync follower, one near the end from the leader, and every pull answers the same
messages whichever replica served it. A follower that cannot answer is passed over for the leader.
While the leader's query service is down, a pull of a message the followers' indexers have not reached
yet waits for them (within its long poll) rather than answering nothing.

The share of memory (accessMessageInMemoryMaxRatio) is set so that "far behind" is 96 KiB on any
machine: 400 messages of 1 KiB make the first pulls cold and the last ones warm.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator

import pytest

from bench.services import free_port_block
from mqstore.client.records import decode_records
from mqstore.v1 import common_pb2, gateway_pb2, query_pb2
from services.query.main import STORE_VIEW_REFRESH_S
from services.replica_set import REPLICA_METRICS_OFFSET, SERVICES
from services.store.rules.cold_read import physical_memory_bytes
from tests.commitlog.commitlog_process import commitlog_env, mqstore_command
from tests.gateway.system_process import UpProcess
from tests.gateway.test_up_replicas import _kill_etcd, _leader, _pid
from tests.observability.test_metrics import Samples, scrape

REPLICAS = 3
TOPIC = "cold-reads"
MESSAGES = 400
COLD_BYTES = 96 * 1024


@pytest.fixture(scope="module")
def slave_read(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpProcess]:
    tmp_path = tmp_path_factory.mktemp("slave-read")
    store = tmp_path / "store"
    base_port = free_port_block(10 * (REPLICAS + 1) + 5)
    metrics_base = free_port_block(REPLICA_METRICS_OFFSET + 10 * REPLICAS + 5,
                                   avoid=range(base_port, base_port + 10 * (REPLICAS + 1) + 5))
    ratio = 100 * COLD_BYTES / physical_memory_bytes()
    env = commitlog_env({"MQSTORE_SLAVE_READ_ENABLE": "true",
                         "MQSTORE_ACCESS_MESSAGE_IN_MEMORY_MAX_RATIO": repr(ratio)})
    log_path = tmp_path / "up.log"
    with open(log_path, "ab") as log_file:
        proc = subprocess.Popen([*mqstore_command(), "up", "--replicas", str(REPLICAS), "--store", str(store),
                                 "--base-port", str(base_port), "--metrics-base-port", str(metrics_base)],
                                env=env, stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file)
    up = UpProcess(store, base_port, metrics_base, proc, log_path)
    try:
        up.wait_up(60)
        yield up
        assert up.stop() == 0, up.logs()[-5000:]
    finally:
        up.kill_all()
        _kill_etcd(up)


def _follower_reads(up: UpProcess) -> dict[tuple[str, str], float]:
    samples: Samples = scrape(up.metrics_base_port + 1)  # the gateway's (worker 0)
    return {(dict(labels)["replica"], dict(labels)["reason"]): v for (name, labels), v in samples.items()
            if name == "mqstore_gateway_follower_reads_total"}


def _pulls_served(up: UpProcess, replica: int) -> float:
    port = up.metrics_base_port + REPLICA_METRICS_OFFSET + 10 * replica + SERVICES.index("query")
    return sum(v for (name, _), v in scrape(port).items() if name == "mqstore_query_pulls_total")


def _pull_all(up: UpProcess, queue_id: int, raw: bool) -> list[bytes]:
    bodies: list[bytes] = []
    offset = 0
    while True:
        pulled = up.stub.Pull(query_pb2.PullMessageRequest(topic=TOPIC, queue_id=queue_id, queue_offset=offset,
                                                           max_messages=8, raw_records=raw), timeout=10)
        if pulled.status != query_pb2.GET_MESSAGE_STATUS_FOUND:
            return bodies
        if raw:
            bodies += [m.body for m in decode_records(pulled.records)]
        else:
            bodies += [m.body for m in pulled.messages]
        offset = pulled.next_begin_offset


def test_a_consumer_far_behind_pulls_from_an_in_sync_follower_and_gets_the_same_messages(
        slave_read: UpProcess) -> None:
    up = slave_read
    sent: list[bytes] = []
    for i in range(MESSAGES):
        body = f"{i:05d}".encode() + b"x" * 1019
        sent.append(body)
        result = up.stub.Send(gateway_pb2.SendRequest(message=common_pb2.Message(topic=TOPIC, body=body),
                                                      queue_id=0), timeout=15)
        assert result.queue_id == 0
    leader, _ = _leader(f"127.0.0.1:{up.base_port + 1}")
    leader_index = int(leader.rsplit("-", 1)[1])
    # A query service measures "behind the log's end" against its view of that end, refreshed every second
    # (services/query/main.py STORE_VIEW_REFRESH_S): a view older than the last sends finds fewer pulls cold.
    time.sleep(2 * STORE_VIEW_REFRESH_S + 0.5)
    before = [_pulls_served(up, i) for i in range(REPLICAS)]

    assert _pull_all(up, 0, raw=False) == sent
    reads = _follower_reads(up)
    cold = {replica: n for (replica, reason), n in reads.items() if reason == "cold"}
    assert cold, f"no pull went to a follower: {reads}"
    assert leader not in cold
    # 400 KiB with the last 96 KiB warm: about three quarters of the 50 pulls went to one follower.
    assert 30 <= sum(cold.values()) <= 45, cold
    served = [_pulls_served(up, i) - before[i] for i in range(REPLICAS)]
    follower = int(next(iter(cold)).rsplit("-", 1)[1])
    assert served[follower] == sum(cold.values()) and served[leader_index] >= 50 - served[follower], served

    # Raw pulls take the same path; a follower whose query service is gone is passed over for the leader.
    assert _pull_all(up, 0, raw=True) == sent
    os.kill(_pid(up.store, f"replica-{follower}", "query"), signal.SIGKILL)
    assert _pull_all(up, 0, raw=False) == sent


def test_a_pull_the_followers_have_not_indexed_yet_waits_for_them_while_the_leader_is_down(
        slave_read: UpProcess) -> None:
    up = slave_read
    leader, _ = _leader(f"127.0.0.1:{up.base_port + 1}")
    followers = [f"replica-{i}" for i in range(REPLICAS) if f"replica-{i}" != leader]
    indexers = [_pid(up.store, name, "indexer") for name in followers]
    for pid in indexers:
        os.kill(pid, signal.SIGSTOP)
    try:
        sent = [up.stub.Send(gateway_pb2.SendRequest(message=common_pb2.Message(topic=TOPIC, body=b"late-%d" % i),
                                                     queue_id=1), timeout=15) for i in range(3)]
        os.kill(_pid(up.store, leader, "query"), signal.SIGKILL)
        resume = threading.Timer(1.0, lambda: [os.kill(pid, signal.SIGCONT) for pid in indexers])
        resume.start()
        last = sent[-1]
        pulled = up.stub.Pull(query_pb2.PullMessageRequest(topic=TOPIC, queue_id=1, queue_offset=last.queue_offset,
                                                           max_messages=1, long_poll_ms=8000), timeout=15)
        resume.join()
    finally:
        for pid in indexers:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGCONT)
    assert [m.body for m in pulled.messages] == [b"late-2"], pulled
    assert any(reason == "leader_unreachable" for _, reason in _follower_reads(up)), _follower_reads(up)
