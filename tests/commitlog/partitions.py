"""The partition fault campaign's harness: three ``mqstore commitlog`` replicas of one shard on a real
etcd, SYNC_MASTER + SYNC_FLUSH, minInSyncReplicas 2, each replica behind two fault proxies the test owns
(``tests/fault_proxy.py``): one in front of its HA listener (followers reach the leader only through the
leader's proxy: ``haAdvertisedAddress``) and one between it and etcd. A producer follows the leader etcd
names and records every acknowledgement; with ``with_gateway=True`` a real gateway process follows the leader
too (its etcd watch, ``gateway/leader.py``) and a second producer sends through it; faults are thrown at
them; :func:`check_shard` then proves what an acknowledgement promised.
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
import yaml

from mqstore.v1 import commitlog_pb2, common_pb2, gateway_pb2, gateway_pb2_grpc
from services.server.etcd_client import EtcdClient, EtcdError
from services.server.shard_keys import ShardKeys, read_shard
from services.store.formats.commitlog_walk import RecordEntry, iter_commitlog
from services.store.formats.message_id import decode_message_id
from tests.commitlog.commitlog_process import (
    CHANNEL_OPTIONS,
    CommitLogProcess,
    ServiceProcess,
    StartCommitLog,
    free_port,
    spawn_service,
)
from tests.commitlog.etcd_process import _wait_ready
from tests.commitlog.replicas import AUTH, BASE_ENV, TOKEN, assert_same_commitlog, logic_files, max_offset
from tests.fault_proxy import DROP, HOLD, FaultProxy

SHARD = BASE_ENV["MQSTORE_BROKER_NAME"]
TOPIC = "PartitionTopic"
QUEUES = 4
#: The gateway producer's resend counter, a property of each message it sends: the UNIQ_KEY stays the
#: same across resends, this tells one send of it from another in the log.
ATTEMPT = "CAMPAIGN_ATTEMPT"
FAULTS = ("kill_leader", "kill_follower", "kill_etcd", "wipe_leader", "partition_leader_followers",
          "partition_leader_etcd", "kill_gateway")
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
    #: Its gRPC port, the same across restarts: the gateway's settings name it. Also its listenPort, so the
    #: store host of a record (and of an offset msg id) names the replica that appended it.
    port: int = field(default_factory=free_port)

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as response:
            return str(response.read().decode())


@dataclass
class Ack:
    replica: str
    offset: int
    size: int  # 0: not known (a gateway's answer does not say)
    queue_id: int
    queue_offset: int
    uniq_key: str
    body: bytes
    #: Which send of the UNIQ_KEY was acknowledged (the gateway producer's ATTEMPT); None: sent once.
    attempt: int | None = None


class GatewayProcess(ServiceProcess):
    service_name = "mqstore.v1.MessagingService"


class Gateway:
    """A real gateway process in front of the shard, as ``mqstore up --replicas`` wires one
    (``services/replica_set.py``): every replica named in its settings with etcd and the brokerName, so
    it follows the leader through etcd's watch. It talks to etcd directly (not through a replica's proxy)
    and to the commitlogs only: sends need nothing else, and the query, scheduler and indexer addresses
    are ports nobody listens on. Killed (-9), it is started again on the same port."""

    def __init__(self, root: Path, etcd: str, replicas: dict[str, Replica]) -> None:
        self.root = root
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.handle: GatewayProcess | None = None
        self.starts = 0
        members = [{"name": r.name, "commitlog": f"127.0.0.1:{r.port}",
                    **{s: f"127.0.0.1:{free_port()}" for s in ("query", "scheduler", "indexer")}}
                   for r in replicas.values()]
        shard = {"name": "shard-0", "commitlog": members[0]["commitlog"], "query": members[0]["query"],
                 "etcd": etcd, "broker_name": SHARD, "replicas": members}
        self.settings = root / "gateway.yaml"
        self.settings.write_text(yaml.safe_dump({"shards": [shard]}, sort_keys=False), encoding="utf-8")

    def start(self) -> None:
        log_path = self.root / f"gateway-{self.starts}.log"  # one per start: its "listening" is this start's
        self.starts += 1
        proc = spawn_service(["gateway", "--config", str(self.settings), "--listen", self.address],
                             {"MQSTORE_SERVICE_TOKEN": TOKEN}, log_path)
        handle = GatewayProcess(self.root, self.port, proc, log_path)
        try:
            handle.wait_serving(30)
        except BaseException:
            handle.kill9()
            raise
        handle.channel.close()  # the producer has its own channel, which outlives the process
        self.handle = handle

    def kill9(self) -> None:
        if self.handle is not None:
            self.handle.kill9()

    def stop(self) -> None:
        if self.handle is not None and self.handle.running:
            try:
                self.handle.stop()
            except subprocess.TimeoutExpired:
                self.handle.kill9()


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
    #: Start a gateway in front of the shard (:class:`Gateway`) with the replicas.
    with_gateway: bool = False
    gateway: Gateway | None = field(init=False, default=None)

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
        if self.with_gateway:  # once the commitlogs listen: its warm-up reads their topics (while they elect)
            self.gateway = Gateway(self.root, self.etcd.endpoint, self.replicas)
            self.gateway.start()

    def note(self, what: str) -> None:
        self.log.append(f"{time.monotonic() - self.born:.1f}s {what}")

    def env(self, replica: Replica) -> dict[str, str]:
        return {**BASE_ENV, "MQSTORE_ETCD_ENDPOINT": replica.etcd_proxy.address,
                "MQSTORE_HA_LISTEN_PORT": str(replica.ha_port), "MQSTORE_HA_ADVERTISED_ADDRESS":
                replica.ha_proxy.address, "MQSTORE_HA_REPLICA_NAME": replica.name, "MQSTORE_BROKER_ROLE": self.role,
                "MQSTORE_FLUSH_DISK_TYPE": self.flush, "MQSTORE_MIN_IN_SYNC_REPLICAS": "2",
                "MQSTORE_HA_SEND_TIMEOUT": "3000", "MQSTORE_HA_LEASE_TTL_SECONDS": "2",
                "MQSTORE_HA_HOUSEKEEPING_INTERVAL": "3000", "MQSTORE_METRICS_PORT": str(replica.metrics_port),
                "MQSTORE_LISTEN_PORT": str(replica.port)}

    def start(self, name: str) -> None:
        replica = self.replicas[name]
        replica.handle = self.start_commitlog(replica.store, self.env(replica), port=replica.port)

    def replica_of_store_host(self, store_host: str) -> str:
        """The replica whose listenPort the store host (``ip:port``) names."""
        port = int(store_host.rpartition(":")[2])
        return next((r.name for r in self.replicas.values() if r.port == port), store_host)

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
        if self.gateway is not None:
            self.gateway.stop()
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


def gateway_message(producer: int, i: int) -> common_pb2.Message:
    """A message for the gateway to place: no queue (its selector picks one), its own UNIQ_KEY."""
    msg = message(producer, i)
    msg.ClearField("queue_id")
    return msg


class GatewayProducer:
    """Sends through the gateway (unary Sends and SendBatch of 8, alternately) on one channel that
    outlives the gateway's process, and records every acknowledgement with the replica that stored the
    message (its offset msg id's store host).

    A call that fails is ambiguous: the gateway may have died with the answer, or the leader stored the
    messages and then lost its followers (SYNC_MASTER's UNAVAILABLE). The producer does what a RocketMQ
    producer does (retryTimesWhenSendFailed): it sends the same messages again, with the same UNIQ_KEYs,
    until they are acknowledged; a consumer deduplicates by UNIQ_KEY. Not resending would make the
    check trivially pass for the lost answers and test no producer anyone runs. So an *unacknowledged*
    send may be in the log besides the acknowledged one; each send carries its number (ATTEMPT), and
    :func:`check_shard` proves the acknowledged send is there exactly once and the other copies are
    earlier, unacknowledged sends."""

    def __init__(self, shard: Shard, producer: int = 1, pace_s: float = 0.0) -> None:
        assert shard.gateway is not None
        self.shard = shard
        self.producer = producer
        self.pace_s = pace_s
        self.acks: list[Ack] = []
        self.refused = 0
        self.resent = 0  # sends of messages that an earlier, failed call may have stored
        self.last_refusal = ""
        self._channel = grpc.insecure_channel(shard.gateway.address, options=CHANNEL_OPTIONS)
        self._stub = gateway_pb2_grpc.MessagingServiceStub(self._channel)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> GatewayProducer:
        self._thread.start()
        return self

    def _run(self) -> None:
        i, attempt = 0, 0
        batch: list[common_pb2.Message] = []
        while not self._stop.is_set():
            if not batch:
                batch, attempt = [gateway_message(self.producer, i + k) for k in range(8 if i % 16 else 1)], 0
                i += len(batch)
            for msg in batch:
                msg.properties[ATTEMPT] = str(attempt)
            try:
                if len(batch) == 1:
                    results = [self._stub.Send(gateway_pb2.SendRequest(message=batch[0]), timeout=15)]
                else:
                    results = list(self._stub.SendBatch(gateway_pb2.SendBatchRequest(messages=batch),
                                                        timeout=15).results)
            except grpc.RpcError as exc:
                failure = f"{exc.code().name}: {exc.details()}"
            else:
                failure = next((f"status {r.status}" for r in results
                                if r.status != commitlog_pb2.PUT_MESSAGE_STATUS_PUT_OK), "")
            if failure:  # not acknowledged, maybe stored: the same messages again (see the class docstring)
                self.refused += 1
                self.last_refusal = failure
                attempt += 1
                self.resent += len(batch)
                time.sleep(0.05)
                continue
            for msg, r in zip(batch, results, strict=True):
                store_host, offset = decode_message_id(r.offset_msg_id)
                self.acks.append(Ack(self.shard.replica_of_store_host(store_host), offset, 0, r.queue_id,
                                     r.queue_offset, msg.properties["UNIQ_KEY"], msg.body, attempt))
            batch = []
            time.sleep(self.pace_s)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        self._channel.close()


def wait_acked_after(*producers: Producer | GatewayProducer, timeout_s: float = 40.0) -> float:
    """Seconds until every producer gets an acknowledgement it did not have yet."""
    start, counts = time.monotonic(), [len(p.acks) for p in producers]
    for producer, count in zip(producers, counts, strict=True):
        while len(producer.acks) == count:
            assert time.monotonic() - start < timeout_s, f"{type(producer).__name__}: no acknowledgement within " \
                f"{timeout_s} s; last refusal: {producer.last_refusal}"
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
    shard.note(f"{fault} ({'gateway' if fault == 'kill_gateway' else victim})")
    held = rng.uniform(0.3, 1.5)
    if fault == "kill_gateway":  # mid-traffic: sends in flight lose their answers
        assert shard.gateway is not None, "kill_gateway needs Shard(with_gateway=True)"
        shard.gateway.kill9()
        time.sleep(held)
        shard.gateway.start()
    elif fault in ("kill_leader", "kill_follower", "wipe_leader"):
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


@dataclass
class CampaignRun:
    producer: Producer
    #: The producer sending through the gateway (a shard with a gateway only).
    gateway_producer: GatewayProducer | None
    #: Seconds from each fault's start to the next acknowledgement of every producer.
    resumed: list[float]

    @property
    def acks(self) -> list[Ack]:
        return self.producer.acks + (self.gateway_producer.acks if self.gateway_producer else [])


def run_campaign(shard: Shard, faults: list[str], rng: random.Random, deadline: float | None = None,
                 pace_s: float = 0.0) -> CampaignRun:
    """Each fault in turn (until ``deadline``), under a producer (and one through the gateway, when the
    shard has one), once the shard has all three replicas in sync; after each fault every producer must
    be acknowledged again (the gateway found the leader, or came back)."""
    shard.wait_all_in_sync()
    shard.note("in sync")
    producer = Producer(shard, pace_s=pace_s).start()
    through_gateway = GatewayProducer(shard, pace_s=pace_s).start() if shard.gateway is not None else None
    producers: list[Producer | GatewayProducer] = [producer, *([through_gateway] if through_gateway else [])]
    run = CampaignRun(producer, through_gateway, [])
    try:
        wait_acked_after(*producers)
        for fault in faults:
            if deadline is not None and time.monotonic() > deadline:
                break
            shard.wait_all_in_sync()
            time.sleep(rng.uniform(0.1, 1.0))
            started = time.monotonic()
            inject(shard, fault, rng)
            wait_acked_after(*producers)
            run.resumed.append(time.monotonic() - started)
    finally:
        for each in producers:
            each.stop()
    shard.note("healed")
    return run


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
    # The gateway producer's sends (UNIQ_KEY, ATTEMPT): each call is made once, and the gateway makes one
    # again only when nothing was appended, so no send is in the log twice, acknowledged or not.
    sends = Counter((r.properties.get("UNIQ_KEY"), r.properties[ATTEMPT]) for r in records.values()
                    if ATTEMPT in r.properties)
    twice = [send for send, n in sends.items() if n > 1]
    assert not twice, f"the gateway stored one send more than once: {twice[:10]}"
    stored_attempts: dict[str, list[int]] = defaultdict(list)
    for key, attempt in sends:
        stored_attempts[str(key)].append(int(attempt))
    for ack in acks:  # every acknowledged message exactly once, at its offset, with its queue offset
        record = records.get(ack.offset)
        assert record is not None, f"acknowledged {ack.uniq_key} at {ack.offset} is not in the log"
        assert (record.properties.get("UNIQ_KEY"), record.body, record.store_size, record.queue_id,
                record.queue_offset) == (ack.uniq_key, ack.body, ack.size or record.store_size, ack.queue_id,
                                         ack.queue_offset), ack
        if ack.attempt is None:  # sent once: the only copy of its UNIQ_KEY
            assert uniq[ack.uniq_key] == 1, f"{ack.uniq_key} is stored {uniq[ack.uniq_key]} times"
            continue
        # Resent after an ambiguous failure: the acknowledged send is at its offset (and, above, only
        # there); any other copy of the UNIQ_KEY is an earlier send that was never acknowledged.
        assert record.properties.get(ATTEMPT) == str(ack.attempt), (ack, record.properties)
        others = sorted(a for a in stored_attempts[ack.uniq_key] if a != ack.attempt)
        assert all(a < ack.attempt for a in others), f"{ack.uniq_key}: acknowledged send {ack.attempt}, " \
            f"also stored: sends {others}"
    direct = [a for a in acks if a.attempt is None]
    through_gateway = [a for a in acks if a.attempt is not None]
    sample = direct[:: max(1, len(direct) // 50)] + through_gateway[:: max(1, len(through_gateway) // 50)]
    for replica in shard.replicas.values():  # read back by offset from every replica's service
        assert replica.handle is not None
        for ack in sample:
            size = records[ack.offset].store_size
            data = replica.handle.stub.Read(commitlog_pb2.ReadRequest(offset=ack.offset, size=size), timeout=10,
                                            metadata=AUTH).data
            assert ack.body in data, f"{replica.name} cannot read {ack.uniq_key} at {ack.offset}"
    _check_topics(shard, leader_name)
    _check_one_acker_per_epoch(shard, leader.store, acks)
    resent = sum(len(attempts) > 1 for attempts in stored_attempts.values())
    shard.note(f"checked ({len(direct)} + {len(through_gateway)} through the gateway acknowledged; {resent} "
               "UNIQ_KEYs stored again by a resend)" if shard.gateway is not None else "checked")
    return end


def _check_topics(shard: Shard, leader: str) -> None:
    """Every replica serves the leader's topic table (the campaign's topic among them, as it was made)."""
    tables = {}
    for replica in shard.replicas.values():
        assert replica.handle is not None
        listed = replica.handle.stub.ListTopics(commitlog_pb2.ListTopicsRequest(), timeout=10, metadata=AUTH).topics
        tables[replica.name] = {t.topic: t.SerializeToString(deterministic=True) for t in listed}
    assert TOPIC in tables[leader], sorted(tables[leader])
    for name, table in tables.items():
        assert table == tables[leader], f"{name}'s topics differ from the leader's: " \
            f"{sorted(k for k in table.keys() | tables[leader].keys() if table.get(k) != tables[leader].get(k))}"


def _check_queue_offsets(records: object) -> None:
    """No queue offset used twice, none skipped: each topic's queue's offsets are 0, 1, 2, ... in log order."""
    seen: dict[tuple[str, int], list[int]] = defaultdict(list)
    for record in records:  # type: ignore[attr-defined]
        seen[record.topic, record.queue_id].append(record.queue_offset)
    for queue, offsets in seen.items():
        assert offsets == list(range(len(offsets))), f"queue {queue}'s offsets are {offsets[:50]}..."


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
