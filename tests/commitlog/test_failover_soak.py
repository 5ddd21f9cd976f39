"""The failover campaign at length (``make soak-ha``, ``SOAK_MINUTES``): three replicas whose leader a
real etcd decides, SYNC_MASTER with minInSyncReplicas 2, a producer that follows the leader etcd
names; the leader killed with SIGKILL at random points and restarted, over and over. At the end every
replica's commitlog equals the last leader's byte for byte, and every acknowledged put is in it at the
offset it was acknowledged at, with its own body.

Skipped in ``make test``: ``test_failover_processes.py`` runs one leader kill there.
"""

from __future__ import annotations

import os
import random
import threading
import time
from pathlib import Path

import grpc
import pytest

from services.server.etcd_client import EtcdClient
from services.server.shard_keys import ShardKeys, read_shard
from tests.commitlog.commitlog_process import CommitLogProcess, StartCommitLog, free_port
from tests.commitlog.etcd_process import running_etcd
from tests.commitlog.replicas import FILE_SIZE, append, assert_same_commitlog, max_offset, message
from tests.commitlog.test_failover_processes import SHARD, _env

MINUTES = float(os.environ.get("SOAK_HA_MINUTES", "0"))


@pytest.mark.skipif(not MINUTES, reason="the long failover campaign: make soak-ha (SOAK_MINUTES)")
def test_leader_kills_through_etcd(start_commitlog: StartCommitLog, tmp_path: Path) -> None:
    rng = random.Random(int(os.environ.get("SOAK_SEED", "0")) or None)
    with running_etcd(tmp_path / "etcd") as etcd:
        client = EtcdClient(etcd)
        keys = ShardKeys(SHARD)
        ports = {f"r{i}": free_port() for i in range(3)}
        replicas: dict[str, CommitLogProcess] = {
            name: start_commitlog(tmp_path / name, _env(etcd, port, name)) for name, port in ports.items()}

        def leader() -> str | None:
            view = read_shard(client, keys)
            return view.leader.replica if view.leader is not None else None

        acked: list[tuple[int, int, bytes]] = []  # offset, size, body
        refused = [0]
        stop = threading.Event()

        def produce() -> None:
            i = 0
            while not stop.is_set():
                name = leader()
                if name is None:
                    time.sleep(0.05)
                    continue
                msg = message(i)
                try:
                    result = append(replicas[name], msg)
                    acked.append((result.commitlog_offset, result.wrote_bytes, msg.body))
                except (grpc.RpcError, ValueError):  # refused, or a killed leader's closed channel
                    refused[0] += 1
                    time.sleep(0.05)
                i += 1

        producer = threading.Thread(target=produce, daemon=True)
        producer.start()
        deadline = time.monotonic() + MINUTES * 60
        kills, failovers = 0, []
        try:
            while time.monotonic() < deadline:
                time.sleep(rng.uniform(1.0, 4.0))
                victim = leader()
                if victim is None:
                    continue
                count = len(acked)
                replicas[victim].kill9()
                killed_at = time.monotonic()
                kills += 1
                while len(acked) == count:  # the first acknowledged put after the kill
                    assert time.monotonic() - killed_at < 60, "no put acknowledged within 60 s of a leader kill"
                    time.sleep(0.05)
                failovers.append(time.monotonic() - killed_at)
                replicas[victim] = start_commitlog(tmp_path / victim, _env(etcd, ports[victim], victim))
        finally:
            stop.set()
            producer.join(30)
        final = replicas[str(leader())]
        end = max_offset(final)
        for name, handle in replicas.items():
            deadline = time.monotonic() + 60
            while max_offset(handle) < end:
                assert time.monotonic() < deadline, f"{name} does not catch up"
                time.sleep(0.1)
            assert_same_commitlog(final.store_dir, handle.store_dir, end)
        files = {int(p.name): p.read_bytes() for p in (final.store_dir / "commitlog").iterdir()}
        for offset, size, body in acked:
            data = files[offset - offset % FILE_SIZE][offset % FILE_SIZE:offset % FILE_SIZE + size]
            assert int.from_bytes(data[:4], "big") == size and body in data, f"acknowledged put at {offset} lost"
        client.close()
    failovers.sort()
    print(f"\nsoak-ha failover: {kills} leader kills, {len(acked)} puts acknowledged, {refused[0]} refused, "
          f"kill -> first ack p50 {failovers[len(failovers) // 2]:.2f} s, max {failovers[-1]:.2f} s"
          if failovers else "\nsoak-ha failover: no kill")
