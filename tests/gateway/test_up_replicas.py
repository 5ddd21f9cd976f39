"""``mqstore up --replicas 3``: a local etcd, three replicas of the shard, one gateway that follows the
leader. The leader's commitlog is SIGKILLed under a producer: sends resume through the same gateway
within 10 s, and every acknowledged message is readable afterwards, by pull at its queue offset and by
its offset msg id, with no queue offset acknowledged twice. Prints the leader-kill-to-first-ack time.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from bench.services import free_port_block
from mqstore.v1 import admin_pb2, common_pb2, gateway_pb2, query_pb2
from services.server.etcd_client import EtcdClient
from services.server.shard_keys import ShardKeys, read_shard
from tests.commitlog.commitlog_process import commitlog_env, mqstore_command
from tests.gateway.system_process import UpProcess

REPLICAS = 3
TOPIC = "replicated"
RESUME_WITHIN_S = 10.0


@dataclass(frozen=True)
class Ack:
    body: bytes
    queue_id: int
    queue_offset: int
    offset_msg_id: str
    sent_at: float  # when the send began
    acked_at: float


@pytest.fixture
def replicated(tmp_path: Path) -> Iterator[UpProcess]:
    store = tmp_path / "store"
    base_port = free_port_block(10 * (REPLICAS + 1) + 5)  # gateway, etcd, then 10 per replica
    log_path = tmp_path / "up.log"
    with open(log_path, "ab") as log_file:
        proc = subprocess.Popen([*mqstore_command(), "up", "--replicas", str(REPLICAS), "--store", str(store),
                                 "--base-port", str(base_port), "--no-metrics"],
                                env=commitlog_env(), stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file)
    up = UpProcess(store, base_port, 0, proc, log_path)
    try:
        up.wait_up(60)
        yield up
        assert up.stop() == 0, up.logs()[-5000:]
        assert "etcd stopped" in up.logs().splitlines()[-1], "etcd stops last"
        for i in range(REPLICAS):
            assert not (store / f"replica-{i}" / "abort").exists(), "a clean stop leaves no abort file"
    finally:
        up.kill_all()
        _kill_etcd(up)


def _kill_etcd(up: UpProcess) -> None:
    for line in up.logs().splitlines():
        if line.startswith("started etcd (pid "):
            pid = int(line.split("(pid ")[1].split(")")[0])
            with contextlib.suppress(OSError):
                if b"etcd" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    os.kill(pid, signal.SIGKILL)


def _pid(store: Path, replica: str, service: str = "commitlog") -> int:
    """The pid of ``replica``'s ``service`` (a child of the runner, found by its command line)."""
    root = store / replica if service == "commitlog" else store / replica / service
    wanted = f"{service}\0--store\0{root}\0".encode()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if wanted in (entry / "cmdline").read_bytes():
                    return int(entry.name)
    raise AssertionError(f"no {service} process of {replica}")


class Producer(threading.Thread):
    """Sends one message after another through the gateway; keeps what was acknowledged."""

    def __init__(self, up: UpProcess) -> None:
        super().__init__(daemon=True)
        self.up = up
        self.acks: list[Ack] = []
        self.refused = 0
        self.stop_at: float | None = None
        self.stopped = threading.Event()

    def run(self) -> None:
        i = 0
        while not self.stopped.is_set():
            body = f"m-{i}".encode()
            i += 1
            sent_at = time.monotonic()
            try:
                sent = self.up.stub.Send(gateway_pb2.SendRequest(message=common_pb2.Message(topic=TOPIC, body=body)),
                                         timeout=15)
            except grpc.RpcError:
                self.refused += 1
                time.sleep(0.05)
                continue
            self.acks.append(Ack(body, sent.queue_id, sent.queue_offset, sent.offset_msg_id, sent_at,
                                 time.monotonic()))

    def wait_acks(self, count: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.acks) < count:
            assert time.monotonic() < deadline, f"only {len(self.acks)} sends acknowledged in {timeout_s} s"
            time.sleep(0.05)


def _leader(etcd: str, broker_name: str = "broker-a") -> tuple[str, int]:
    """The replica etcd names leader, and its epoch."""
    client = EtcdClient(etcd)
    try:
        view = read_shard(client, ShardKeys(broker_name))
    finally:
        client.close()
    assert view.leader is not None, "etcd names no leader"
    return view.leader.replica, view.leader.epoch


def test_a_killed_leader_is_followed_by_the_gateway_and_nothing_acknowledged_is_lost(
        replicated: UpProcess) -> None:
    up = replicated
    leader, epoch = _leader(f"127.0.0.1:{up.base_port + 1}")
    producer = Producer(up)
    producer.start()
    producer.wait_acks(20, 20)
    os.kill(_pid(up.store, leader), signal.SIGKILL)
    killed_at = time.monotonic()
    deadline = killed_at + 30
    while not (after := [a for a in producer.acks[-5:] if a.sent_at > killed_at]):
        assert time.monotonic() < deadline, "no send acknowledged within 30 s of the leader's death"
        time.sleep(0.02)
    resumed = after[0].acked_at - killed_at
    print(f"\nleader {leader} SIGKILLed: first acknowledged send through the same gateway after {resumed:.2f} s "
          f"({producer.refused} sends refused meanwhile)")
    producer.wait_acks(len(producer.acks) + 20, 20)
    producer.stopped.set()
    producer.join(20)
    assert resumed < RESUME_WITHIN_S, f"sends resumed {resumed:.2f} s after the leader died"
    # The next epoch's leader: another member, or the killed one itself, restarted by the runner and
    # still a member of the in-sync set, when it campaigned first.
    new_leader, new_epoch = _leader(f"127.0.0.1:{up.base_port + 1}")
    assert new_epoch > epoch
    _assert_status(up, new_leader, new_epoch)

    # The leader's query service dies: reads go to an in-sync follower's (slaveReadEnable).
    os.kill(_pid(up.store, new_leader, "query"), signal.SIGKILL)
    _assert_readable(up, producer.acks[-3:])
    _assert_readable(up, producer.acks)

    offsets = [(a.queue_id, a.queue_offset) for a in producer.acks]
    assert len(set(offsets)) == len(offsets), "a queue offset was acknowledged twice"


def _assert_readable(up: UpProcess, acks: list[Ack]) -> None:
    for ack in acks:
        pulled = up.stub.Pull(query_pb2.PullMessageRequest(topic=TOPIC, queue_id=ack.queue_id,
                                                           queue_offset=ack.queue_offset, max_messages=1,
                                                           long_poll_ms=5000), timeout=10)
        assert [m.body for m in pulled.messages[:1]] == [ack.body], f"pull at {ack.queue_id}/{ack.queue_offset}"
        got = up.stub.GetMessage(query_pb2.ViewMessageRequest(msg_id=ack.offset_msg_id), timeout=10)
        assert got.message.body == ack.body, f"get by offset msg id {ack.offset_msg_id}"


def _assert_status(up: UpProcess, leader: str, epoch: int) -> None:
    """``mqstore status`` (GetClusterStatus): each replica's role and epoch as etcd says, its offset and
    lag, and in-sync membership; the new leader leads a later epoch than the first."""
    shard = up.stub.GetClusterStatus(admin_pb2.GetClusterStatusRequest(), timeout=10).shards[0]
    replicas = {r.name: r for r in shard.replicas}
    assert sorted(replicas) == [f"replica-{i}" for i in range(REPLICAS)], shard
    assert [n for n, r in replicas.items() if r.role == "LEADER"] == [leader], shard
    assert replicas[leader].epoch == epoch and replicas[leader].in_sync and replicas[leader].lag_bytes == 0
    assert replicas[leader].max_offset == shard.max_offset > 0
    # The shard's services row is the leader's.
    assert {s.name: s.address for s in shard.services}["commitlog"] == replicas[leader].commitlog
