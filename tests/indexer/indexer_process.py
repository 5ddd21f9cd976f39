"""A real ``mqstore indexer`` process for tests, following a real commitlog service."""

from __future__ import annotations

import itertools
import os
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

from mqstore.v1 import indexer_pb2, indexer_pb2_grpc

from tests.commitlog.commitlog_process import ServiceProcess, free_port, spawn_service

_log_counter = itertools.count()


class IndexerProcess(ServiceProcess):
    """The indexer: ``.stub`` is an IndexerService stub."""

    service_name = "mqstore.v1.IndexerService"

    def __init__(self, store_dir: Path, port: int, proc: subprocess.Popen[bytes], log_path: Path) -> None:
        super().__init__(store_dir, port, proc, log_path)
        self.stub = indexer_pb2_grpc.IndexerServiceStub(self.channel)

    def status(self) -> indexer_pb2.DispatchStatus:
        return self.stub.GetDispatchStatus(indexer_pb2.GetDispatchStatusRequest(), timeout=5)

    def wait_caught_up(self, commitlog_max_offset: int, timeout_s: float = 60.0) -> indexer_pb2.DispatchStatus:
        """Block until the reput offset reaches ``commitlog_max_offset``."""
        deadline = time.monotonic() + timeout_s
        while True:
            status = self.status()
            if status.reput_offset >= commitlog_max_offset:
                return status
            if time.monotonic() > deadline:
                raise TimeoutError(f"indexer stuck at {status.reput_offset} < {commitlog_max_offset}:\n{self.logs()}")
            time.sleep(0.05)


def start_indexer(store_dir: Path, commitlog_address: str, env_overrides: Mapping[str, str] | None = None,
                  timeout_s: float = 30.0) -> IndexerProcess:
    store_dir = Path(store_dir)
    store_dir.parent.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log_path = store_dir.parent / f"{store_dir.name}-indexer-{os.getpid()}-{next(_log_counter)}.log"
    args = ["indexer", "--store", str(store_dir), "--listen", f"127.0.0.1:{port}", "--commitlog", commitlog_address]
    handle = IndexerProcess(store_dir, port, spawn_service(args, env_overrides, log_path), log_path)
    try:
        handle.wait_serving(timeout_s)
    except BaseException:
        handle.kill9()
        raise
    return handle
