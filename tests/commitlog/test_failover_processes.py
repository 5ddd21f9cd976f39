"""Failover through etcd with real processes: three ``mqstore commitlog`` replicas of one shard whose
roles a real etcd decides (``etcdEndpoint``), SYNC_MASTER with minInSyncReplicas 2.

The leader is killed with SIGKILL while a put it wrote is on no follower (both frozen, then killed): the
followers come back, a member of the in-sync set takes the shard in the next epoch and acknowledges
again (measured: SIGKILL of the leader to the first acknowledged send); the old leader,
restarted, cuts the record nobody acknowledged (its divergent suffix) and follows: its commitlog is
then the new leader's, byte for byte.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from services.server.etcd_client import EtcdClient
from services.server.shard_keys import ShardKeys, read_shard
from tests.commitlog.commitlog_process import CommitLogProcess, StartCommitLog, free_port
from tests.commitlog.etcd_process import running_etcd
from tests.commitlog.replicas import BASE_ENV, append, assert_same_commitlog, max_offset, message

SHARD = BASE_ENV["MQSTORE_BROKER_NAME"]


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[str]:
    with running_etcd(tmp_path / "etcd") as endpoint:
        yield endpoint


def _env(etcd: str, ha_port: int, name: str) -> dict[str, str]:
    return {**BASE_ENV, "MQSTORE_ETCD_ENDPOINT": etcd, "MQSTORE_HA_LISTEN_PORT": str(ha_port),
            "MQSTORE_HA_REPLICA_NAME": name, "MQSTORE_BROKER_ROLE": "SYNC_MASTER",
            "MQSTORE_MIN_IN_SYNC_REPLICAS": "2", "MQSTORE_HA_SEND_TIMEOUT": "3000",
            "MQSTORE_HA_LEASE_TTL_SECONDS": "2", "MQSTORE_HA_HOUSEKEEPING_INTERVAL": "3000"}


def _wait_for(what: str, check: object, timeout_s: float = 20.0) -> object:
    deadline = time.monotonic() + timeout_s
    while not (value := check()):  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)
    return value


def test_a_killed_leader_is_replaced_by_an_in_sync_member_and_its_unacked_suffix_is_cut(
        etcd: str, tmp_path: Path, start_commitlog: StartCommitLog) -> None:
    client = EtcdClient(etcd)
    keys = ShardKeys(SHARD)
    ports = {f"r{i}": free_port() for i in range(3)}
    replicas: dict[str, CommitLogProcess] = {}
    for name, port in ports.items():
        replicas[name] = start_commitlog(tmp_path / name, _env(etcd, port, name))

    def leader() -> str | None:
        view = read_shard(client, keys)
        full = view.leader is not None and view.in_sync is not None and len(view.in_sync.members) == 3
        return view.leader.replica if full and view.leader is not None else None

    first = str(_wait_for("a leader with all three replicas in sync", leader))
    for i in range(20):
        append(replicas[first], message(i))
    others = [n for n in replicas if n != first]
    with pytest.raises(grpc.RpcError) as refused:  # a follower takes no writes
        append(replicas[others[0]], message(0))
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION

    # Both followers freeze (their connections stay: the leader waits for them up to haSendTimeout, and
    # the in-sync set in etcd still lists them); the leader writes a put, and dies before it may ack it;
    # the followers die frozen, before reading the put from their sockets: nobody else holds it.
    acked_end = max_offset(replicas[first])
    for name in others:
        os.kill(replicas[name].pid, signal.SIGSTOP)
    stray = threading.Thread(target=lambda: _ignore_errors(append, replicas[first], message(999)), daemon=True)
    stray.start()
    time.sleep(0.5)
    assert max_offset(replicas[first]) > acked_end, "the stray put was not written"
    replicas[first].kill9()
    killed_at = time.monotonic()
    for name in others:
        replicas[name].kill9()
        replicas[name] = start_commitlog(tmp_path / name, _env(etcd, ports[name], name))

    second = str(_wait_for("a new leader", lambda: (v := read_shard(client, keys)).leader and v.epoch == 2
                           and v.leader.replica, timeout_s=30))
    assert second in others
    result = _wait_for("an acknowledged send to the new leader", lambda: _ignore_errors(
        append, replicas[second], message(1000)), timeout_s=30)
    failover_s = time.monotonic() - killed_at  # includes restarting both followers
    assert result
    for i in range(1001, 1020):
        append(replicas[second], message(i))
    assert max_offset(replicas[second]) > 0

    # The old leader comes back: its unacknowledged record goes, it follows epoch 2.
    old = start_commitlog(tmp_path / first, _env(etcd, ports[first], first))
    target = max_offset(replicas[second])
    _wait_for("the old leader to catch up", lambda: max_offset(old) >= target, timeout_s=30)
    assert_same_commitlog(tmp_path / second, tmp_path / first, target)
    assert "TRUNCATED" in old.logs(), old.logs()[-3000:]
    client.close()
    print(f"failover: leader SIGKILL -> first acknowledged send in {failover_s:.2f} s")


def _ignore_errors(call: object, *args: object) -> object:
    try:
        return call(*args)  # type: ignore[operator]
    except grpc.RpcError:
        return None


def test_only_an_in_sync_replica_is_promoted(etcd: str, tmp_path: Path, start_commitlog: StartCommitLog) -> None:
    """Both followers die; the leader's next put shrinks the in-sync set to itself in etcd (and is refused:
    one copy is not enough). The leader dies too; the followers come back, but neither may take the
    shard (outside the set, either may lack what the set holds): the shard waits for its only member,
    which leads epoch 2 when it returns."""
    client = EtcdClient(etcd)
    keys = ShardKeys(SHARD)
    ports = {f"r{i}": free_port() for i in range(3)}
    replicas = {name: start_commitlog(tmp_path / name, _env(etcd, port, name)) for name, port in ports.items()}

    def full_leader() -> str | None:
        view = read_shard(client, keys)
        full = view.leader is not None and view.in_sync is not None and len(view.in_sync.members) == 3
        return view.leader.replica if full and view.leader is not None else None

    first = str(_wait_for("a leader with all three replicas in sync", full_leader))
    append(replicas[first], message(0))
    others = [n for n in replicas if n != first]
    for name in others:
        replicas[name].kill9()
    with pytest.raises(grpc.RpcError) as refused:
        append(replicas[first], message(1))
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    view = read_shard(client, keys)
    assert view.in_sync is not None and view.in_sync.members == {first}
    replicas[first].kill9()
    for name in others:
        replicas[name] = start_commitlog(tmp_path / name, _env(etcd, ports[name], name))
    _wait_for("a follower refusing to campaign", lambda: all(
        "may not be promoted" in replicas[n].logs() for n in others), timeout_s=20)
    assert read_shard(client, keys).leader is None
    replicas[first] = start_commitlog(tmp_path / first, _env(etcd, ports[first], first))
    assert _wait_for("the member back as leader", full_leader, timeout_s=30) == first
    assert read_shard(client, keys).epoch == 2
    append(replicas[first], message(2))
    client.close()
