"""A replica's readiness is its replication state, on a real ``mqstore commitlog`` process: its gRPC
health service ``mqstore.v1.Replica`` (what a Kubernetes readinessProbe asks) is NOT_SERVING while the
replica is neither the leader nor in its shard's in-sync set, SERVING once it is; a commitlog without
etcd is always ready."""

from __future__ import annotations

import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2

from services.commitlog.ha.epoch_file import EpochFile
from services.commitlog.ha.replication import READY_SERVICE
from services.server.etcd_client import EtcdClient
from services.server.shard_keys import InSyncSet, LeaderRecord, ShardKeys
from tests.commitlog.commitlog_process import CommitLogProcess, StartCommitLog, free_port
from tests.commitlog.etcd_process import running_etcd

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def _readiness(process: CommitLogProcess) -> int:
    """The status of READY_SERVICE (-1 before the process first set it)."""
    try:
        status: int = process.health.Check(health_pb2.HealthCheckRequest(service=READY_SERVICE), timeout=5).status
    except grpc.RpcError as exc:
        if exc.code() != grpc.StatusCode.NOT_FOUND:
            raise
        return -1
    return status


def _wait_for(process: CommitLogProcess, status: int, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while _readiness(process) != status:
        assert time.monotonic() < deadline, f"{READY_SERVICE} never became {status}:\n{process.logs()[-2000:]}"
        time.sleep(0.1)


def test_a_replica_is_ready_only_as_the_leader_or_an_in_sync_member(tmp_path: Path,
                                                                     start_commitlog: StartCommitLog) -> None:
    _wait_for(start_commitlog(tmp_path / "plain"), SERVING)
    with running_etcd(tmp_path / "etcd") as endpoint:
        client = EtcdClient(endpoint)
        keys = ShardKeys("ready-shard")
        try:
            # Epoch 1's in-sync set is another replica, whose leader lease is gone: this one may not take
            # the shard (it may lack acknowledged records), so it is not ready.
            client.put(keys.epoch, b"1")
            client.put(keys.in_sync, InSyncSet(1, frozenset({"replica-0"})).encode())
            # It followed epoch 1's leader (its epoch file says so): were it to join the in-sync set, it
            # could stand (a member whose file lacks the set's epoch lost its store and may not).
            EpochFile(tmp_path / "replica-1").begin(1, 0)
            replica = start_commitlog(tmp_path / "replica-1", {
                "MQSTORE_ETCD_ENDPOINT": endpoint, "MQSTORE_HA_LISTEN_PORT": str(free_port()),
                "MQSTORE_HA_REPLICA_NAME": "replica-1", "MQSTORE_BROKER_NAME": "ready-shard",
                "MQSTORE_HA_LEASE_TTL_SECONDS": "2"})
            _wait_for(replica, NOT_SERVING)
            time.sleep(1.5)  # three rounds of its leadership loop: it stays out
            assert _readiness(replica) == NOT_SERVING
            client.put(keys.in_sync, InSyncSet(1, frozenset({"replica-0", "replica-1"})).encode())
            _wait_for(replica, SERVING)  # a member now: it campaigns, leads epoch 2 and is ready
            leader = client.get(keys.leader)
            assert leader is not None and LeaderRecord.decode(leader.data).epoch == 2
        finally:
            client.close()
