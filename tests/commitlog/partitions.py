"""The partition fault campaign's harness: three ``mqstore commitlog`` replicas of one shard on a real
etcd, SYNC_MASTER + SYNC_FLUSH, minInSyncReplicas 2, each replica behind two fault proxies the test owns
(``tests/fault_proxy.py``): one in front of its HA listener (followers reach the leader only through the
leader's proxy: ``haAdvertisedAddress``) and one between it and etcd. A producer follows the leader etcd
names and records every acknowledgement; faults are thrown at it; :func:`check_shard` then proves
what an acknowledgement promised.
"""

from __future__ import annotations

import json
import random
import shutil
import signal
import subprocess
import threading
import time
import urllib.request
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from mqstore.v1 import commitlog_pb2, common_pb2
from services.server.etcd_client import EtcdClient, EtcdError
from services.server.shard_keys import ShardKeys, read_shard
from services.store.formats.commitlog_walk import RecordEntry, iter_commitlog
from tests.commitlog.commitlog_process import CommitLogProcess, StartCommitLog, free_port
from tests.commitlog.etcd_process import _wait_ready
from tests.commitlog.replicas import AUTH, BASE_ENV, assert_same_commitlog, logic_files, max_offset
from tests.fault_proxy import DROP, HOLD, FaultProxy

SHARD = BASE_ENV["MQSTORE_BROKER_NAME"]
TOPIC = "PartitionTopic"
QUEUES = 4
FAULTS = ("kill_leader", "kill_follower", "kill_etcd", "wipe_leader", "partition_leader_followers",
          "partition_leader_etcd")
#: The long campaign's faults also slow the link between the leader and its followers.
SOAK_FAULTS = (*FAULTS, "slow_leader_followers")


class Etcd:
    """One etcd member on fixed loopback ports, which the campaign kills (-9) and restarts on its data."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.client_port, self.peer_port = free_port(), free_port()
        self.endpoint = f"127.0.0.1:{self.client_port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        binary = shutil.which("etcd")
        assert binary, "etcd is not installed: run `make etcd` (Debian's etcd-server)"
        client_url, peer_url = f"http://127.0.0.1:{self.client_port}", f"http://127.0.0.1:{self.peer_port}"
        log = (self.data_dir.parent / "etcd.log").open("ab")
        self.proc = subprocess.Popen(
            [binary, "--name", "t", "--data-dir", str(self.data_dir), "--listen-client-urls", client_url,
             "--advertise-client-urls", client_url, "--listen-peer-urls", peer_url,
             "--initial-advertise-peer-urls", peer_url, "--initial-cluster", f"t={peer_url}",
             "--heartbeat-interval", "50", "--election-timeout", "500"], stdout=log, stderr=subprocess.STDOUT)
        log.close()
        _wait_ready(self.endpoint, self.proc)

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill9()


@dataclass
class Replica:
    name: str
    store: Path
    ha_port: int
    ha_proxy: FaultProxy
    etcd_proxy: FaultProxy
    handle: CommitLogProcess | None = None
    metrics_port: int = field(default_factory=free_port)

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as response:
            return str(response.read().decode())


@dataclass
class Ack:
    replica: str
    offset: int
    size: int
    queue_id: int
    queue_offset: int
    uniq_key: str
    body: bytes


@dataclass
class Shard:
    start_commitlog: StartCommitLog
    root: Path
    role: str = "SYNC_MASTER"
    flush: str = "SYNC_FLUSH"
    etcd: Etcd = field(init=False)
    replicas: dict[str, Replica] = field(default_factory=dict)
    log: list[str] = field(default_factory=list)
    born: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        (self.root / "etcd").mkdir(parents=True, exist_ok=True)
        self.etcd = Etcd(self.root / "etcd" / "data")
        self.client = EtcdClient(self.etcd.endpoint)
        self.keys = ShardKeys(SHARD)
        for i in range(3):
            name, ha_port = f"r{i}", free_port()
            self.replicas[name] = Replica(name, self.root / name, ha_port, FaultProxy(f"127.0.0.1:{ha_port}"),
                                          FaultProxy(self.etcd.endpoint))
        starting = [threading.Thread(target=self.start, args=(name,)) for name in self.replicas]
        for thread in starting:
            thread.start()
        for thread in starting:
            thread.join()
        assert all(r.handle is not None for r in self.replicas.values()), "a replica did not start"

    def note(self, what: str) -> None:
        self.log.append(f"{time.monotonic() - self.born:.1f}s {what}")

    def env(self, replica: Replica) -> dict[str, str]:
        return {**BASE_ENV, "MQSTORE_ETCD_ENDPOINT": replica.etcd_proxy.address,
                "MQSTORE_HA_LISTEN_PORT": str(replica.ha_port), "MQSTORE_HA_ADVERTISED_ADDRESS":
                replica.ha_proxy.address, "MQSTORE_HA_REPLICA_NAME": replica.name, "MQSTORE_BROKER_ROLE": self.role,
                "MQSTORE_FLUSH_DISK_TYPE": self.flush, "MQSTORE_MIN_IN_SYNC_REPLICAS": "2",
                "MQSTORE_HA_SEND_TIMEOUT": "3000", "MQSTORE_HA_LEASE_TTL_SECONDS": "2",
                "MQSTORE_HA_HOUSEKEEPING_INTERVAL": "3000", "MQSTORE_METRICS_PORT": str(replica.metrics_port)}

    def start(self, name: str) -> None:
        replica = self.replicas[name]
        replica.handle = self.start_commitlog(replica.store, self.env(replica))

    def kill9(self, name: str) -> None:
        handle = self.replicas[name].handle
        if handle is not None:
            handle.kill9()

    def view(self) -> tuple[str | None, frozenset[str]]:
        """The leader etcd names (None: none, or etcd unreachable) and the in-sync set."""
        try:
            shard = read_shard(self.client, self.keys)
        except EtcdError:
            return None, frozenset()
        members = shard.in_sync.members if shard.in_sync is not None else frozenset()
        return (shard.leader.replica if shard.leader is not None else None), frozenset(members)

    def wait_all_in_sync(self, timeout_s: float = 40.0) -> str:
        deadline = time.monotonic() + timeout_s
        while True:
            leader, members = self.view()
            if leader is not None and len(members) == 3:
                return leader
            assert time.monotonic() < deadline, f"no leader with 3 replicas in sync (leader {leader}, {members})"
            time.sleep(0.1)

    def stop(self) -> None:
        for replica in self.replicas.values():
            replica.ha_proxy.heal()
            replica.etcd_proxy.heal()
        for replica in self.replicas.values():
            if replica.handle is not None and replica.handle.running:
                replica.handle.stop()
        for replica in self.replicas.values():
            replica.ha_proxy.close()
            replica.etcd_proxy.close()
        self.client.close()
        self.etcd.stop()


def message(producer: int, i: int) -> common_pb2.Message:
    key = f"{0xC0FFEE00 + producer:08X}{i:024X}"  # 32 hex digits, as a RocketMQ client makes them
    return common_pb2.Message(topic=TOPIC, queue_id=i % QUEUES, body=f"{key}-".encode() * 8,
                              properties={"UNIQ_KEY": key, "KEYS": key})


class Producer:
    """Sends to the leader etcd names (AppendBatch of 8 and unary Appends, alternately) and records
    every acknowledgement with the replica that gave it; never resends a message."""

    def __init__(self, shard: Shard, producer: int = 0, pace_s: float = 0.0) -> None:
        self.shard = shard
        self.pace_s = pace_s  # a pause between calls: fewer records to check and index, as many faults
        self.producer = producer
        self.acks: list[Ack] = []
        self.refused = 0
        self.last_refusal = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Producer:
        self._thread.start()
        return self

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            leader, _ = self.shard.view()
            handle = self.shard.replicas[leader].handle if leader else None
            if handle is None or not handle.running:
                time.sleep(0.05)
                continue
            batch = [message(self.producer, i + k) for k in range(8 if i % 16 else 1)]
            i += len(batch)
            try:
                if len(batch) == 1:
                    results = [handle.stub.Append(commitlog_pb2.AppendRequest(message=batch[0]), timeout=15,
                                                  metadata=AUTH)]
                else:
                    results = list(handle.stub.AppendBatch(commitlog_pb2.AppendBatchRequest(messages=batch),
                                                           timeout=15, metadata=AUTH).results)
            except (grpc.RpcError, ValueError) as exc:  # refused, timed out, or a killed process's closed channel
                self.refused += 1
                self.last_refusal = f"{exc.code().name}: {exc.details()}" if isinstance(exc, grpc.RpcError) \
                    else str(exc)
                time.sleep(0.05)
                continue
            time.sleep(self.pace_s)
            for msg, r in zip(batch, results, strict=True):
                self.acks.append(Ack(leader or "", r.commitlog_offset, r.wrote_bytes, r.queue_id, r.queue_offset,
                                     msg.properties["UNIQ_KEY"], msg.body))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)


def wait_acked_after(producer: Producer, timeout_s: float = 40.0) -> float:
    """Seconds until the producer gets an acknowledgement it did not have yet."""
    start, count = time.monotonic(), len(producer.acks)
    while len(producer.acks) == count:
        assert time.monotonic() - start < timeout_s, f"no acknowledgement within {timeout_s} s"
        time.sleep(0.05)
    return time.monotonic() - start


def inject(shard: Shard, fault: str, rng: random.Random) -> None:
    """One fault against the current leader (or one follower, or etcd), held for a moment, then healed:
    a killed process restarts, a wiped store restarts empty, a partition heals."""
    leader, _ = shard.view()
    assert leader is not None
    follower = rng.choice([n for n in shard.replicas if n != leader])
    victim = follower if fault == "kill_follower" else leader
    replica = shard.replicas[victim]
    shard.note(f"{fault} ({victim})")
    held = rng.uniform(0.3, 1.5)
    if fault in ("kill_leader", "kill_follower", "wipe_leader"):
        shard.kill9(victim)
        if fault == "wipe_leader":  # the machine is lost: it comes back with an empty store
            shutil.rmtree(replica.store)
        time.sleep(held)
        shard.start(victim)
    elif fault == "kill_etcd":
        shard.etcd.kill9()
        time.sleep(held)
        shard.etcd.start()
    elif fault == "slow_leader_followers":
        replica.ha_proxy.delay(rng.uniform(0.05, 0.5))
        time.sleep(held + 2.0)
        replica.ha_proxy.heal()
    else:
        proxy = replica.ha_proxy if fault == "partition_leader_followers" else replica.etcd_proxy
        proxy.set(rng.choice((HOLD, HOLD, DROP)))
        time.sleep(held + 2.0)  # past the lease (2 s) always, haSendTimeout (3 s) now and then
        proxy.heal()


def run_campaign(shard: Shard, faults: list[str], rng: random.Random, deadline: float | None = None,
                 pace_s: float = 0.0) -> tuple[Producer, list[float]]:
    """Each fault in turn (until ``deadline``), under a producer, once the shard has all three replicas
    in sync; the time from each fault's start to the next acknowledgement."""
    shard.wait_all_in_sync()
    shard.note("in sync")
    producer = Producer(shard, pace_s=pace_s).start()
    resumed = []
    try:
        wait_acked_after(producer)
        for fault in faults:
            if deadline is not None and time.monotonic() > deadline:
                break
            shard.wait_all_in_sync()
            time.sleep(rng.uniform(0.1, 1.0))
            started = time.monotonic()
            inject(shard, fault, rng)
            wait_acked_after(producer)
            resumed.append(time.monotonic() - started)
    finally:
        producer.stop()
    shard.note("healed")
    return producer, resumed


def check_shard(shard: Shard, acks: list[Ack], start_indexer: Callable[[Path, str], object] | None = None) -> int:
    """Everything an acknowledgement promised, once the faults healed; returns the log's end."""
    leader_name = shard.wait_all_in_sync(60)
    leader = shard.replicas[leader_name]
    assert leader.handle is not None
    end = max_offset(leader.handle)
    for replica in shard.replicas.values():  # the differential check: every copy is the leader's
        assert replica.handle is not None
        deadline = time.monotonic() + 60
        while max_offset(replica.handle) < end:
            assert time.monotonic() < deadline, f"{replica.name} does not catch up to {end}"
            time.sleep(0.1)
        assert_same_commitlog(leader.store, replica.store, end)
    records = {e.offset: e.record for e in iter_commitlog(leader.store / "commitlog")
               if isinstance(e, RecordEntry) and e.offset < end}
    _check_queue_offsets(records.values())
    uniq = Counter(r.properties.get("UNIQ_KEY") for r in records.values())
    for ack in acks:  # every acknowledged message exactly once, at its offset, with its queue offset
        record = records.get(ack.offset)
        assert record is not None, f"acknowledged {ack.uniq_key} at {ack.offset} is not in the log"
        assert (record.properties.get("UNIQ_KEY"), record.body, record.store_size, record.queue_id,
                record.queue_offset) == (ack.uniq_key, ack.body, ack.size, ack.queue_id, ack.queue_offset), ack
        assert uniq[ack.uniq_key] == 1, f"{ack.uniq_key} is stored {uniq[ack.uniq_key]} times"
    for replica in shard.replicas.values():  # read back by offset from every replica's service
        assert replica.handle is not None
        for ack in acks[:: max(1, len(acks) // 50)]:
            data = replica.handle.stub.Read(commitlog_pb2.ReadRequest(offset=ack.offset, size=ack.size), timeout=10,
                                            metadata=AUTH).data
            assert ack.body in data, f"{replica.name} cannot read {ack.uniq_key} at {ack.offset}"
    _check_one_acker_per_epoch(shard, leader.store, acks)
    shard.note("checked")
    return end


def _check_queue_offsets(records: object) -> None:
    """No queue offset used twice, none skipped: each queue's offsets are 0, 1, 2, ... in log order."""
    seen: dict[int, list[int]] = defaultdict(list)
    for record in records:  # type: ignore[attr-defined]
        seen[record.queue_id].append(record.queue_offset)
    for queue_id, offsets in seen.items():
        assert offsets == list(range(len(offsets))), f"queue {queue_id}'s offsets are {offsets[:50]}..."


def leaders_by_epoch(shard: Shard) -> dict[int, set[str]]:
    """Every replica process's log says which epochs it led."""
    led: dict[int, set[str]] = defaultdict(set)
    handles = getattr(shard.start_commitlog, "started", [])
    for handle in handles:
        name = next((n for n, r in shard.replicas.items() if r.store == handle.store_dir), "?")
        for record in handle.log_records():
            text = str(record.get("message", record.get("msg", "")))
            if " is the LEADER of shard " in text:
                led[int(text.rsplit("epoch ", 1)[1])].add(name)
    return led


def _check_one_acker_per_epoch(shard: Shard, leader_store: Path, acks: list[Ack]) -> None:
    """No two replicas acknowledged in one epoch: each acknowledgement's epoch (by the final epoch file,
    epoch -> start offset) was led by one replica, the one that gave it."""
    entries = json.loads((leader_store / "ha" / "epochs.json").read_text())
    led = leaders_by_epoch(shard)
    assert all(len(names) == 1 for names in led.values()), f"an epoch with two leaders: {dict(led)}"
    ackers: dict[int, set[str]] = defaultdict(set)
    for ack in acks:
        epoch = max((e for e, start in entries if start <= ack.offset), default=0)
        ackers[epoch].add(ack.replica)
    for epoch, names in ackers.items():
        assert len(names) == 1, f"epoch {epoch} acknowledged by {sorted(names)}"
        assert names == led.get(epoch, names), f"epoch {epoch} led by {led.get(epoch)}, acknowledged by {names}"


def check_indexes(shard: Shard, end: int, start_indexer: Callable[..., object], wait_indexed: Callable[..., None],
                  env: dict[str, str]) -> None:
    """Each replica's own indexer builds the leader's ConsumeQueue and IndexFile, byte for byte."""
    indexers: list[object] = []

    def start(replica: Replica) -> None:
        assert replica.handle is not None
        indexers.append(start_indexer(shard.root / f"{replica.name}-indexer", replica.handle.address, env))

    try:
        starting = [threading.Thread(target=start, args=(r,)) for r in shard.replicas.values()]
        for thread in starting:
            thread.start()
        for thread in starting:
            thread.join()
        assert len(indexers) == len(shard.replicas), "an indexer did not start"
        for indexer in indexers:
            wait_indexed(indexer, end)
    finally:
        for indexer in indexers:
            indexer.stop()  # type: ignore[attr-defined]
    files = [logic_files(shard.root / f"{name}-indexer") for name in shard.replicas]
    for name, other in zip(list(shard.replicas)[1:], files[1:], strict=True):
        assert other == files[0], f"{name}'s ConsumeQueue/IndexFile differ: " \
            f"{sorted(k for k in other.keys() | files[0].keys() if other.get(k) != files[0].get(k))[:10]}"
