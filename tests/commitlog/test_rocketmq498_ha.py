"""Both directions of 4.9.8's plain HA wire against a real RocketMQ 4.9.8 DefaultMessageStore built from
source (``make check-rocketmq-ha``; skipped when it is not built): a 4.9.8 slave follows an mqstore
leader, and an mqstore follower follows a 4.9.8 SYNC_MASTER. Each follower starts empty while its leader
already has a full file (so it gets the leader's last file on, as 4.9.8 streams a fresh slave) and is
restarted once (so it resumes from its own max offset). At the end the follower's commitlog files equal
the leader's, whole files, byte for byte (docs/replication.md, "A real RocketMQ 4.9.8")."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from mqstore.v1 import commitlog_pb2, commitlog_pb2_grpc
from tests.commitlog.commitlog_process import StartCommitLog, free_port
from tests.commitlog.replicas import AUTH, BASE_ENV, FILE_SIZE, follower_env, max_offset, message
from tests.commitlog.rocketmq498_process import RocketMQ498Store, missing_reason

PLAIN = {"MQSTORE_HA_PROTOCOL": "rocketmq"}
FILES = 4  # the leader's files at the end; the follower holds all but the first
BIG_BODY = 20_000  # a record over several frames (haTransferBatchSize 4096 on both sides)


@pytest.fixture(autouse=True)
def _built() -> None:
    reason = missing_reason()
    if reason and os.environ.get("MQSTORE_REQUIRE_ROCKETMQ498"):
        pytest.fail(reason)
    if reason:
        pytest.skip(reason)


@pytest.fixture
def java_stores() -> Iterator[list[RocketMQ498Store]]:
    stores: list[RocketMQ498Store] = []
    yield stores
    for store in stores:
        store.kill()


def assert_follower_files_equal(leader: Path, follower: Path) -> int:
    """The follower has the leader's files from the leader's second one on (a fresh follower gets the
    leader's last file first), each equal as a whole file (4.9.8 maps every file at its full size);
    returns the bytes compared."""
    ours = sorted(p.name for p in (leader / "commitlog").iterdir())
    theirs = sorted(p.name for p in (follower / "commitlog").iterdir())
    assert theirs == ours[1:], (ours, theirs)
    for name in theirs:
        a, b = (leader / "commitlog" / name).read_bytes(), (follower / "commitlog" / name).read_bytes()
        if a != b:
            at = next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), min(len(a), len(b)))
            raise AssertionError(f"commitlog/{name} differs at {int(name) + at} ({len(a)} and {len(b)} bytes)")
    return sum((follower / "commitlog" / name).stat().st_size for name in theirs)


def wait_offset(read: Callable[[], int], target: int, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while (reached := read()) < target:
        assert time.monotonic() < deadline, f"{what} at {reached}, the leader at {target}"
        time.sleep(0.05)


class MqstoreSender:
    """Batches to an mqstore SYNC_MASTER; counts every message written (an UNAVAILABLE SLAVE_NOT_AVAILABLE
    put is written on the leader, only not acknowledged)."""

    def __init__(self, leader_stub: commitlog_pb2_grpc.CommitLogServiceStub) -> None:
        self.stub = leader_stub
        self.sent = 0

    def _batch(self, size: int, body_bytes: int = 0) -> None:
        batch = [message(self.sent + k) for k in range(size)]
        for msg in batch if body_bytes else []:
            msg.body = msg.body * (body_bytes // len(msg.body) + 1)
        self.sent += size
        self.stub.AppendBatch(commitlog_pb2.AppendBatchRequest(messages=batch), timeout=30, metadata=AUTH)

    def unreplicated(self, leader_end: Callable[[], int], end: int) -> None:
        """With no follower: every batch is written and answered SLAVE_NOT_AVAILABLE."""
        while leader_end() < end:
            with pytest.raises(grpc.RpcError) as exc:
                self._batch(50)
            assert "SLAVE_NOT_AVAILABLE" in str(exc.value.details())

    def regardless(self, stop: threading.Event) -> None:
        """Batches until ``stop``, whatever the answers (the follower is killed meanwhile: UNAVAILABLE)."""
        while not stop.is_set():
            for size, body_bytes in ((50, 0), (2, BIG_BODY)):
                try:
                    self._batch(size, body_bytes)
                except grpc.RpcError as exc:
                    assert exc.code() == grpc.StatusCode.UNAVAILABLE, exc.details()

    def replicated(self, leader_end: Callable[[], int], end: int) -> None:
        """Once the follower has reported (a probe of one message until acknowledged), acknowledged batches
        until the leader's log reaches ``end``."""
        deadline = time.monotonic() + 30
        while True:
            try:
                self._batch(1)
                break
            except grpc.RpcError as exc:
                assert "SLAVE_NOT_AVAILABLE" in str(exc.details()) and time.monotonic() < deadline
                time.sleep(0.1)
        while leader_end() < end:
            self._batch(50)
            self._batch(2, BIG_BODY)


def test_a_rocketmq_498_slave_follows_an_mqstore_leader(start_commitlog: StartCommitLog, tmp_path: Path,
                                                        java_stores: list[RocketMQ498Store]) -> None:
    """A 4.9.8 SLAVE on an mqstore SYNC_MASTER (haProtocol=rocketmq): the leader acks once the slave
    reports; the slave killed with SIGKILL mid-stream resumes from what its recovery kept; its own
    dispatch parses every record into its ConsumeQueues."""
    ha_port = free_port()
    leader = start_commitlog(tmp_path / "leader", {**BASE_ENV, **PLAIN, "MQSTORE_BROKER_ROLE": "SYNC_MASTER",
                                                   "MQSTORE_HA_LISTEN_PORT": str(ha_port),
                                                   "MQSTORE_HA_SEND_TIMEOUT": "3000"})
    sender = MqstoreSender(leader.stub)
    sender.unreplicated(lambda: max_offset(leader), FILE_SIZE + 1000)
    slave_dir = tmp_path / "slave498"
    java_stores.append(slave := RocketMQ498Store("SLAVE", slave_dir, FILE_SIZE, f"127.0.0.1:{ha_port}"))
    sender.replicated(lambda: max_offset(leader), 2 * FILE_SIZE + 1000)
    # SIGKILL while the leader streams: the slave's tail may end inside a record; 4.9.8's abnormal
    # recovery cuts it, and the slave reports less than it had received before.
    stop = threading.Event()
    streaming = threading.Thread(target=sender.regardless, args=(stop,), daemon=True)
    streaming.start()
    wait_offset(slave.max_offset, slave.max_offset() + 100_000, "the 4.9.8 slave")
    slave.kill()
    stop.set()
    streaming.join(60)
    java_stores.append(slave := RocketMQ498Store("SLAVE", slave_dir, FILE_SIZE, f"127.0.0.1:{ha_port}"))
    sender.replicated(lambda: max_offset(leader), (FILES - 1) * FILE_SIZE + 1000)
    wait_offset(slave.max_offset, max_offset(leader), "the 4.9.8 slave")
    wait_offset(slave.queued, sender.sent, "the 4.9.8 slave's ConsumeQueues")
    slave.stop()
    leader.stop()
    assert assert_follower_files_equal(leader.store_dir, slave_dir) >= (FILES - 1) * FILE_SIZE


def test_an_mqstore_follower_follows_a_rocketmq_498_sync_master(start_commitlog: StartCommitLog, tmp_path: Path,
                                                                java_stores: list[RocketMQ498Store]) -> None:
    """An mqstore SLAVE (haProtocol=rocketmq) on a 4.9.8 SYNC_MASTER: with it every put is PUT_OK (the
    master counted its reports), without it SLAVE_NOT_AVAILABLE."""
    ha_port = free_port()
    master_dir = tmp_path / "master498"
    java_stores.append(master := RocketMQ498Store("SYNC_MASTER", master_dir, FILE_SIZE, str(ha_port)))
    while master.max_offset() < FILE_SIZE + 1000:
        assert master.put(50) == {"SLAVE_NOT_AVAILABLE": 50}
    follower = start_commitlog(tmp_path / "follower", follower_env(ha_port, **PLAIN))
    master.wait_slaves(1)
    while master.max_offset() < 2 * FILE_SIZE + 1000:
        assert master.put(50) == {"PUT_OK": 50}
    follower.stop()
    master.wait_slaves(0)
    assert master.put(1) == {"SLAVE_NOT_AVAILABLE": 1}
    follower = start_commitlog(tmp_path / "follower", follower_env(ha_port, **PLAIN))
    master.wait_slaves(1)
    while master.max_offset() < (FILES - 1) * FILE_SIZE + 1000:
        assert master.put(50) == {"PUT_OK": 50}
        assert master.put(2, BIG_BODY) == {"PUT_OK": 2}
    wait_offset(lambda: max_offset(follower), master.max_offset(), "the mqstore follower")
    follower.stop()
    master.stop()
    assert assert_follower_files_equal(master_dir, follower.store_dir) == (FILES - 1) * FILE_SIZE
