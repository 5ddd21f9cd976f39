"""``mqstore run``: every service of the system as child processes on 127.0.0.1, one store root.

Layout under the store root: the commitlog service owns the root itself (``commitlog/``,
``checkpoint``, ``config/``...), the indexer owns ``indexer/``, the query service ``query/``. A
signal stops the services in reverse start order (readers before the writer), each cleanly.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from services.query import DEFAULT_LISTEN as QUERY_LISTEN
from services.store.config import load_config

log = logging.getLogger("services.runner")
STOP_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class ChildSpec:
    name: str
    args: list[str]


def child_specs(store: Path, config_file: str | None) -> list[ChildSpec]:
    config = load_config(config_file)
    extra = ["--config", config_file] if config_file else []
    return [
        ChildSpec("commitlog", ["commitlog", "--store", str(store), "--listen", config.commitlog_listen, *extra]),
        ChildSpec("indexer", ["indexer", "--store", str(store / "indexer"), "--listen", config.indexer_listen,
                              "--commitlog", config.commitlog_listen, *extra]),
        ChildSpec("query", ["query", "--store", str(store / "query"), "--listen", QUERY_LISTEN,
                            "--commitlog", config.commitlog_listen, "--indexer", config.indexer_listen, *extra]),
    ]


def run(store: str, config_file: str | None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    root = Path(store)
    root.mkdir(parents=True, exist_ok=True)
    children: list[tuple[ChildSpec, subprocess.Popen[bytes]]] = []
    stop_requested = False

    def request_stop(signum: int, frame: FrameType | None) -> None:
        nonlocal stop_requested
        stop_requested = True

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    for spec in child_specs(root, config_file):
        # Own session: a Ctrl-C on the terminal reaches only the runner, which then stops each child
        # once, in order (a second signal would make a child skip its clean shutdown).
        proc = subprocess.Popen([sys.executable, "-m", "services.cli", *spec.args], start_new_session=True)
        children.append((spec, proc))
        log.info("started %s (pid %d)", spec.name, proc.pid)
    exit_code = 0
    while not stop_requested:
        for spec, proc in children:
            if proc.poll() is not None:
                log.error("%s exited with code %d: stopping the system", spec.name, proc.returncode)
                stop_requested = True
                exit_code = 1
        time.sleep(0.2)
    for spec, proc in reversed(children):
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                code = proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                log.error("%s did not stop within %.0fs: killing it", spec.name, STOP_TIMEOUT_S)
                proc.kill()
                code = proc.wait()
            log.info("%s stopped (exit code %d)", spec.name, code)
            exit_code = exit_code or code
    return exit_code
