"""Shard leadership in a real etcd (Debian's etcd-server on dynamic ports): the leader lease and its
fence, epochs, the in-sync set changed in etcd before it changes what an ack means, promotion of an
in-sync replica only (services/commitlog/ha/leadership.py, in_sync.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.commitlog.ha.group_transfer import GroupTransfer, ReplicaAckError
from services.commitlog.ha.in_sync import InSyncAcks
from services.commitlog.ha.leadership import NotLeaderError, ShardLeadership
from services.server.etcd_client import CALL_TIMEOUT_S, EtcdClient
from services.server.shard_keys import InSyncSet, ShardKeys, read_shard
from tests.commitlog.etcd_process import running_etcd

REPO = Path(__file__).resolve().parents[2]
TTL_S = 2


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running_etcd(tmp_path_factory.mktemp("etcd") / "data") as endpoint:
        yield endpoint


@pytest.fixture
def client(etcd: str) -> Iterator[EtcdClient]:
    c = EtcdClient(etcd)
    yield c
    c.close()


def _leadership(client: EtcdClient, shard: str, replica: str, ttl_s: int = TTL_S) -> ShardLeadership:
    return ShardLeadership(client, shard, replica, f"{replica}:1", ttl_s)


def test_one_leader_per_epoch_and_epochs_only_grow(client: EtcdClient) -> None:
    a, b = _leadership(client, "s-epochs", "a"), _leadership(client, "s-epochs", "b")
    assert a.campaign() == 1
    assert b.campaign() is None  # a leader holds the shard
    a.fence()
    with pytest.raises(NotLeaderError):
        b.fence()
    a.resign()  # the lease revoked: the leader key goes at once
    with pytest.raises(NotLeaderError):
        a.fence()
    assert b.campaign() is None  # b is not in the in-sync set {a}: it may lack acknowledged records
    assert a.campaign() == 2
    time.sleep(TTL_S * 1.5)
    a.fence()  # leading again after resigning, its lease is renewed
    view = read_shard(client, ShardKeys("s-epochs"))
    assert view.epoch == 2 and view.leader is not None and view.leader.replica == "a"
    assert view.in_sync == InSyncSet(2, frozenset({"a"}))
    a.resign()


# A leader in its own process: it prints, every 20 ms, whether it may acknowledge.
LEADER = """
import sys, time
from services.server.etcd_client import CALL_TIMEOUT_S, EtcdClient
from services.commitlog.ha.leadership import NotLeaderError, ShardLeadership
leadership = ShardLeadership(EtcdClient(sys.argv[1]), sys.argv[2], "old", "old:1", int(sys.argv[3]))
print("epoch", leadership.campaign(), flush=True)
while True:
    try:
        leadership.fence()
        print("acking", flush=True)
    except NotLeaderError:
        print("fenced", flush=True)
    time.sleep(0.02)
"""


def test_a_leader_whose_lease_lapsed_stops_acking_at_once(client: EtcdClient, etcd: str) -> None:
    """The old leader is frozen (SIGSTOP: a pause, a partition from etcd) past its lease; a member takes
    the shard in a new epoch; the old leader, resumed, never says it may ack again."""
    shard = "s-lease"
    old = subprocess.Popen([sys.executable, "-c", LEADER, etcd, shard, str(TTL_S)], cwd=REPO,
                           stdout=subprocess.PIPE, text=True)
    try:
        assert old.stdout is not None
        assert old.stdout.readline().split() == ["epoch", "1"]
        assert old.stdout.readline().strip() == "acking"
        # "new" is a member before the freeze (the old leader added it once it was caught up).
        keys = ShardKeys(shard)
        view = read_shard(client, keys)
        assert view.leader is not None
        client.put(keys.in_sync, InSyncSet(1, frozenset({"old", "new"})).encode())
        os.kill(old.pid, signal.SIGSTOP)
        new = _leadership(client, shard, "new")
        deadline = time.monotonic() + 3 * TTL_S
        while (epoch := new.campaign()) is None:  # etcd expires the old lease
            assert time.monotonic() < deadline, "the frozen leader's lease never lapsed"
            time.sleep(0.1)
        assert epoch == 2
        new.fence()
        # Drain what the old leader printed before the freeze, then resume it.
        os.set_blocking(old.stdout.fileno(), False)
        while old.stdout.readline():
            pass
        os.set_blocking(old.stdout.fileno(), True)
        os.kill(old.pid, signal.SIGCONT)
        after = [old.stdout.readline().strip() for _ in range(5)]
        assert after == ["fenced"] * 5, f"the old leader still acks next to the new one: {after}"
        new.resign()
    finally:
        old.kill()
        old.wait()


def _group(client: EtcdClient, shard: str, timeout_s: float = 0.5) -> tuple[ShardLeadership, GroupTransfer,
                                                                             InSyncAcks]:
    leader = _leadership(client, shard, "L", ttl_s=8)  # outlives a freeze of etcd
    assert leader.campaign() == 1
    transfer = GroupTransfer(shard, lambda: 1000, 1, timeout_s, 1 << 30)
    return leader, transfer, InSyncAcks(leader, transfer, 2, timeout_s, confirm_offset=100)


def _members(client: EtcdClient, shard: str) -> frozenset[str]:
    view = read_shard(client, ShardKeys(shard))
    assert view.in_sync is not None
    return view.in_sync.members


def test_a_follower_joins_only_once_it_holds_every_acknowledged_record(client: EtcdClient) -> None:
    shard = "s-grow"
    leader, transfer, acks = _group(client, shard)
    a = transfer.add("a:1", "A")
    transfer.acknowledge(a, 50)
    acks.on_report("A", 50)  # behind the confirm offset: it may lack acknowledged records
    assert _members(client, shard) == {"L"}
    with pytest.raises(ReplicaAckError, match="SLAVE_NOT_AVAILABLE"):  # never a single copy
        acks.wait_for_replicas(120)
    transfer.acknowledge(a, 100)
    acks.on_report("A", 100)
    assert _members(client, shard) == {"L", "A"}
    transfer.acknowledge(a, 150)
    acks.wait_for_replicas(150)  # A holds it
    leader.resign()


def test_5663_a_member_leaves_the_set_in_etcd_before_an_ack_goes_without_it(client: EtcdClient, etcd: str) -> None:
    """apache/rocketmq#5663: the set changed on the leader before the controller knew, acks used it, and a
    replica outside what was acknowledged became the leader. Here: B stops reporting; a put that A holds
    is acknowledged only once etcd has {L, A}, never while etcd cannot be told (frozen); then B, outside
    the set, cannot be promoted and A can."""
    shard = "s-5663"
    leader, transfer, acks = _group(client, shard)
    followers = {name: transfer.add(f"{name}:1", name) for name in ("A", "B")}
    for name, follower in followers.items():
        transfer.acknowledge(follower, 100)
        acks.on_report(name, 100)
    assert _members(client, shard) == {"L", "A", "B"}
    transfer.acknowledge(followers["A"], 200)  # B holds only 100

    etcd_pid = _etcd_pid(etcd)
    outcome: list[object] = []
    put = threading.Thread(target=lambda: outcome.append(_try(acks.wait_for_replicas, 200)))
    os.kill(etcd_pid, signal.SIGSTOP)
    try:
        put.start()
        put.join(0.5 + CALL_TIMEOUT_S + 1)  # past haSendTimeout, and the leader's try to tell etcd
        assert outcome, "the put still waits"
        assert isinstance(outcome[0], NotLeaderError), f"acknowledged while etcd still lists B: {outcome}"
    finally:
        os.kill(etcd_pid, signal.SIGCONT)
    # (etcd may apply the shrink it received frozen once it resumes: the leader did not see it succeed.)
    acks.wait_for_replicas(200)  # etcd reachable: B leaves the set there, then the put is acknowledged
    assert _members(client, shard) == {"L", "A"}
    leader.resign()
    assert _leadership(client, shard, "B").campaign() is None  # outside the set: never promoted
    a = _leadership(client, shard, "A")
    assert a.campaign() == 2
    a.resign()


def _try(call: object, *args: object) -> object:
    try:
        call(*args)  # type: ignore[operator]
    except Exception as exc:  # the put's outcome: None when acknowledged
        return exc
    return None


def _etcd_pid(endpoint: str) -> int:
    port = endpoint.rsplit(":", 1)[1]
    found = subprocess.run(["pgrep", "-f", f"listen-client-urls http://127.0.0.1:{port}"], capture_output=True,
                           text=True, check=False).stdout.split()
    assert len(found) == 1, found
    return int(found[0])
