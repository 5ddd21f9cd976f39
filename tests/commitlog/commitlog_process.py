"""A real ``mqstore commitlog`` process for tests: start it, talk to it, stop it cleanly or kill it.

Kept apart from conftest.py so test modules (and crash tests) can import the handle type:
``from tests.commitlog.commitlog_process import CommitLogProcess, start_commitlog``.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from mqstore.v1 import commitlog_pb2_grpc

SERVICE_NAME = "mqstore.v1.CommitLogService"
MIB = 1024 * 1024
#: Small files so a few MiB of appends roll files; a small maxMessageSize so "too big" is cheap to send.
DEFAULT_ENV = {
    "MQSTORE_MAPPED_FILE_SIZE_COMMIT_LOG": str(1 * MIB),
    "MQSTORE_MAX_MESSAGE_SIZE": str(64 * 1024),
    "MQSTORE_LOG_LEVEL": "INFO",
}
CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 256 * MIB),
    ("grpc.max_send_message_length", 256 * MIB),
    # Subchannels are shared process-wide by default: a failed connect to a port (a stopped server) would
    # then make the next server on that port wait out the old reconnect backoff.
    ("grpc.use_local_subchannel_pool", 1),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]
_log_counter = itertools.count()


def free_port() -> int:
    """A loopback port nobody listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def mqstore_command() -> list[str]:
    """The ``mqstore`` console script of the running virtualenv, or ``python -m services.cli``."""
    script = Path(sys.executable).with_name("mqstore")
    return [str(script)] if script.exists() else [sys.executable, "-m", "services.cli"]


def run_mqstore(*args: str | Path) -> subprocess.CompletedProcess[bytes]:
    """``mqstore ARGS...`` to completion, output captured; UTF-8 output whatever the locale."""
    env = {**os.environ, "LC_ALL": "C", "PYTHONIOENCODING": ""}
    return subprocess.run([*mqstore_command(), *map(str, args)], capture_output=True, timeout=60, env=env,
                          check=False)


def commitlog_env(env_overrides: Mapping[str, str] | None = None) -> dict[str, str]:
    """The caller's environment without any MQSTORE_* setting, then DEFAULT_ENV, then the overrides."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MQSTORE_")}
    env.update(DEFAULT_ENV)
    env.update(env_overrides or {})
    return env


def spawn_service(args: list[str], env_overrides: Mapping[str, str] | None,
                  log_path: Path) -> subprocess.Popen[bytes]:
    """Start ``mqstore ARGS...`` without waiting for it; stderr (JSON log lines) goes to ``log_path``."""
    with open(log_path, "ab") as log_file:
        return subprocess.Popen([*mqstore_command(), *args], env=commitlog_env(env_overrides),
                                stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file)


class ServiceProcess:
    """One running mqstore service process: ``.channel``, ``.health``, ``.pid``, ``.port``."""

    service_name = SERVICE_NAME

    def __init__(self, store_dir: Path, port: int, proc: subprocess.Popen[bytes], log_path: Path) -> None:
        self.store_dir = store_dir
        self.port = port
        self.address = f"127.0.0.1:{port}"
        self.proc = proc
        self.log_path = log_path
        self.channel = grpc.insecure_channel(self.address, options=CHANNEL_OPTIONS)
        self.health = health_pb2_grpc.HealthStub(self.channel)

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def running(self) -> bool:
        return self.proc.poll() is None

    def wait_serving(self, timeout_s: float = 30.0) -> None:
        """Block until the health service says SERVING for this service.

        Connects only once the process has logged that it listens: a refused first connect would
        put the channel into reconnect backoff and cost seconds.
        """
        deadline = time.monotonic() + timeout_s
        while not any("listen" in r for r in self.log_records()):
            if not self.running:
                raise RuntimeError(f"{self.service_name} exited with code {self.proc.returncode}:\n{self.logs()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.service_name} on {self.address} did not listen in {timeout_s}s:\n"
                                   f"{self.logs()}")
            time.sleep(0.02)
        request = health_pb2.HealthCheckRequest(service=self.service_name)
        response = self.health.Check(request, timeout=max(deadline - time.monotonic(), 1.0), wait_for_ready=True)
        if response.status != health_pb2.HealthCheckResponse.SERVING:
            raise RuntimeError(f"{self.service_name} on {self.address} is {response.status}, not SERVING:\n"
                               f"{self.logs()}")

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM and wait: a clean stop. Returns the exit code (0 expected).

        The channel is closed first: the server's graceful GOAWAY waits for a PING ack that an idle
        sync channel never sends, which would add ~5 s. To watch open calls end, send SIGTERM with
        ``proc.send_signal`` and read them before calling this.
        """
        self.channel.close()
        if self.running:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout_s)

    def kill9(self) -> None:
        """SIGKILL: a crash as far as the store is concerned (the abort file stays)."""
        self.channel.close()
        if self.running:
            self.proc.kill()
        self.proc.wait(30)

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_records(self) -> list[dict[str, Any]]:
        """The JSON log lines (other lines, e.g. a native crash message, are skipped)."""
        records = []
        for line in self.logs().splitlines():
            try:
                records.append(json.loads(line))
            except ValueError:
                continue
        return records


class CommitLogProcess(ServiceProcess):
    """The commitlog service: ``.stub`` is a CommitLogService stub."""

    def __init__(self, store_dir: Path, port: int, proc: subprocess.Popen[bytes], log_path: Path) -> None:
        super().__init__(store_dir, port, proc, log_path)
        self.stub = commitlog_pb2_grpc.CommitLogServiceStub(self.channel)


def start_commitlog(store_dir: Path, env_overrides: Mapping[str, str] | None = None,
                    timeout_s: float = 30.0, port: int | None = None) -> CommitLogProcess:
    """Start ``mqstore commitlog`` on ``store_dir`` and a free loopback port; return once SERVING."""
    return start_service_process(CommitLogProcess, "commitlog", store_dir, [], env_overrides, timeout_s, port)


Handle = TypeVar("Handle", bound=ServiceProcess)


def start_service_process(kind: type[Handle], service: str, store_dir: Path, extra_args: Sequence[str],
                          env_overrides: Mapping[str, str] | None, timeout_s: float = 30.0,
                          port: int | None = None) -> Handle:
    """Start ``mqstore serve SERVICE --store STORE_DIR --listen 127.0.0.1:PORT EXTRA_ARGS...`` (a free port
    unless given) and return its handle once SERVING; a process that does not get there is killed."""
    store_dir = Path(store_dir)
    store_dir.parent.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    log_path = store_dir.parent / f"{store_dir.name}-{service}-{os.getpid()}-{next(_log_counter)}.log"
    args = ["serve", service, "--store", str(store_dir), "--listen", f"127.0.0.1:{port}", *extra_args]
    handle = kind(store_dir, port, spawn_service(args, env_overrides, log_path), log_path)
    try:
        handle.wait_serving(timeout_s)
    except BaseException:
        handle.kill9()
        raise
    return handle


StartCommitLog = Callable[..., CommitLogProcess]


def stop_cleanly(handle: CommitLogProcess) -> None:
    """SIGTERM, then assert what a clean stop guarantees: exit code 0 and no abort file."""
    code = handle.stop()
    assert code == 0, f"commitlog exited with {code}:\n{handle.logs()}"
    assert not (handle.store_dir / "abort").exists(), "a clean stop must remove the abort file"


class Launcher:
    """``start_commitlog`` that remembers its processes, so a fixture can stop them all at teardown."""

    def __init__(self) -> None:
        self.started: list[CommitLogProcess] = []

    def __call__(self, store_dir: Path, env_overrides: Mapping[str, str] | None = None,
                 port: int | None = None) -> CommitLogProcess:
        handle = start_commitlog(Path(store_dir), env_overrides, port=port)
        self.started.append(handle)
        return handle

    def stop_all(self) -> None:
        """Stop every process still running cleanly; assert each stop was clean."""
        errors = []
        for handle in self.started:
            if not handle.running:
                continue
            try:
                stop_cleanly(handle)
            except AssertionError as exc:
                errors.append(str(exc))
            finally:
                if handle.running:
                    handle.kill9()
        assert not errors, "\n".join(errors)
