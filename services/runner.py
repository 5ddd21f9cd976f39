"""``mqstore up`` (and ``mqstore run``): every service of the system as child processes on 127.0.0.1.

Layout under the store root: the commitlog service owns the root itself (``commitlog/``,
``checkpoint``, ``config/``...), the indexer owns ``indexer/``, the query service ``query/``, the
scheduler ``scheduler/`` (its ``config/delayOffset.json``); the gateway keeps nothing on disk. Each
child starts once the one before reports SERVING on the standard health service (the indexer
tails the commitlog, the query service reads both, the gateway fronts them all; the scheduler, last,
follows the indexer and appends to the commitlog); the processes are all started at once, held while
they import their modules (services/held_start.py), so that those imports overlap. A signal stops
the services in reverse start order (readers before the writer), each cleanly, so no abort file is
left and the next ``up`` reuses the data.

A child's health answer names the instance ``up`` started it as (``MQSTORE_INSTANCE_ID``), so a second
``up`` whose ports another system holds fails at the first one, naming it, instead of taking the other
system's answers for its own. Once the system is up, a child that dies (kill -9, a crash) is restarted
after a backoff, with a WARNING; the others keep serving and reconnect to it. Only a child that dies
more than ``RestartPolicy.max_restarts`` times within its window stops the system, saying so.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gateway.settings import DEFAULT_LISTEN as GATEWAY_LISTEN
from gateway.tls import ENV_SETTINGS as TLS_ENV_SETTINGS
from gateway.workers import workers_from_env
from services.query import DEFAULT_LISTEN as QUERY_LISTEN
from services.scheduler import DEFAULT_LISTEN as SCHEDULER_LISTEN
from services.server.grpc_server import INSTANCE_ENV, INSTANCE_METADATA
from services.server.process import RestartPolicy, exit_reason
from services.store.config import ConfigError, load_config
from services.store.store_root import make_dirs

log = logging.getLogger("services.runner")
#: The modules a child runs as (``python -m``): plain, or held while it imports (services/held_start.py).
CLI_ENTRY, HELD_ENTRY = "services.cli", "services.held_start"
STOP_TIMEOUT_S = 30.0
START_TIMEOUT_S = 120.0
DEFAULT_METRICS_BASE_PORT = 9910


def is_child_command(cmdline: bytes) -> bool:
    """Whether a process's ``/proc/<pid>/cmdline`` is one of the children ``up`` starts: what a
    harness that kills a system's leftovers by pid checks first (a pid may have been reused)."""
    return CLI_ENTRY.encode() in cmdline or HELD_ENTRY.encode() in cmdline


@dataclass(frozen=True)
class ChildSpec:
    name: str
    args: list[str]
    listen: str
    metrics_port: int | None = None
    #: MQSTORE_* settings of this child alone (a replica's name and ports: services/replica_set.py).
    env: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Addresses:
    gateway: str
    commitlog: str
    indexer: str
    query: str
    scheduler: str = SCHEDULER_LISTEN

    @classmethod
    def of(cls, config_file: str | None, base_port: int | None) -> Addresses:
        if base_port is not None:
            return cls(*(f"127.0.0.1:{base_port + i}" for i in range(5)))
        config = load_config(config_file)
        return cls(GATEWAY_LISTEN, config.commitlog_listen, config.indexer_listen, QUERY_LISTEN)


def child_specs(store: Path, config_file: str | None, addresses: Addresses, auth_file: str | None = None,
                metrics_base_port: int | None = DEFAULT_METRICS_BASE_PORT,
                gateway_workers: int | None = None) -> list[ChildSpec]:
    """``gateway_workers``: gateway processes on the gateway's port (its worker i serves /metrics on the
    gateway's metrics port + i); None leaves it to the gateway (MQSTORE_GATEWAY_WORKERS, else 1)."""
    extra = ["--config", config_file] if config_file else []
    # A topic created by its first send gets the store's defaultTopicQueueNums: the gateway's provisional
    # route must offer no more queues than that.
    auth = ["--auth-file", auth_file] if auth_file else []
    auth += ["--default-topic-queue-nums", str(load_config(config_file).default_topic_queue_nums)]
    if gateway_workers is not None:
        auth += ["--workers", str(gateway_workers)]
    a = addresses
    specs = [
        ("commitlog", ["commitlog", "--store", str(store), "--listen", a.commitlog, *extra], a.commitlog),
        ("indexer", ["indexer", "--store", str(store / "indexer"), "--listen", a.indexer, "--commitlog", a.commitlog,
                     *extra], a.indexer),
        # One host, one store volume: the query service reads the commitlog's and indexer's files directly.
        ("query", ["query", "--store", str(store / "query"), "--listen", a.query, "--commitlog", a.commitlog,
                   "--indexer", a.indexer, "--store-root", str(store), *extra], a.query),
        ("gateway", ["gateway", "--listen", a.gateway, "--commitlog", a.commitlog, "--query", a.query, *auth],
         a.gateway),
    ]
    # The scheduler, last, reads the same store volume and appends delivered messages to the commitlog.
    specs.append(("scheduler", ["scheduler", "--store", str(store / "scheduler"), "--store-root", str(store),
                                "--listen", a.scheduler, "--commitlog", a.commitlog, "--indexer", a.indexer, *extra],
                  a.scheduler))
    result = [ChildSpec(name, ["serve", *args], listen,
                        None if metrics_base_port is None else metrics_base_port + i + 1)
              for i, (name, args, listen) in enumerate(specs)]
    if metrics_base_port is not None:  # after the gateway's workers (gateway port + i)
        result[-1] = dataclasses.replace(result[-1], metrics_port=metrics_base_port + 4 + (gateway_workers or 1))
    return result


class PortTakenError(Exception):
    """Another process answers health checks on a child's address, so the child could not listen there."""


def wait_serving(address: str, proc: subprocess.Popen[bytes], timeout_s: float, instance: str | None = None) -> bool:
    """Poll the standard health service until SERVING; False when the child exits or time runs out
    (a stop requested meanwhile waits too: a child stopped before it serves cannot stop cleanly).

    With ``instance``, only the child's own answer counts (its health check names the instance it was
    started with): any other answer raises PortTakenError, for a child that fails to bind a port another
    process holds may still be alive when that process answers in its place.

    A gRPC channel that was refused once backs off for seconds before its next connect, so the port is
    probed with a plain TCP connect first and a fresh channel asks for health once it accepts.
    """
    host, _, port = address.rpartition(":")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=0.5).close()
        except OSError:
            time.sleep(0.05)
            continue
        answered_by = None
        with grpc.insecure_channel(address) as channel:
            try:
                answer, call = health_pb2_grpc.HealthStub(channel).Check.with_call(
                    health_pb2.HealthCheckRequest(service=""), timeout=2.0, wait_for_ready=True)
                status = answer.status
                answered_by = dict(call.trailing_metadata() or ()).get(INSTANCE_METADATA)
            except grpc.RpcError:
                status = None
        if status == health_pb2.HealthCheckResponse.SERVING:
            if instance is None or answered_by == instance:
                return True
            raise PortTakenError(f"port {address} is taken by another process (it answers there, not the child "
                                 f"started as pid {proc.pid}: is another mqstore up running?)")
        time.sleep(0.05)
    return False


@dataclass
class _Child:
    """One service of the system: its current process, and when it is restarted after dying."""

    spec: ChildSpec
    proc: subprocess.Popen[bytes] | None = None
    instance: str = ""
    restarts: RestartPolicy = field(default_factory=RestartPolicy)
    restart_at: float | None = None
    #: started by services/held_start.py and not released yet
    held: bool = False

    def start(self, held: bool = False) -> subprocess.Popen[bytes]:
        """Start the child; ``held``: it imports its modules, then waits for :meth:`release`."""
        spec = self.spec
        self.instance = uuid.uuid4().hex
        env = dict(os.environ)
        env.update(spec.env)
        env[INSTANCE_ENV] = self.instance
        if spec.metrics_port is not None:
            env["MQSTORE_METRICS_PORT"] = str(spec.metrics_port)
        # Own session: a Ctrl-C on the terminal reaches only the runner, which then stops each child
        # once, in order (a second signal would make a child skip its clean shutdown).
        entry = HELD_ENTRY if held else CLI_ENTRY
        self.proc = subprocess.Popen([sys.executable, "-m", entry, *spec.args], start_new_session=True, env=env,
                                     stdin=subprocess.PIPE if held else None)
        self.held = held
        log.info("started %s (pid %d) on %s", spec.name, self.proc.pid, spec.listen)
        return self.proc

    def release(self, go: bool = True) -> None:
        """Let a held child start (``go``), or end it before it starts."""
        if self.held and self.proc is not None and self.proc.stdin is not None:
            with contextlib.suppress(OSError):  # it exited meanwhile: seen by the caller's poll
                if go:
                    self.proc.stdin.write(b"go\n")
                self.proc.stdin.close()
        self.held = False

    def start_serving(self) -> str | None:
        """Start the child (release it, if it is held) and wait until it serves; why it does not (None:
        serving, or it exited)."""
        proc = self.proc if self.held and self.proc is not None else self.start()
        self.release()
        try:
            if wait_serving(self.spec.listen, proc, START_TIMEOUT_S, self.instance):
                return None
        except PortTakenError as exc:
            return f"{self.spec.name} did not start: {exc}"
        if proc.poll() is None:
            return f"{self.spec.name} did not report SERVING on {self.spec.listen} within {START_TIMEOUT_S:.0f} s"
        return None

    def supervise(self) -> str | None:
        """Restart the child if it died and its backoff is over; why the system must stop instead."""
        assert self.proc is not None
        name, now = self.spec.name, time.monotonic()
        if self.restart_at is not None:
            if now < self.restart_at:
                return None
            self.restart_at = None
            failure = self.start_serving()
            if failure is None and self.proc.poll() is None:
                log.info("%s is SERVING again on %s", name, self.spec.listen)
            return failure  # one that died again is counted at the next round
        code = self.proc.poll()
        if code is None:
            return None
        backoff = self.restarts.died(now)
        policy = self.restarts
        if backoff is None:
            return (f"{name} exited {len(policy.deaths)} times within {policy.window_s:.0f} s (last: "
                    f"{exit_reason(code)}); restarting it does not help")
        log.warning("%s exited with %s: restarting it in %.1f s (restart %d of at most %d within %.0f s)", name,
                    exit_reason(code), backoff, len(policy.deaths), policy.max_restarts, policy.window_s)
        self.restart_at = now + backoff
        return None


def run(store: str, config_file: str | None, base_port: int | None = None, auth_file: str | None = None,
        metrics_base_port: int | None = DEFAULT_METRICS_BASE_PORT, gateway_workers: int | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if gateway_workers is None:
        try:
            gateway_workers = workers_from_env()
        except ConfigError as exc:
            log.error("%s", exc)
            return 2
    tls = [name for name in TLS_ENV_SETTINGS.values() if os.environ.get(name, "").strip()]
    if tls:  # its readiness checks, and the welcome's grpcurl line, speak plaintext to the gateway
        log.error("%s set: mqstore up runs a plaintext gateway for one machine; for TLS run `mqstore gateway "
                  "--tls-cert ... --tls-key ...` in front of the shard (docs/security.md)", ", ".join(tls))
        return 2
    root = Path(store)
    make_dirs(root)
    addresses = Addresses.of(config_file, base_port)
    # Every child is started at once, held (their imports overlap), and released once the one before serves.
    children = [_Child(spec) for spec in child_specs(root, config_file, addresses, auth_file, metrics_base_port,
                                                     gateway_workers)]
    stop_requested = StopRequest()
    for child in children:
        child.start(held=True)
    failure = None
    for child in children:
        spec = child.spec
        failure = child.start_serving()
        if stop_requested():
            break
        if failure is None and child.proc is not None and child.proc.poll() is not None:
            failure = f"{spec.name} exited with {exit_reason(child.proc.returncode)} before it served"
        if failure is not None:
            break
        log.info("%s is SERVING on %s", spec.name, spec.listen)
    if failure is None and not stop_requested():
        _print_welcome(addresses.gateway, root, metrics_base_port, gateway_workers or 1)
    while failure is None and not stop_requested():
        for child in children:
            failure = child.supervise()
            if failure is not None or stop_requested():
                break
        time.sleep(0.2)
    exit_code = 0
    if failure is not None:
        log.error("%s: stopping the system", failure)
        exit_code = 1
    for child in reversed(children):
        code = _stop(child)
        exit_code = exit_code or code
    return exit_code


class StopRequest:
    """SIGTERM or SIGINT asked a supervisor (``mqstore up``) to stop; called, it says whether one did. The
    supervisor checks it between its steps and then stops its children in reverse order."""

    def __init__(self) -> None:
        self._requested = False
        signal.signal(signal.SIGTERM, self._request)
        signal.signal(signal.SIGINT, self._request)

    def _request(self, signum: int, frame: FrameType | None) -> None:
        self._requested = True

    def __call__(self) -> bool:
        return self._requested


def _stop(child: _Child) -> int:
    """SIGTERM to a live child, then wait (kill it after STOP_TIMEOUT_S); its exit code (0 if not running)."""
    proc, name = child.proc, child.spec.name
    if proc is None or proc.poll() is not None:
        return 0
    if child.held:  # never released: the end of its input ends it
        child.release(go=False)
        return proc.wait(STOP_TIMEOUT_S)
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        log.error("%s did not stop within %.0fs: killing it", name, STOP_TIMEOUT_S)
        proc.kill()
        code = proc.wait()
    log.info("%s stopped (exit code %d)", name, code)
    return code


def _print_welcome(gateway: str, root: Path, metrics_base_port: int | None, gateway_workers: int = 1) -> None:
    target = "" if gateway == GATEWAY_LISTEN else f" --gateway {gateway}"
    metrics = ("" if metrics_base_port is None else
               f"\n  metrics:   http://127.0.0.1:{metrics_base_port + 1}..{metrics_base_port + 4 + gateway_workers}"
               "/metrics (commitlog, indexer, query, gateway workers, scheduler)")
    workers = "" if gateway_workers == 1 else f" ({gateway_workers} workers)"
    mqstore, grpcurl = _command("mqstore"), _command("grpcurl")
    print(f"""
mqstore is up. Gateway: {gateway}{workers} (store {root.resolve()}){metrics}
  try:      {mqstore} send{target} --topic demo "hello, mqstore"
            {mqstore} pull{target} --topic demo
            {grpcurl} -plaintext {gateway} list
  Ctrl-C stops every service cleanly.
""", flush=True)


def _command(name: str) -> str:
    """``name`` when the shell finds it, else its absolute path in this virtualenv: a path relative to
    this process's directory is wrong in the user's shell whenever the two differ (``make -C repo run``)."""
    if shutil.which(name):
        return name
    beside = Path(sys.executable).parent / name
    return str(beside.absolute()) if beside.exists() else name
