"""A real ``mqstore indexer`` process for tests, following a real commitlog service."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

from mqstore.v1 import indexer_pb2, indexer_pb2_grpc
from tests.commitlog.commitlog_process import ServiceProcess, start_service_process


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
    return start_service_process(IndexerProcess, "indexer", store_dir, ["--commitlog", commitlog_address],
                                 env_overrides, timeout_s)
