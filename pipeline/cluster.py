"""A real Spark standalone cluster on loopback, from the installed PySpark distribution: one master and
N workers, each a ``spark-class`` JVM with its own ports (RPC and web UI), work directory and a small
share of cores and memory, stopped by PID. For tests and for trying the pipeline on a cluster by hand::

    python -m pipeline.cluster --workers 2     # prints the master URL; Ctrl-C stops everything

Why not ``sbin/start-all.sh``: those scripts daemonise (the PIDs are in files under ``/tmp``, shared by
every cluster of the user) and need ssh for workers; here each JVM is a child process of ours.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LOOPBACK = "127.0.0.1"
START_TIMEOUT_S = 90.0


def spark_home() -> Path:
    """The PySpark package directory: it is a Spark distribution (bin/spark-class, jars/)."""
    import pyspark

    return Path(pyspark.__file__).parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


@dataclass
class _Daemon:
    name: str
    process: subprocess.Popen[bytes]
    log: Path

    def tail(self, limit: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-limit:]
        except OSError:
            return ""


@dataclass
class StandaloneCluster:
    """Master and workers under ``directory`` (``master.log``, ``worker-N.log``, ``worker-N/`` work dirs)."""

    directory: Path
    workers: int = 2
    worker_cores: int = 1
    worker_memory: str = "1g"
    master_port: int = 0
    master_ui_port: int = 0
    daemons: list[_Daemon] = field(default_factory=list)
    worker_ui_ports: list[int] = field(default_factory=list)

    @property
    def master_url(self) -> str:
        return f"spark://{LOOPBACK}:{self.master_port}"

    @property
    def master_ui(self) -> str:
        return f"http://{LOOPBACK}:{self.master_ui_port}"

    def work_dir(self, worker: int) -> Path:
        return self.directory / f"worker-{worker}"

    def env(self) -> dict[str, str]:
        """What a daemon, and a driver submitting to it, run with: loopback only, quiet logs."""
        from pipeline.session import LOG4J_CONFIG

        env = dict(os.environ)
        env.update({"SPARK_HOME": str(spark_home()), "SPARK_LOCAL_IP": LOOPBACK, "SPARK_LOCAL_HOSTNAME": LOOPBACK,
                    "SPARK_LOG_DIR": str(self.directory), "SPARK_NO_DAEMONIZE": "1",
                    "SPARK_DAEMON_JAVA_OPTS": f"-Dlog4j2.configurationFile=file:{LOG4J_CONFIG}",
                    "PYSPARK_PYTHON": sys.executable})
        return env

    def _spawn(self, name: str, args: list[str]) -> _Daemon:
        log = self.directory / f"{name}.log"
        handle = open(log, "wb")  # noqa: SIM115 (the child owns it)
        try:
            process = subprocess.Popen([str(spark_home() / "bin" / "spark-class"), *args], env=self.env(),
                                       stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       start_new_session=True)
        finally:
            handle.close()
        daemon = _Daemon(name, process, log)
        self.daemons.append(daemon)
        return daemon

    def start(self) -> StandaloneCluster:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.master_port = self.master_port or free_port()
        self.master_ui_port = self.master_ui_port or free_port()
        try:
            self._spawn("master", ["org.apache.spark.deploy.master.Master", "--host", LOOPBACK,
                                   "--port", str(self.master_port), "--webui-port", str(self.master_ui_port)])
            self._wait(lambda: self.master_state() is not None, "the master's web UI")
            for n in range(self.workers):
                ui_port = free_port()
                self.worker_ui_ports.append(ui_port)
                self.work_dir(n).mkdir(exist_ok=True)
                self._spawn(f"worker-{n}", [
                    "org.apache.spark.deploy.worker.Worker", "--host", LOOPBACK, "--port", str(free_port()),
                    "--webui-port", str(ui_port), "--cores", str(self.worker_cores), "--memory", self.worker_memory,
                    "--work-dir", str(self.work_dir(n)), self.master_url])
            self._wait(lambda: len(self.alive_workers()) == self.workers, f"{self.workers} workers to register")
        except BaseException:
            self.stop()
            raise
        return self

    def _wait(self, ready: Any, what: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not ready():
            for daemon in self.daemons:
                if daemon.process.poll() is not None:
                    raise RuntimeError(f"spark {daemon.name} exited with {daemon.process.returncode} while waiting "
                                       f"for {what}:\n{daemon.tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"waited {START_TIMEOUT_S:.0f} s for {what}:\n"
                                   + "\n".join(d.tail(1500) for d in self.daemons))
            time.sleep(0.3)

    def master_state(self) -> dict[str, Any] | None:
        """The master's JSON status (workers, applications), or None while it is not up."""
        try:
            with urllib.request.urlopen(f"{self.master_ui}/json/", timeout=2) as response:
                state: dict[str, Any] = json.load(response)
                return state
        except OSError:
            return None

    def alive_workers(self) -> list[dict[str, Any]]:
        state = self.master_state() or {}
        return [w for w in state.get("workers", []) if w.get("state") == "ALIVE"]

    def stop(self) -> None:
        """SIGTERM every daemon (workers first: they kill their executors), SIGKILL what is left."""
        for daemon in reversed(self.daemons):
            if daemon.process.poll() is None:
                daemon.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 15
        for daemon in reversed(self.daemons):
            try:
                daemon.process.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                daemon.process.kill()
                daemon.process.wait()
        self.daemons.clear()

    def __enter__(self) -> StandaloneCluster:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.cluster", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=Path, default=Path("spark-cluster"), help="logs and work directories")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cores", type=int, default=1, help="cores per worker")
    parser.add_argument("--memory", default="1g", help="memory per worker")
    args = parser.parse_args(argv)
    with StandaloneCluster(args.dir.resolve(), args.workers, args.cores, args.memory) as cluster:
        print(f"master {cluster.master_url} (UI {cluster.master_ui}); Ctrl-C stops it", flush=True)
        try:
            while all(d.process.poll() is None for d in cluster.daemons):
                time.sleep(1)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
