"""``mqstore up --replicas N``: a local etcd and N replicas of the shard on loopback, behind one gateway.

Each replica is a whole copy of the shard's services under ``<store>/replica-<i>/`` (its commitlog owns
that root, the indexer and query service their folders in it, as ``mqstore up`` lays out one copy).
Its commitlog names etcd (``etcdEndpoint``), itself (``haReplicaName`` ``replica-<i>``) and its HA port
(``haListenPort``), and acknowledges as SYNC_MASTER: etcd decides which replica leads, the others follow
it on the HA wire (docs/replication.md). etcd keeps its data in ``<store>/etcd/``; Debian's etcd-server
is installed when no ``etcd`` is found (as ``make bench-peers`` installs its peers).

The scheduler writes delivered messages through the commitlog, so only the leader's replica runs one:
the runner watches etcd's ``leader`` key and moves the scheduler to the new leader's replica (stopped
on the old one first). The gateway follows the leader itself (gateway/leader.py), from a settings
file the runner writes (``<store>/gateway-replicas.yaml``). A signal stops the gateway, the
scheduler, each replica's readers and commitlog, and etcd last.

Ports, from the base port B (default: gateway 9876, etcd 9970 and 9971, replica i at 9901 + 10 i): the
gateway at B, etcd's client and peer ports at B+1 and B+2, replica i's commitlog, indexer, query,
scheduler and HA listener at B + 10 (i+1) + 0..4. Metrics from the metrics base port M (default 9910):
the gateway's workers at M+1..., replica i's services at M + 90 + 10 i + 0..3.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from services.runner import (
    START_TIMEOUT_S,
    ChildSpec,
    PortTakenError,
    StopRequest,
    _Child,
    _stop,
    child_specs,
    wait_serving,
)
from services.server.etcd_client import EtcdClient, EtcdError
from services.server.process import exit_reason
from services.server.shard_keys import ShardKeys, read_shard
from services.store.config import ConfigError, load_config
from services.store.store_root import make_dirs

log = logging.getLogger("services.replica_set")

DEFAULT_GATEWAY_PORT = 9876
DEFAULT_ETCD_PORT = 9970
DEFAULT_REPLICA_BASE = 9891  # replica i at 9901 + 10 i, as B + 10 (i+1) with B = 9891
MAX_REPLICAS = 5  # the default ports of replica 6 on would meet etcd's (9970)
ETCD_READY_S = 30.0
#: The leader lease's TTL unless MQSTORE_HA_LEASE_TTL_SECONDS says otherwise: a dead leader's lease
#: lapses, and the next leader is named, within it (the commitlog's default, 5 s, is for a network).
LEASE_TTL_S = "3"
#: What replicas on one machine may do faster than across a network, unless the environment says
#: otherwise: the lease (above), and the followers' offset reports (a follower joins the next leader's
#: in-sync set at its first report past the handshake: 4.9.8's 5 s heartbeat would hold every write).
LOCAL_DEFAULTS = {"MQSTORE_HA_LEASE_TTL_SECONDS": LEASE_TTL_S, "MQSTORE_HA_SEND_HEARTBEAT_INTERVAL": "500"}
SERVICES = ("commitlog", "indexer", "query", "scheduler")
#: Replica i's services serve /metrics from metrics base + 90 + 10 i (default 10000 + 10 i ...): clear of
#: the gateway's workers (metrics base + 1 ...) and of the replicas' own default ports (9901 ... 9945).
REPLICA_METRICS_OFFSET = 90


@dataclass(frozen=True)
class ReplicaPorts:
    gateway: int
    etcd_client: int
    etcd_peer: int
    replica_base: int

    @classmethod
    def of(cls, base_port: int | None) -> ReplicaPorts:
        if base_port is None:
            return cls(DEFAULT_GATEWAY_PORT, DEFAULT_ETCD_PORT, DEFAULT_ETCD_PORT + 1, DEFAULT_REPLICA_BASE)
        return cls(base_port, base_port + 1, base_port + 2, base_port)

    def replica(self, i: int, service: str) -> int:
        """``service``: one of SERVICES, or "ha"."""
        return self.replica_base + 10 * (i + 1) + (*SERVICES, "ha").index(service)

    @property
    def etcd(self) -> str:
        return f"127.0.0.1:{self.etcd_client}"


def replica_env(i: int, ports: ReplicaPorts) -> tuple[tuple[str, str], ...]:
    """The settings that make replica ``i`` one of the shard's replicas (the process's own MQSTORE_*
    environment and the settings file still apply to everything else)."""
    env = {"MQSTORE_ETCD_ENDPOINT": ports.etcd, "MQSTORE_HA_LISTEN_PORT": str(ports.replica(i, "ha")),
           "MQSTORE_HA_REPLICA_NAME": replica_name(i), "MQSTORE_BROKER_ROLE": "SYNC_MASTER"}
    for name, value in LOCAL_DEFAULTS.items():
        if name not in os.environ:
            env[name] = value
    return tuple(env.items())


def replica_name(i: int) -> str:
    return f"replica-{i}"


def replica_specs(root: Path, config_file: str | None, ports: ReplicaPorts, i: int,
                  metrics_base_port: int | None) -> dict[str, ChildSpec]:
    """Replica ``i``'s commitlog, indexer, query and scheduler: ``mqstore up``'s own children for one
    copy, on the replica's ports and folder, with its replica settings."""
    address = {s: f"127.0.0.1:{ports.replica(i, s)}" for s in SERVICES}
    from services.runner import Addresses  # the one-copy layout, reused per replica

    addresses = Addresses("127.0.0.1:0", address["commitlog"], address["indexer"], address["query"],
                          address["scheduler"])
    env = replica_env(i, ports)
    specs = {}
    for spec in child_specs(root / replica_name(i), config_file, addresses, metrics_base_port=None):
        if spec.name == "gateway":
            continue
        metrics = None if metrics_base_port is None else \
            metrics_base_port + REPLICA_METRICS_OFFSET + 10 * i + SERVICES.index(spec.name)
        specs[spec.name] = dataclasses.replace(spec, name=f"{spec.name} {replica_name(i)}", env=env,
                                               metrics_port=metrics)
    return specs


def gateway_settings(path: Path, ports: ReplicaPorts, replicas: int, broker_name: str) -> Path:
    """The gateway's settings for the replicated shard (gateway/settings.py)."""
    members = [{"name": replica_name(i), **{s: f"127.0.0.1:{ports.replica(i, s)}" for s in SERVICES}}
               for i in range(replicas)]
    shard = {"name": "shard-0", "commitlog": members[0]["commitlog"], "query": members[0]["query"],
             "etcd": ports.etcd, "broker_name": broker_name, "replicas": members}
    path.write_text(yaml.safe_dump({"shards": [shard]}, sort_keys=False), encoding="utf-8")
    return path


def etcd_binary() -> str:
    """etcd on PATH or where Debian puts it; Debian's etcd-server installed first when there is none."""
    found = shutil.which("etcd") or next((p for d in ("/usr/bin", "/usr/sbin", "/usr/local/bin")
                                          if os.access(p := f"{d}/etcd", os.X_OK)), None)
    if found:
        return found
    log.info("etcd is missing: installing Debian's etcd-server with apt-get ...")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-qq", "etcd-server"], check=True, env=env, stdout=subprocess.DEVNULL)
    found = shutil.which("etcd") or "/usr/bin/etcd"
    if not os.access(found, os.X_OK):
        raise ConfigError("apt-get installed etcd-server but no etcd binary was found: install etcd yourself")
    return found


def start_etcd(data_dir: Path, ports: ReplicaPorts) -> subprocess.Popen[bytes]:
    """One etcd member on loopback, its data in ``data_dir``; returns once it takes writes."""
    client_url, peer_url = f"http://{ports.etcd}", f"http://127.0.0.1:{ports.etcd_peer}"
    data_dir.mkdir(parents=True, exist_ok=True)
    log_file = (data_dir.parent / "etcd.log").open("ab")
    proc = subprocess.Popen(
        [etcd_binary(), "--name", "mqstore", "--data-dir", str(data_dir), "--listen-client-urls", client_url,
         "--advertise-client-urls", client_url, "--listen-peer-urls", peer_url,
         "--initial-advertise-peer-urls", peer_url, "--initial-cluster", f"mqstore={peer_url}"],
        stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True)
    log_file.close()
    log.info("started etcd (pid %d) on %s, data in %s", proc.pid, ports.etcd, data_dir)
    deadline = time.monotonic() + ETCD_READY_S
    while proc.poll() is None and time.monotonic() < deadline:
        try:  # the port first: a gRPC channel that dialled too early backs off for seconds
            socket.create_connection(("127.0.0.1", ports.etcd_client), timeout=0.5).close()
        except OSError:
            time.sleep(0.05)
            continue
        client = EtcdClient(ports.etcd)
        try:
            client.get(b"/mqstore/ready")
            return proc
        except EtcdError:
            time.sleep(0.1)
        finally:
            client.close()
    _stop_etcd(proc)
    raise ConfigError(f"etcd did not start on {ports.etcd} within {ETCD_READY_S:.0f} s "
                      f"(see {data_dir.parent}/etcd.log)")


def _stop_etcd(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    log.info("etcd stopped")


class _Scheduler:
    """The one scheduler, on the leader's replica: moved when etcd names another leader."""

    def __init__(self, specs: list[ChildSpec], etcd: EtcdClient, broker_name: str) -> None:
        self._specs = specs
        self._etcd = etcd
        self._keys = ShardKeys(broker_name)
        self.child: _Child | None = None
        self.replica: int | None = None

    def leader(self) -> int | None:
        try:
            view = read_shard(self._etcd, self._keys)
        except EtcdError as exc:
            log.warning("%s", exc)
            return self.replica
        if view.leader is None:
            return self.replica
        names = [replica_name(i) for i in range(len(self._specs))]
        return names.index(view.leader.replica) if view.leader.replica in names else self.replica

    def stop(self) -> int:
        """Stop the scheduler once it serves (one stopped while it starts cannot stop cleanly)."""
        child = self.child
        assert child is not None and child.proc is not None
        with contextlib.suppress(PortTakenError):
            wait_serving(child.spec.listen, child.proc, START_TIMEOUT_S, child.instance)
        self.child = None
        return _stop(child)

    def follow(self) -> str | None:
        """Start, move or supervise the scheduler; why the system must stop (None: it need not)."""
        leader = self.leader()
        if leader is None:
            return None
        if leader != self.replica:
            if self.child is not None:
                log.info("replica-%d leads now: moving the scheduler there", leader)
                self.stop()
            self.replica, self.child = leader, _Child(self._specs[leader])
            self.child.start()
            return None
        return self.child.supervise() if self.child is not None else None


def run_replicated(store: str, config_file: str | None, replicas: int, base_port: int | None,
                   auth_file: str | None, metrics_base_port: int | None, gateway_workers: int | None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if not 1 <= replicas <= MAX_REPLICAS:
        log.error("--replicas must be within 1..%d, got %d", MAX_REPLICAS, replicas)
        return 2
    try:
        broker_name = load_config(config_file).broker_name
    except ConfigError as exc:
        log.error("%s", exc)
        return 2
    root = Path(store)
    make_dirs(root)
    ports = ReplicaPorts.of(base_port)
    stop_requested = StopRequest()
    try:
        etcd = start_etcd(root / "etcd" / "data", ports)
    except (ConfigError, subprocess.CalledProcessError, OSError) as exc:
        log.error("cannot start etcd: %s", exc)
        return 1
    etcd_client = EtcdClient(ports.etcd)
    children: list[_Child] = []
    per_replica = [replica_specs(root, config_file, ports, i, metrics_base_port) for i in range(replicas)]
    for i in range(replicas):
        make_dirs(root / replica_name(i))
    scheduler = _Scheduler([specs["scheduler"] for specs in per_replica], etcd_client, broker_name)
    gateway = _gateway_spec(root, config_file, ports, replicas, broker_name, auth_file, metrics_base_port,
                            gateway_workers)
    failure = _start_all(children, [spec for specs in per_replica for name, spec in specs.items()
                                    if name != "scheduler"], stop_requested)
    if failure is None and not stop_requested():
        failure = _wait_for_leader(scheduler, stop_requested)
    if failure is None and not stop_requested():
        failure = _start_all(children, [gateway], stop_requested)
    if failure is None and not stop_requested():
        _print_welcome(gateway.listen, root, replicas, ports)
    while failure is None and not stop_requested():
        for child in children:
            failure = child.supervise()
            if failure is not None or stop_requested():
                break
        failure = failure or scheduler.follow()
        time.sleep(0.2)
    exit_code = 0
    if failure is not None:
        log.error("%s: stopping the system", failure)
        exit_code = 1
    for child in reversed(children):  # the gateway first, then the scheduler, then each replica's readers
        exit_code = _stop(child) or exit_code
        if scheduler.child is not None and child.spec.name == "gateway":
            exit_code = scheduler.stop() or exit_code
    if scheduler.child is not None:
        exit_code = scheduler.stop() or exit_code
    etcd_client.close()
    _stop_etcd(etcd)
    return exit_code


def _gateway_spec(root: Path, config_file: str | None, ports: ReplicaPorts, replicas: int, broker_name: str,
                  auth_file: str | None, metrics_base_port: int | None, workers: int | None) -> ChildSpec:
    settings = gateway_settings(root / "gateway-replicas.yaml", ports, replicas, broker_name)
    args = ["serve", "gateway", "--config", str(settings), "--listen", f"127.0.0.1:{ports.gateway}",
            "--default-topic-queue-nums", str(load_config(config_file).default_topic_queue_nums)]
    if auth_file:
        args += ["--auth-file", auth_file]
    if workers is not None:
        args += ["--workers", str(workers)]
    return ChildSpec("gateway", args, f"127.0.0.1:{ports.gateway}",
                     None if metrics_base_port is None else metrics_base_port + 1)


def _start_all(children: list[_Child], specs: list[ChildSpec], stopping: object) -> str | None:
    for spec in specs:
        child = _Child(spec)
        children.append(child)
        failure = child.start_serving()
        if stopping():  # type: ignore[operator]
            return None
        if failure is None and child.proc is not None and child.proc.poll() is not None:
            failure = f"{spec.name} exited with {exit_reason(child.proc.returncode)} before it served"
        if failure is not None:
            return failure
        log.info("%s is SERVING on %s", spec.name, spec.listen)
    return None


def _wait_for_leader(scheduler: _Scheduler, stopping: object, timeout_s: float = 60.0) -> str | None:
    """Until etcd names a leader (its scheduler is then started), or why not."""
    deadline = time.monotonic() + timeout_s
    while not stopping():  # type: ignore[operator]
        scheduler.follow()
        if scheduler.replica is not None:
            log.info("%s leads the shard", replica_name(scheduler.replica))
            return None
        if time.monotonic() > deadline:
            return f"no replica became the leader within {timeout_s:.0f} s (see the commitlogs' logs)"
        time.sleep(0.2)
    return None


def _print_welcome(gateway: str, root: Path, replicas: int, ports: ReplicaPorts) -> None:
    print(f"""
mqstore is up with {replicas} replicas. Gateway: {gateway} (store {root.resolve()}, etcd {ports.etcd})
  try:      mqstore send --gateway {gateway} --topic demo "hello, mqstore"
            mqstore status --gateway {gateway}    (each replica's role, epoch, offset, lag, in-sync)
  replica i: {root}/replica-<i>/, commitlog on 127.0.0.1:{ports.replica(0, 'commitlog')} + 10 i
  Ctrl-C stops every service cleanly (etcd last).
""", flush=True)
