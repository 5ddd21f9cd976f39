"""Private Redis and NATS servers for the peer harness: installed when missing, started on free
loopback ports with their own data directories and configs, stopped by PID.

A system instance (a ``redis-server`` or ``nats-server`` service the machine runs) is never touched:
the harness starts its own processes from the same binaries, with a config it writes under the run's
scratch directory (``.bench-tmp/peers-*``), and stops exactly those PIDs (SIGTERM, then SIGKILL).
Redis gets ``appendonly yes`` (``appendfsync everysec`` for the async rows, ``always`` for the durable
row) and no RDB saves; NATS gets JetStream (``-js``) with a store dir, streams on file storage.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from bench.report import progress
from bench.services import free_port
from bench.workload import REPO

REQUIREMENTS = REPO / "bench" / "requirements-peers.txt"
APT_PACKAGES = {"redis-server": "redis-server", "nats-server": "nats-server"}


def ensure_installed(apt: bool = True) -> None:
    """The servers (Debian's packages, when their binary is absent) and the Python clients (pinned in
    bench/requirements-peers.txt, into this interpreter's environment: the project's .venv)."""
    missing = [pkg for binary, pkg in APT_PACKAGES.items() if server_binary(binary) is None]
    if missing:
        if not apt:
            raise SystemExit(f"missing {', '.join(missing)}: install them (apt-get install {' '.join(missing)})")
        progress(f"installing {', '.join(missing)} with apt-get ...")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
        subprocess.run(["apt-get", "install", "-y", "-qq", *missing], check=True, env=env, stdout=subprocess.DEVNULL)
    try:
        import hiredis  # noqa: F401
        import nats  # noqa: F401
        import redis  # noqa: F401
    except ImportError:
        progress(f"installing the peers' Python clients ({REQUIREMENTS.name}) ...")
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                        "-r", str(REQUIREMENTS)], check=True)


def server_binary(name: str) -> str | None:
    """The binary on PATH, or where Debian puts it (/usr/sbin is not on every PATH)."""
    found = shutil.which(name)
    if found:
        return found
    for directory in ("/usr/bin", "/usr/sbin", "/usr/local/bin"):
        if os.access(path := f"{directory}/{name}", os.X_OK):
            return path
    return None


def server_version(name: str) -> str:
    binary = server_binary(name)
    if binary is None:
        return "?"
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10)
    return (out.stdout or out.stderr).strip().splitlines()[0] if (out.stdout or out.stderr) else "?"


class PeerServer:
    """One server process of ours: started by :meth:`start`, stopped (by its PID) by :meth:`stop`."""

    name = "peer"

    def __init__(self, root: Path) -> None:
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.target = f"127.0.0.1:{self.port}"
        self.log_path = root / "server.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        raise NotImplementedError

    def start(self, timeout_s: float = 30.0) -> PeerServer:
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(self.command(), cwd=self.root, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while not self._accepts():
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{self.name} did not listen on {self.target} in {timeout_s:.0f}s")
            time.sleep(0.05)
        return self

    def _accepts(self) -> bool:
        with socket.socket() as sock:
            sock.settimeout(0.2)
            return sock.connect_ex(("127.0.0.1", self.port)) == 0

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc is not None else 0

    def log_tail(self, lines: int = 20) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout_s: float = 30.0) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def __enter__(self) -> PeerServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class RedisServer(PeerServer):
    """``redis-server`` with an AOF (``appendfsync`` as given) and no RDB snapshots."""

    name = "redis-server"

    def __init__(self, root: Path, appendfsync: str = "everysec") -> None:
        if appendfsync not in ("everysec", "always"):
            raise ValueError(f"appendfsync {appendfsync!r}: use everysec or always")
        super().__init__(root)
        self.appendfsync = appendfsync
        self.config = root / "redis.conf"
        self.config.write_text("\n".join([
            "bind 127.0.0.1", f"port {self.port}", "protected-mode yes", "daemonize no", "supervised no",
            f'dir "{root}"', 'logfile ""', "databases 1", 'save ""', "appendonly yes",
            f"appendfsync {appendfsync}", "no-appendfsync-on-rewrite no", "auto-aof-rewrite-percentage 0",
            "maxmemory 0", "io-threads 1", "",
        ]))

    def command(self) -> list[str]:
        return [server_binary("redis-server") or "redis-server", str(self.config)]


class NatsServer(PeerServer):
    """``nats-server`` with JetStream on file storage in its own store dir."""

    name = "nats-server"

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.config = root / "nats.conf"
        store = root / "jetstream"
        self.config.write_text("\n".join([
            f"listen: 127.0.0.1:{self.port}", "max_payload: 8MB",
            "jetstream {", f'  store_dir: "{store}"', "  max_memory_store: 1GB", "  max_file_store: 64GB", "}", "",
        ]))

    def command(self) -> list[str]:
        return [server_binary("nats-server") or "nats-server", "-c", str(self.config), "-js"]


class FloorServer(PeerServer):
    """The bare grpc.aio echo (bench/peer_floor.py) in a process of its own, on this interpreter."""

    name = "grpc.aio echo"

    def command(self) -> list[str]:
        return [sys.executable, "-m", "bench.peer_floor", "--port", str(self.port)]
