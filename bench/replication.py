"""What replication costs and how fast a shard fails over, beside Redis and NATS in the same run.

    python -m bench.replication                    # every row, 4 s a case, ten leader kills (~5 min)
    python -m bench.replication --seconds 10 --kills 10 --producers 8 --json

Rows (one client process, ``--producers`` asyncio producers, 1 KiB bodies, loopback):

* **send**: one copy against three copies, one message a call and batches of 64 and 256: mqstore's
  commitlog service (``Append`` / ``AppendBatch``) alone (ASYNC_MASTER) against a SYNC_MASTER leader
  with two followers on etcd (acknowledged once every in-sync replica holds the batch); Redis Streams
  (pipelined XADDs) alone against a master with one replica and ``WAIT 1`` after each pipeline;
  NATS JetStream, an R1 stream against an R3 stream, on a 3-server loopback cluster (publish, or
  ``publish_async`` of the batch and its PubAcks). Rate of acknowledged messages; p50/p99 per call.
* **lag**: the followers' replication lag during the 3-copy batch-256 row (the highest sustained
  rate), sampled every 20 ms: bytes behind the leader, and as ms at that rate (the time the leader
  takes to write what a follower lacks).
* **failover**: ``--kills`` times, the leader's process SIGKILLed under a producer (one message a
  call, following the leader etcd names) and a reader (commitlog ``Read`` of acknowledged messages on
  any live replica): kill -> first acknowledged send; kill -> the new leader holds every acknowledged
  message (all readable there); the longest gap between two successful reads ("reads never stop").

Targets (docs/benchmarks.md): 3-copy SYNC batched throughput at least 70% of one copy's; writes resume
within 10 s of a leader's death; reads never stop. Flush: ``--flush`` (ASYNC_FLUSH: an ack means the
bytes are in every replica's page cache; SYNC_FLUSH: on every replica's disk). Redis' AOF is
``appendfsync everysec`` (``always`` with SYNC_FLUSH), NATS' file store syncs as it does by default.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import subprocess
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from bench.peer_servers import NatsServer, RedisServer, ensure_installed, server_binary, server_version
from bench.report import percentile, progress
from bench.services import Service, free_port
from bench.workload import BODY_SIZE, CLUSTER, QUEUES, RECORD_SIZE, TOPIC, Workload, print_machine, scratch_dir
from mqstore.v1 import commitlog_pb2, commitlog_pb2_grpc, common_pb2
from services.replica_set import ReplicaPorts, start_etcd
from services.server.etcd_client import EtcdClient, EtcdError
from services.server.shard_keys import ShardKeys, read_shard

COMMITLOG_HEALTH = "mqstore.v1.CommitLogService"
SHARD = "bench-shard"
BATCHES = (1, 64, 256)
LEASE_TTL_S = "3"  # as mqstore up --replicas on one machine


# -- mqstore --------------------------------------------------------------------------------------
class MqstoreCopies:
    """One commitlog process (``replicas`` 1) or a SYNC_MASTER shard of ``replicas`` on a local etcd."""

    def __init__(self, root: Path, replicas: int, flush: str) -> None:
        self.root, self.replicas, self.flush = root, replicas, flush
        self.etcd_proc: subprocess.Popen[bytes] | None = None
        self.etcd: EtcdClient | None = None
        self.listen = {f"r{i}": f"127.0.0.1:{free_port()}" for i in range(replicas)}
        self.ha_ports = {name: free_port() for name in self.listen}
        self.services: dict[str, Service] = {}
        self.starts = 0

    def env(self, name: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("MQSTORE_")}
        env["MQSTORE_FLUSH_DISK_TYPE"] = self.flush
        if self.replicas > 1:
            env.update({"MQSTORE_ETCD_ENDPOINT": self.etcd_endpoint, "MQSTORE_HA_LISTEN_PORT": str(self.ha_ports[name]),
                        "MQSTORE_HA_REPLICA_NAME": name, "MQSTORE_BROKER_ROLE": "SYNC_MASTER",
                        "MQSTORE_BROKER_NAME": SHARD, "MQSTORE_HA_LEASE_TTL_SECONDS": LEASE_TTL_S,
                        "MQSTORE_HA_SEND_HEARTBEAT_INTERVAL": "500"})
        return env

    def start(self) -> MqstoreCopies:
        self.root.mkdir(parents=True, exist_ok=True)
        if self.replicas > 1:
            client, peer = free_port(), free_port()
            ports = ReplicaPorts(0, client, peer, 0)
            self.etcd_endpoint = ports.etcd
            self.etcd_proc = start_etcd(self.root / "etcd" / "data", ports)
            self.etcd = EtcdClient(self.etcd_endpoint)
        for name in self.listen:
            self.start_replica(name)
        for service in self.services.values():
            service.wait_serving()
        if self.replicas > 1:
            self.wait_all_in_sync()
        return self

    def start_replica(self, name: str) -> Service:
        self.starts += 1
        self.services[name] = Service("commitlog", ["--store", str(self.root / name), "--listen", self.listen[name]],
                                      self.root / f"{name}-{self.starts}.log", self.env(name), COMMITLOG_HEALTH)
        return self.services[name]

    def view(self) -> tuple[str | None, frozenset[str]]:
        if self.etcd is None:
            return "r0", frozenset({"r0"})
        try:
            shard = read_shard(self.etcd, ShardKeys(SHARD))
        except EtcdError:
            return None, frozenset()
        members = frozenset(shard.in_sync.members) if shard.in_sync is not None else frozenset()
        return (shard.leader.replica if shard.leader is not None else None), members

    def wait_all_in_sync(self, timeout_s: float = 60.0) -> str:
        deadline = time.monotonic() + timeout_s
        while True:
            leader, members = self.view()
            if leader is not None and len(members) == self.replicas:
                return leader
            if time.monotonic() > deadline:
                raise RuntimeError(f"no leader with {self.replicas} replicas in sync (leader {leader}, {set(members)})")
            time.sleep(0.1)

    def lost_leaderships(self) -> int:
        """Times a replica's log says it stopped leading (a lease not renewed in time: a starved process)."""
        logs = (path.read_text(errors="replace") for path in self.root.glob("*.log"))
        return sum(text.count("is NO LONGER the leader") for text in logs)

    def kill9(self, name: str) -> None:
        service = self.services[name]
        if service.proc.poll() is None:
            os.kill(service.pid, signal.SIGKILL)
            service.proc.wait()

    def stop(self) -> None:
        for service in self.services.values():
            service.stop()
        if self.etcd is not None:
            self.etcd.close()
        if self.etcd_proc is not None and self.etcd_proc.poll() is None:
            self.etcd_proc.terminate()
            self.etcd_proc.wait(10)


def _message(workload: Workload, i: int) -> common_pb2.Message:
    return common_pb2.Message(topic=TOPIC, queue_id=i % QUEUES, body=workload.body(i),
                              properties={"UNIQ_KEY": workload.uniq_key(i), "CLUSTER": CLUSTER})


def mqstore_sender(copies: MqstoreCopies, batch: int, workload: Workload) -> Callable[[], Awaitable[int]]:
    """A coroutine function making one call of ``batch`` messages (prebuilt: the client's Python is not
    the figure) to the leader; returns the messages acknowledged. A refused call (the leader lost its
    lease, or moved) raises, and the next call goes to the leader etcd names then."""
    stubs = {name: commitlog_pb2_grpc.CommitLogServiceStub(grpc.aio.insecure_channel(target))
             for name, target in copies.listen.items()}
    leader = [copies.view()[0] or "r0"]
    requests = [commitlog_pb2.AppendRequest(message=_message(workload, i)) for i in range(256)] if batch == 1 else []
    batches = [commitlog_pb2.AppendBatchRequest(messages=[_message(workload, b * batch + i) for i in range(batch)])
               for b in range(8)] if batch > 1 else []

    async def send() -> int:
        stub = stubs[leader[0]]
        try:
            if batch == 1:
                result = await stub.Append(random.choice(requests), timeout=30)
                return 1 if result.commitlog_offset >= 0 else 0
            return len((await stub.AppendBatch(random.choice(batches), timeout=30)).results)
        except grpc.RpcError:
            await asyncio.sleep(0.1)
            leader[0] = copies.view()[0] or leader[0]
            raise
    return send


# -- Redis ----------------------------------------------------------------------------------------
class RedisReplica(RedisServer):
    """A second redis-server replicating the master (``replicaof``)."""

    def __init__(self, root: Path, master_port: int, appendfsync: str) -> None:
        super().__init__(root, appendfsync)
        with self.config.open("a") as config:
            config.write(f"replicaof 127.0.0.1 {master_port}\n")


def redis_sender(target: str, batch: int, workload: Workload, wait: bool) -> Callable[[], Awaitable[int]]:
    import hiredis

    from bench.peer_redis import RawConnection
    pack: Any = hiredis.pack_command
    payloads = [b"".join(pack(("XADD", f"{TOPIC}:{i % QUEUES}", "*", "body", workload.body(i),
                               "UNIQ_KEY", workload.uniq_key(i), "CLUSTER", CLUSTER))
                         for i in range(b * batch, (b + 1) * batch)) + (pack(("WAIT", "1", "10000")) if wait else b"")
                for b in range(8)]
    connection: list[RawConnection] = []

    async def send() -> int:
        if not connection:
            connection.append(await RawConnection.open(target))
        replies = await connection[0].call(random.choice(payloads), batch + (1 if wait else 0))
        if wait and replies[-1] < 1:
            raise RuntimeError(f"WAIT 1 answered {replies[-1]}: no replica acknowledged")
        return sum(1 for r in replies[:batch] if isinstance(r, bytes))
    return send


def wait_redis_replica(target: str, timeout_s: float = 30.0) -> None:
    import redis
    host, port = target.rsplit(":", 1)
    client = redis.Redis(host=host, port=int(port))
    deadline = time.monotonic() + timeout_s
    while client.info("replication").get("connected_slaves", 0) < 1:
        if time.monotonic() > deadline:
            raise RuntimeError("the Redis replica did not connect")
        time.sleep(0.1)
    client.close()


# -- NATS -----------------------------------------------------------------------------------------
class NatsClusterServer(NatsServer):
    """One of three nats-servers in a JetStream cluster on loopback."""

    def __init__(self, root: Path, name: str, cluster_port: int, routes: list[int]) -> None:
        super().__init__(root)
        store = root / "jetstream"
        self.config.write_text("\n".join([
            f"server_name: {name}", f"listen: 127.0.0.1:{self.port}", "max_payload: 8MB",
            "jetstream {", f'  store_dir: "{store}"', "  max_memory_store: 1GB", "  max_file_store: 64GB", "}",
            "cluster {", "  name: bench", f"  listen: 127.0.0.1:{cluster_port}",
            "  routes: [" + ", ".join(f"nats-route://127.0.0.1:{p}" for p in routes) + "]", "}", ""]))


async def nats_stream(target: str, replicas: int, timeout_s: float = 60.0) -> None:
    import nats
    from nats.js import api
    nc = await nats.connect(f"nats://{target}", connect_timeout=10)
    try:
        js = nc.jetstream(timeout=10)
        deadline = time.monotonic() + timeout_s
        while True:  # the cluster elects its JetStream meta leader first
            try:
                with contextlib.suppress(nats.js.errors.NotFoundError):
                    await js.delete_stream(TOPIC)
                await js.add_stream(api.StreamConfig(name=TOPIC, subjects=[f"{TOPIC}.*"],
                                                     storage=api.StorageType.FILE, num_replicas=replicas))
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)
    finally:
        await nc.close()


def nats_sender(target: str, batch: int, workload: Workload) -> Callable[[], Awaitable[int]]:
    import nats
    from nats.js import api
    state: dict[str, Any] = {}
    headers = [{"UNIQ_KEY": workload.uniq_key(i), "CLUSTER": CLUSTER} for i in range(256)]

    async def send() -> int:
        if "js" not in state:
            state["nc"] = await nats.connect(f"nats://{target}", connect_timeout=10, pending_size=64 << 20)
            state["js"] = state["nc"].jetstream(timeout=30)
        js = state["js"]
        if batch == 1:
            i = random.randrange(256)
            ack = await js.publish(f"{TOPIC}.{i % QUEUES}", workload.body(i), headers=headers[i])
            return 1 if ack.seq > 0 else 0
        futures = [await js.publish_async(f"{TOPIC}.{i % QUEUES}", workload.body(i), headers=headers[i % 256])
                   for i in range(batch)]
        acks = await asyncio.gather(*futures)
        return sum(1 for a in acks if isinstance(a, api.PubAck) and a.seq > 0)
    return send


# -- the load -------------------------------------------------------------------------------------
@dataclass
class Row:
    system: str
    copies: str
    batch: int
    msgs_s: float
    p50_ms: float
    p99_ms: float
    errors: int
    extra: dict[str, Any] = field(default_factory=dict)


async def drive(make_sender: Callable[[], Callable[[], Awaitable[int]]], producers: int, seconds: float) -> tuple[
        float, float, float, int]:
    """``producers`` coroutines calling their sender for ``seconds`` (after a 1 s warm-up): messages
    acknowledged a second, p50 and p99 of a call (ms), calls failed."""
    senders = [make_sender() for _ in range(producers)]
    for send in senders:  # connect and warm up
        with contextlib.suppress(Exception):
            await send()
    latencies: list[float] = []
    done, errors = [0], [0]
    end = time.monotonic() + seconds

    async def producer(send: Callable[[], Awaitable[int]]) -> None:
        while (t0 := time.monotonic()) < end:
            try:
                n = await send()
            except Exception as exc:  # noqa: BLE001 - counted, the first one shown
                errors[0] += 1
                if errors[0] == 1:
                    progress(f"  first failed call: {exc}"[:400])
                continue
            latencies.append(time.monotonic() - t0)
            done[0] += n

    started = time.monotonic()
    await asyncio.gather(*(producer(s) for s in senders))
    elapsed = time.monotonic() - started
    latencies.sort()
    return done[0] / elapsed, percentile(latencies, 50) * 1000, percentile(latencies, 99) * 1000, errors[0]


async def sample_lag(copies: MqstoreCopies, stop: asyncio.Event, period_s: float = 0.02) -> dict[str, float]:
    """The followers' lag while ``stop`` is unset: p50/p99/max bytes behind the leader (the report turns
    bytes into ms at the row's rate: how long the leader takes to write what a follower lacks)."""
    leader = copies.view()[0] or "r0"
    channels = {name: grpc.aio.insecure_channel(target) for name, target in copies.listen.items()}
    stubs = {name: commitlog_pb2_grpc.CommitLogServiceStub(ch) for name, ch in channels.items()}
    lag_bytes: list[int] = []
    request = commitlog_pb2.GetStoreInfoRequest()
    errors = 0
    while not stop.is_set():
        try:
            infos = await asyncio.gather(*(stubs[n].GetStoreInfo(request, timeout=5) for n in stubs))
        except grpc.RpcError:
            errors += 1  # a sample lost to the load: the next one counts
            continue
        offsets = dict(zip(stubs, (int(i.max_offset) for i in infos), strict=True))
        lag_bytes += [max(0, offsets[leader] - offset) for name, offset in offsets.items() if name != leader]
        await asyncio.sleep(period_s)
    for channel in channels.values():
        await channel.close()
    lag_bytes.sort()
    return {"lagBytesP50": percentile(lag_bytes, 50), "lagBytesP99": percentile(lag_bytes, 99),
            "lagBytesMax": float(lag_bytes[-1]) if lag_bytes else float("nan"), "lagSamples": len(lag_bytes),
            "lagSampleErrors": errors}


# -- the rows -------------------------------------------------------------------------------------
def cpu_seconds(pid: int | None = None) -> float:
    """User + system CPU seconds of a process so far (this one by default), from /proc."""
    if pid is None:
        times = os.times()
        return times.user + times.system
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def cpu_by_role(copies: MqstoreCopies) -> dict[str, float]:
    """CPU seconds so far of the client (this process), the leader, the followers together and etcd."""
    leader = copies.view()[0] or "r0"
    found = {"client": cpu_seconds(), "leader": 0.0, "followers": 0.0, "etcd": 0.0}
    with contextlib.suppress(OSError):
        for name, service in copies.services.items():
            found["leader" if name == leader else "followers"] += cpu_seconds(service.pid)
        if copies.etcd_proc is not None:
            found["etcd"] = cpu_seconds(copies.etcd_proc.pid)
    return found


async def mqstore_rows(root: Path, args: argparse.Namespace, workload: Workload) -> list[Row]:
    rows: list[Row] = []
    for replicas in (1, 3):
        copies = MqstoreCopies(root / f"mqstore-{replicas}", replicas, args.flush).start()
        try:
            label = "1 copy" if replicas == 1 else "3 replicas, SYNC_MASTER"
            for batch in BATCHES:
                progress(f"mqstore {label}, batch {batch} ...")
                stop = asyncio.Event()
                lag = asyncio.ensure_future(sample_lag(copies, stop)) if replicas > 1 and batch == BATCHES[-1] else None
                before, started = cpu_by_role(copies), time.monotonic()
                rate, p50, p99, errors = await drive(partial(mqstore_sender, copies, batch, workload),
                                                     args.producers, args.seconds)
                after, elapsed = cpu_by_role(copies), time.monotonic() - started
                stop.set()
                # The share of the machine's cores each role used over the row (warm-up included).
                cpu = {f"cpu{role.capitalize()}": (after[role] - before[role]) / elapsed for role in after}
                extra = {**(await lag if lag else {}), "lostLeaderships": copies.lost_leaderships(), **cpu}
                rows.append(Row("mqstore", label, batch, rate, p50, p99, errors, extra))
        finally:
            copies.stop()
    return rows


async def redis_rows(root: Path, args: argparse.Namespace, workload: Workload) -> list[Row]:
    rows: list[Row] = []
    fsync = "always" if args.flush == "SYNC_FLUSH" else "everysec"
    master = RedisServer(root / "redis-master", fsync).start()
    replica = RedisReplica(root / "redis-replica", master.port, fsync).start()
    try:
        wait_redis_replica(master.target)
        for wait in (False, True):
            label = "1 copy (no WAIT)" if not wait else "master + replica, WAIT 1"
            for batch in BATCHES:
                progress(f"redis {label}, batch {batch} ...")
                rate, p50, p99, errors = await drive(partial(redis_sender, master.target, batch, workload, wait),
                                                     args.producers, args.seconds)
                rows.append(Row("redis", label, batch, rate, p50, p99, errors))
    finally:
        replica.stop()
        master.stop()
    return rows


async def nats_rows(root: Path, args: argparse.Namespace, workload: Workload) -> list[Row]:
    rows: list[Row] = []
    cluster_ports = [free_port() for _ in range(3)]
    servers = [NatsClusterServer(root / f"nats-{i}", f"n{i}", cluster_ports[i],
                                 [p for j, p in enumerate(cluster_ports) if j != i]) for i in range(3)]
    try:
        for server in servers:
            server.start()
        for replicas in (1, 3):
            await nats_stream(servers[0].target, replicas)
            label = f"R{replicas} stream, 3-server cluster"
            for batch in BATCHES:
                progress(f"nats {label}, batch {batch} ...")
                rate, p50, p99, errors = await drive(partial(nats_sender, servers[0].target, batch, workload),
                                                     args.producers, args.seconds)
                rows.append(Row("nats", label, batch, rate, p50, p99, errors))
    finally:
        for server in servers:
            server.stop()
    return rows


# -- failover -------------------------------------------------------------------------------------
@dataclass
class Kill:
    victim: str
    first_ack_s: float
    all_readable_s: float
    max_read_gap_s: float


class FailoverLoad:
    """A producer that follows the leader etcd names and a reader of acknowledged messages, on threads."""

    def __init__(self, copies: MqstoreCopies, workload: Workload) -> None:
        self.copies, self.workload = copies, workload
        self.acks: list[tuple[float, str, int, int]] = []  # (time, replica, offset, size)
        self.reads: list[float] = []  # times of successful reads
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._produce, daemon=True),
                         threading.Thread(target=self._read, daemon=True)]
        self._stubs: dict[str, tuple[int, Any]] = {}  # replica -> (its start count, stub)

    def stub(self, name: str) -> Any:
        starts = id(self.copies.services[name])
        cached = self._stubs.get(name)
        if cached is None or cached[0] != starts:
            cached = (starts, commitlog_pb2_grpc.CommitLogServiceStub(grpc.insecure_channel(self.copies.listen[name])))
            self._stubs[name] = cached
        return cached[1]

    def start(self) -> FailoverLoad:
        for thread in self._threads:
            thread.start()
        return self

    def _produce(self) -> None:
        i = 0
        while not self._stop.is_set():
            leader = self.copies.view()[0]
            if leader is None:
                time.sleep(0.02)
                continue
            i += 1
            try:
                request = commitlog_pb2.AppendRequest(message=_message(self.workload, i))
                r = self.stub(leader).Append(request, timeout=10)
            except (grpc.RpcError, ValueError):
                time.sleep(0.02)
                continue
            self.acks.append((time.monotonic(), leader, r.commitlog_offset, r.wrote_bytes))

    def _read(self) -> None:
        while not self._stop.is_set():
            if not self.acks:
                time.sleep(0.01)
                continue
            _, _, offset, size = self.acks[random.randrange(len(self.acks))]
            name = random.choice(list(self.copies.listen))
            try:
                data = self.stub(name).Read(commitlog_pb2.ReadRequest(offset=offset, size=size), timeout=2).data
                if len(data) == size:
                    self.reads.append(time.monotonic())
            except (grpc.RpcError, ValueError):
                pass  # that replica is down or behind: the next read picks another
            time.sleep(0.005)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)


def failover(root: Path, args: argparse.Namespace, workload: Workload) -> list[Kill]:
    copies = MqstoreCopies(root / "failover", 3, args.flush).start()
    load = FailoverLoad(copies, workload).start()
    kills: list[Kill] = []
    try:
        for k in range(args.kills):
            victim = copies.wait_all_in_sync()
            time.sleep(random.uniform(0.5, 1.5))
            acked_end = max((o + s for _, _, o, s in load.acks), default=0)
            killed_at = time.monotonic()
            copies.kill9(victim)
            progress(f"failover {k + 1}/{args.kills}: {victim} killed")
            first = _wait(partial(_first_ack, load, victim, killed_at), 60)
            readable = _wait(partial(_holds, load, copies, victim, acked_end), 60)
            gaps = [b - a for a, b in zip(load.reads, load.reads[1:], strict=False) if b > killed_at - 1]
            kills.append(Kill(victim, first - killed_at, readable - killed_at, max(gaps, default=float("nan"))))
            copies.start_replica(victim).wait_serving()
    finally:
        load.stop()
        copies.stop()
    return kills


def _wait(probe: Callable[[], float | None], timeout_s: float) -> float:
    deadline = time.monotonic() + timeout_s
    while (value := probe()) is None:
        if time.monotonic() > deadline:
            raise RuntimeError(f"not within {timeout_s:.0f} s")
        time.sleep(0.01)
    return value


def _first_ack(load: FailoverLoad, victim: str, after: float) -> float | None:
    """When the first send made after the kill was acknowledged (by a replica other than the victim)."""
    return min((t for t, name, _, _ in load.acks if t > after and name != victim), default=None)


def _holds(load: FailoverLoad, copies: MqstoreCopies, victim: str, end: int) -> float | None:
    """The time the new leader holds every message acknowledged before the kill (None: not yet)."""
    leader = copies.view()[0]
    if leader is None or leader == victim:
        return None
    try:
        info = load.stub(leader).GetStoreInfo(commitlog_pb2.GetStoreInfoRequest(), timeout=2)
    except (grpc.RpcError, ValueError):
        return None
    return time.monotonic() if info.max_offset >= end else None


# -- report ---------------------------------------------------------------------------------------
def print_report(rows: list[Row], kills: list[Kill]) -> None:
    print("\n| system | copies | batch | msgs/s | p50 ms | p99 ms | failed calls |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r.system} | {r.copies} | {r.batch} | {r.msgs_s:,.0f} | {r.p50_ms:.2f} | {r.p99_ms:.2f} | "
              f"{r.errors} |")
    print("\nSYNC replication's cost (3 copies against 1, same batch):")
    for system in ("mqstore", "redis", "nats"):
        for batch in BATCHES:
            pair = [r for r in rows if r.system == system and r.batch == batch]  # one copy first, then three
            if len(pair) == 2 and pair[0].msgs_s:
                one, three = pair
                print(f"  {system} batch {batch}: costs {100 * (1 - three.msgs_s / one.msgs_s):.0f}% "
                      f"({three.msgs_s:,.0f} against {one.msgs_s:,.0f} msgs/s)")
    cpu_rows = [r for r in rows if "cpuLeader" in r.extra]
    if cpu_rows:
        print(f"\nmqstore CPU over each row, in cores (the machine has {os.cpu_count()}):")
        for r in cpu_rows:
            e = r.extra
            print(f"  {r.copies}, batch {r.batch}: client {e['cpuClient']:.2f}, leader {e['cpuLeader']:.2f}, "
                  f"followers {e['cpuFollowers']:.2f}, etcd {e['cpuEtcd']:.2f}; all "
                  f"{sum(e[k] for k in ('cpuClient', 'cpuLeader', 'cpuFollowers', 'cpuEtcd')):.2f}")
    for r in rows:
        if r.extra.get("lostLeaderships"):
            print(f"\n{r.system} {r.copies} batch {r.batch}: {r.extra['lostLeaderships']} leaderships lost so far "
                  "(a lease not renewed in time: the machine starved the replica; its calls failed until the next "
                  "leader)")
        if "lagSamples" in r.extra:
            e, bytes_ms = r.extra, max(r.msgs_s, 1e-9) * RECORD_SIZE / 1000  # the leader's bytes a ms at this rate
            lags = {q: e[f"lagBytes{q.capitalize()}"] for q in ("p50", "p99", "max")}
            print(f"\nreplication lag at mqstore's 3-copy batch-{r.batch} rate ({r.msgs_s:,.0f} msgs/s), "
                  f"{e['lagSamples']} samples: " + ", ".join(f"{q} {v:,.0f} B = {v / bytes_ms:.0f} ms"
                                                              for q, v in lags.items()))
    if kills:
        first = sorted(k.first_ack_s for k in kills)
        readable = sorted(k.all_readable_s for k in kills)
        gaps = sorted(k.max_read_gap_s for k in kills)
        print(f"\nfailover, {len(kills)} leader kills (SIGKILL, lease TTL {LEASE_TTL_S} s):")
        print("  kill -> first acknowledged send: " + ", ".join(f"{v:.2f}" for v in first) +
              f" s (p50 {percentile(first, 50):.2f}, max {first[-1]:.2f})")
        print("  kill -> every acknowledged message on the new leader: " + ", ".join(f"{v:.2f}" for v in readable) +
              f" s (max {readable[-1]:.2f})")
        print(f"  longest gap between two successful reads around a kill: max {gaps[-1]:.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=4.0, help="measured seconds per send row (default 4)")
    parser.add_argument("--producers", type=int, default=8, help="concurrent producers (default 8)")
    parser.add_argument("--kills", type=int, default=10, help="leader kills in the failover part (default 10; 0: none)")
    parser.add_argument("--flush", choices=("ASYNC_FLUSH", "SYNC_FLUSH"), default="ASYNC_FLUSH")
    parser.add_argument("--systems", default="mqstore,redis,nats", help="which send rows (default all)")
    parser.add_argument("--json", action="store_true", help="also print the results as one JSON line")
    args = parser.parse_args()
    systems = args.systems.split(",")
    if {"redis", "nats"} & set(systems):
        ensure_installed()
    print_machine(f"{args.producers} producers, {BODY_SIZE} B bodies, {args.seconds:.0f} s a row, {args.flush}; "
                  f"{server_version('redis-server') if server_binary('redis-server') else ''} "
                  f"{server_version('nats-server') if server_binary('nats-server') else ''}")
    workload = Workload.fresh(256, seed=1)
    started = time.monotonic()
    with scratch_dir("replication-") as root:
        rows: list[Row] = []
        for system, run in (("mqstore", mqstore_rows), ("redis", redis_rows), ("nats", nats_rows)):
            if system in systems:
                rows += asyncio.run(run(root, args, workload))
        kills = failover(root, args, workload) if args.kills else []
    print_report(rows, kills)
    progress(f"bench.replication took {time.monotonic() - started:.0f} s")
    if args.json:
        print(json.dumps({"rows": [r.__dict__ for r in rows], "kills": [k.__dict__ for k in kills]}))


if __name__ == "__main__":
    main()
