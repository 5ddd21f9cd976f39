"""The whole system as a newcomer runs it: one ``mqstore up`` process (commitlog, indexer, query and
gateway as its children), on free loopback ports, stopped with SIGTERM like a Ctrl-C.

Kept apart from conftest.py so test modules can import the handle type:
``from tests.gateway.system_process import UpProcess, start_up``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.services import free_port_block
from mqstore.v1 import commitlog_pb2, commitlog_pb2_grpc, gateway_pb2_grpc
from services.runner import is_child_command
from tests.commitlog.commitlog_process import CHANNEL_OPTIONS, commitlog_env, mqstore_command

GATEWAY_SERVICE = "mqstore.v1.MessagingService"


class UpProcess:
    """``mqstore up``: ``.gateway`` (address), ``.channel``, ``.stub`` (MessagingService), ``.addresses``."""

    def __init__(self, store: Path, base_port: int, metrics_base_port: int, proc: subprocess.Popen[bytes],
                 log_path: Path, log_start: int = 0) -> None:
        self.store = store
        self.base_port = base_port
        self.metrics_base_port = metrics_base_port
        self.gateway = f"127.0.0.1:{base_port}"
        self.commitlog = f"127.0.0.1:{base_port + 1}"
        self.indexer = f"127.0.0.1:{base_port + 2}"
        self.query = f"127.0.0.1:{base_port + 3}"
        self.proc = proc
        self.log_path = log_path
        #: Where this start's lines begin: a restart on the same store appends to the same log, whose
        #: earlier "mqstore is up" must not count as this start's.
        self.log_start = log_start
        self.channel = grpc.insecure_channel(self.gateway, options=CHANNEL_OPTIONS)
        self.stub = gateway_pb2_grpc.MessagingServiceStub(self.channel)

    def metrics_url(self, service: str) -> str:
        offset = {"commitlog": 1, "indexer": 2, "query": 3, "gateway": 4}[service]
        return f"http://127.0.0.1:{self.metrics_base_port + offset}/metrics"

    def store_state(self) -> tuple[int, int]:
        """What bad input must not change: the commitlog's end and how many topics it has."""
        with grpc.insecure_channel(self.commitlog, options=CHANNEL_OPTIONS) as channel:
            stub = commitlog_pb2_grpc.CommitLogServiceStub(channel)
            info = stub.GetStoreInfo(commitlog_pb2.GetStoreInfoRequest(), timeout=5)
            topics = stub.ListTopics(commitlog_pb2.ListTopicsRequest(), timeout=5)
        return info.max_offset, len(topics.topics)

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def wait_up(self, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while "mqstore is up" not in self.logs()[self.log_start:]:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mqstore up exited with {self.proc.returncode}:\n{self.logs()[-5000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"mqstore up did not come up in {timeout_s}s:\n{self.logs()[-5000:]}")
            time.sleep(0.1)
        health = health_pb2_grpc.HealthStub(self.channel)
        status = health.Check(health_pb2.HealthCheckRequest(service=GATEWAY_SERVICE), timeout=10,
                              wait_for_ready=True).status
        assert status == health_pb2.HealthCheckResponse.SERVING

    def stop(self, timeout_s: float = 90.0) -> int:
        """SIGTERM to the runner (what Ctrl-C does); it stops its children in order."""
        self.channel.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout_s)

    def kill_all(self) -> None:
        """Last resort at teardown: the runner's children run in their own sessions."""
        if self.proc.poll() is None:
            self.proc.kill()
        for line in self.logs().splitlines():
            if line.startswith("started ") and "(pid " in line:
                pid = int(line.split("(pid ")[1].split(")")[0])
                # Only our own child: after a clean stop its pid may belong to someone else by now.
                with contextlib.suppress(OSError):
                    if is_child_command(Path(f"/proc/{pid}/cmdline").read_bytes()):
                        os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def running_up(store: Path, env_overrides: Mapping[str, str] | None = None,
               extra_args: list[str] | None = None) -> Iterator[UpProcess]:
    """A system for a fixture: started (with ``env_overrides`` settings), yielded, then stopped like a
    Ctrl-C, which must be clean (exit code 0, no abort file)."""
    started = start_up(store, env_overrides, extra_args=extra_args)
    try:
        yield started
        code = started.stop()
        assert code == 0, f"mqstore up exited with {code}:\n{started.logs()[-5000:]}"
        assert not (started.store / "abort").exists(), "a clean stop must leave no abort file"
    finally:
        started.kill_all()


def start_up(store: Path, env_overrides: Mapping[str, str] | None = None, extra_args: list[str] | None = None,
             timeout_s: float = 120.0) -> UpProcess:
    store.parent.mkdir(parents=True, exist_ok=True)
    base_port = free_port_block(5)  # gateway, commitlog, indexer, query, scheduler
    metrics_base_port = free_port_block(7, avoid=range(base_port, base_port + 5))
    log_path = store.parent / f"{store.name}-up.log"
    log_start = len(log_path.read_text(errors="replace")) if log_path.exists() else 0
    with open(log_path, "ab") as log_file:
        proc = subprocess.Popen(
            [*mqstore_command(), "up", "--store", str(store), "--base-port", str(base_port),
             "--metrics-base-port", str(metrics_base_port), *(extra_args or [])],
            env=commitlog_env(env_overrides), stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file)
    handle = UpProcess(store, base_port, metrics_base_port, proc, log_path, log_start)
    try:
        handle.wait_up(timeout_s)
    except BaseException:
        handle.kill_all()
        raise
    return handle
