"""mqstore services as child processes of a benchmark, on loopback, stopped by PID."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.workload import REPO


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port_block(count: int, avoid: Sequence[int] = ()) -> int:
    """The first of ``count`` consecutive free loopback ports, below the ephemeral range (``mqstore up``
    takes a base port and uses the next ones, so the OS cannot pick them for us)."""
    for _ in range(500):
        base = random.randrange(20_000, 32_000 - count)
        ports = range(base, base + count)
        if not set(ports) & set(avoid) and all(_port_free(p) for p in ports):
            return base
    raise RuntimeError(f"no block of {count} free loopback ports found")


def mqstore_command() -> str:
    beside = Path(sys.executable).parent / "mqstore"
    return str(beside if beside.exists() else REPO / ".venv" / "bin" / "mqstore")


class Service:
    """One ``mqstore`` service as a child process, stopped by SIGTERM to its PID."""

    def __init__(self, name: str, args: list[str], log_path: Path, env: dict[str, str], health_name: str) -> None:
        self.name = name
        self.target = args[args.index("--listen") + 1]
        self.health_name = health_name
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.log_path = log_path
        self.proc = subprocess.Popen([mqstore_command(), "serve", name, *args], env=env, cwd=REPO, stdout=self._log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_serving(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        with grpc.insecure_channel(self.target) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"{self.name} exited with {self.proc.returncode}; see {self.log_path}")
                try:
                    reply = health.Check(health_pb2.HealthCheckRequest(service=self.health_name), timeout=1.0)
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        return
                except grpc.RpcError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{self.name} was not SERVING after {timeout_s:.0f}s; see {self.log_path}")
                time.sleep(0.1)

    def stop(self) -> int:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._log.close()
        return int(self.proc.returncode)


