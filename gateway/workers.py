"""Gateway workers: N gateway processes on one port (``mqstore gateway --workers N``).

One Python process serves gRPC on one core at most (the GIL, and grpc.aio's one event loop). The
gateway keeps nothing that must be shared, so more cores mean more processes: a supervisor (this
module, the process ``mqstore gateway`` started) runs N workers, each a complete gateway (its own
route table, send batcher, queue rotation, token table, health and reflection services), all
listening on the same address with SO_REUSEPORT. The kernel spreads incoming *connections* over the
workers; a connection (a client's channel) stays on its worker for its life.

* Metrics: worker i serves /metrics on ``MQSTORE_METRICS_PORT + i`` (each its own counters; Prometheus
  scrapes every port and sums). The supervisor has no endpoint of its own.
* Stop: SIGTERM or SIGINT to the supervisor stops every worker cleanly (each drains its RPCs), then
  the supervisor exits 0 (1 if a worker did not stop cleanly). Workers run in their own sessions, so a
  Ctrl-C reaches the supervisor alone, and they get SIGTERM if the supervisor dies (PR_SET_PDEATHSIG).
* SIGHUP to the supervisor is passed on to every worker: each reloads its token file
  (gateway/token_reload.py).
* A worker that dies (kill -9, a crash) is restarted at once and its clients reconnect (to any
  worker); connections still waiting in its accept queue are reset, as with any listener that dies. A
  worker that exits with code 2 (bad settings, port taken) stops the group with code 2: a restart
  would fail the same way. More than ``MAX_RESTARTS`` deaths within ``RESTART_WINDOW_S`` stop the
  group with code 1 (something is wrong that restarts do not fix).
* SO_REUSEPORT would also let an unrelated second gateway join the port silently, so the supervisor
  first binds the address without it and refuses to start (exit 2) when anything listens there.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from types import FrameType

from gateway.settings import GatewayOptions, GatewaySettings
from services.server.metrics import METRICS_PORT_ENV
from services.server.process import exit_reason
from services.store.config import ConfigError

log = logging.getLogger("gateway.workers")

WORKERS_ENV = "MQSTORE_GATEWAY_WORKERS"
# Set by the supervisor for each worker: "index/count". Its presence makes a process a worker.
WORKER_ENV = "MQSTORE_GATEWAY_WORKER"
EXIT_BAD_SETTINGS = 2
STOP_TIMEOUT_S = 30.0
MAX_RESTARTS = 5
RESTART_WINDOW_S = 60.0
_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True, slots=True)
class WorkerIdentity:
    """Which worker of how many this process is."""

    index: int
    count: int

    @classmethod
    def from_env(cls) -> WorkerIdentity | None:
        """The identity the supervisor gave this process; None for a gateway that is not a worker."""
        text = os.environ.get(WORKER_ENV, "").strip()
        if not text:
            return None
        index, _, count = text.partition("/")
        try:
            identity = cls(int(index), int(count))
        except ValueError:
            raise ConfigError(f"{WORKER_ENV}={text!r}: expected index/count, e.g. 0/2") from None
        if not 0 <= identity.index < identity.count:
            raise ConfigError(f"{WORKER_ENV}={text!r}: the index must be within 0..count-1")
        return identity


def workers_from_env() -> int | None:
    """MQSTORE_GATEWAY_WORKERS as a number, None when unset or empty."""
    text = os.environ.get(WORKERS_ENV, "").strip()
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"{WORKERS_ENV}={text!r} is not a number of workers") from None


def ensure_port_free(listen: str) -> None:
    """Raise ConfigError unless ``listen`` can be bound by a socket without SO_REUSEPORT, i.e. nothing
    (no other gateway group either) listens there. The workers bind it right after, with SO_REUSEPORT."""
    host, _, port_text = listen.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    try:
        port = int(port_text)
    except ValueError:
        raise ConfigError(f"listen {listen!r}: expected host:port") from None
    if port == 0:
        raise ConfigError(f"listen {listen!r}: workers share one port, so give a fixed port (not 0)")
    try:
        addresses = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ConfigError(f"cannot listen on {listen}: {exc}") from None
    for family, kind, proto, _, address in addresses:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC does: TIME_WAIT is fine
            try:
                probe.bind(address)
            except OSError as exc:
                raise ConfigError(f"cannot listen on {listen}: {exc.strerror} (is another gateway or program "
                                  "listening there?)") from None


def worker_args(options: GatewayOptions, settings: GatewaySettings) -> list[str]:
    """The ``mqstore gateway`` arguments of one worker: the supervisor's own options, one worker each,
    on the address the settings resolved."""
    args = ["--listen", settings.listen, "--workers", "1"]
    for flag, value in (("--config", options.config_file), ("--auth-file", options.auth_file),
                        ("--queue-selection", options.queue_selection),
                        ("--default-topic-queue-nums", options.default_topic_queue_nums),
                        ("--tls-cert", options.tls_cert), ("--tls-key", options.tls_key),
                        ("--tls-client-ca", options.tls_client_ca)):
        if value is not None:
            args += [flag, str(value)]
    if options.shard is not None:
        args += ["--commitlog", options.shard[0], "--query", options.shard[1]]
    return args


def _die_with_parent(parent: int) -> None:
    """In the child before exec: SIGTERM when the supervisor dies, so no worker outlives its group."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # not Linux: the supervisor's clean stop still stops them
        return
    if os.getppid() != parent:  # the supervisor died before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)


@dataclass
class _Worker:
    index: int
    proc: subprocess.Popen[bytes] | None = None
    deaths: deque[float] = field(default_factory=deque)


class WorkerGroup:
    """The supervisor: starts ``count`` workers, restarts one that dies, stops them all on a signal."""

    def __init__(self, args: list[str], count: int, metrics_port: int | None) -> None:
        self.args = args
        self.count = count
        self.metrics_port = metrics_port
        self.workers = [_Worker(i) for i in range(count)]
        self._stop_requested = False

    def _request_stop(self, signum: int, frame: FrameType | None) -> None:
        self._stop_requested = True

    def _forward_reload(self, signum: int, frame: FrameType | None) -> None:
        """SIGHUP to the supervisor reloads every worker's token file (each holds its own table)."""
        for worker in self.workers:
            if worker.proc is not None and worker.proc.poll() is None:
                worker.proc.send_signal(signal.SIGHUP)

    def _start(self, worker: _Worker) -> None:
        env = dict(os.environ)
        env[WORKER_ENV] = f"{worker.index}/{self.count}"
        env.pop(WORKERS_ENV, None)
        if self.metrics_port is not None:
            env[METRICS_PORT_ENV] = str(self.metrics_port + worker.index if self.metrics_port else 0)
        parent = os.getpid()
        worker.proc = subprocess.Popen([sys.executable, "-m", "gateway", *self.args], env=env,
                                       start_new_session=True, preexec_fn=lambda: _die_with_parent(parent))
        log.info("gateway worker %d/%d started (pid %d)", worker.index, self.count, worker.proc.pid,
                 extra={"worker": worker.index, "pid": worker.proc.pid})

    def run(self) -> int:
        """Supervise until a signal (exit 0 after a clean stop) or a failure that restarts cannot fix."""
        signal.signal(signal.SIGTERM, self._request_stop)
        signal.signal(signal.SIGINT, self._request_stop)
        signal.signal(signal.SIGHUP, self._forward_reload)
        for worker in self.workers:
            self._start(worker)
        exit_code = 0
        while not self._stop_requested and exit_code == 0:
            time.sleep(0.1)
            for worker in self.workers:
                if self._stop_requested:
                    break
                exit_code = self._check(worker)
                if exit_code:
                    break
        stopped = self._stop_all()
        return exit_code or stopped

    def _check(self, worker: _Worker) -> int:
        """Restart ``worker`` if it died; the group's exit code when it must stop instead (else 0)."""
        assert worker.proc is not None
        code = worker.proc.poll()
        if code is None:
            return 0
        how = exit_reason(code)
        if code == EXIT_BAD_SETTINGS:
            log.error("gateway worker %d (pid %d) exited with %s (bad settings or the port is taken): stopping "
                      "the group", worker.index, worker.proc.pid, how)
            return EXIT_BAD_SETTINGS
        now = time.monotonic()
        worker.deaths.append(now)
        while worker.deaths and worker.deaths[0] < now - RESTART_WINDOW_S:
            worker.deaths.popleft()
        if len(worker.deaths) > MAX_RESTARTS:
            log.error("gateway worker %d died %d times within %.0f s (last: %s): stopping the group",
                      worker.index, len(worker.deaths), RESTART_WINDOW_S, how)
            return 1
        log.error("gateway worker %d (pid %d) exited with %s: restarting it", worker.index, worker.proc.pid, how,
                  extra={"worker": worker.index, "pid": worker.proc.pid})
        self._start(worker)
        return 0

    def _stop_all(self) -> int:
        """SIGTERM to every live worker, then wait; 0 when every worker stopped cleanly, else 1."""
        running = [w.proc for w in self.workers if w.proc is not None and w.proc.poll() is None]
        for proc in running:
            proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        exit_code = 0
        for proc in running:
            try:
                code = proc.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                log.error("gateway worker pid %d did not stop within %.0f s: killing it", proc.pid, STOP_TIMEOUT_S)
                proc.kill()
                code = proc.wait()
            if code != 0:
                exit_code = 1
        log.info("gateway workers stopped%s", "" if exit_code == 0 else " (not every one cleanly)")
        return exit_code


def supervise(options: GatewayOptions, settings: GatewaySettings, count: int, metrics_port: int | None) -> int:
    """Run ``count`` workers of the gateway ``options`` describe; returns the group's exit code."""
    try:
        ensure_port_free(settings.listen)
    except ConfigError as exc:
        log.error("bad settings: %s", exc)
        return EXIT_BAD_SETTINGS
    log.info("gateway: %d workers on %s (SO_REUSEPORT)%s", count, settings.listen,
             "" if metrics_port is None else f"; metrics on ports {metrics_port}..{metrics_port + count - 1}",
             extra={"listen": settings.listen, "workers": count})
    return WorkerGroup(worker_args(options, settings), count, metrics_port).run()
