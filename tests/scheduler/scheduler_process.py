"""A real ``mqstore serve scheduler`` process for tests, next to a real commitlog service and indexer."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from mqstore.v1 import commitlog_pb2, common_pb2, indexer_pb2
from services.store.formats.message import MessageRecord
from services.store.formats.record import decode_record
from tests.commitlog.commitlog_process import CommitLogProcess, ServiceProcess, start_service_process
from tests.indexer.indexer_process import IndexerProcess


class SchedulerProcess(ServiceProcess):
    """The scheduler: only the standard health service (overall status, service name "")."""

    service_name = ""

    def __init__(self, store_dir: Path, port: int, proc: subprocess.Popen[bytes], log_path: Path) -> None:
        super().__init__(store_dir, port, proc, log_path)


def start_scheduler(store_dir: Path, broker_root: Path, indexer_root: Path, commitlog_address: str,
                    indexer_address: str, env: Mapping[str, str] | None, persist_interval_ms: int = 200,
                    extra_args: Sequence[str] = ()) -> SchedulerProcess:
    args = ["--store-root", str(broker_root), "--indexer-store", str(indexer_root), "--commitlog", commitlog_address,
            "--indexer", indexer_address, "--persist-interval-ms", str(persist_interval_ms), *extra_args]
    return start_service_process(SchedulerProcess, "scheduler", store_dir, args, env)


def append(commitlog: CommitLogProcess, indexer: IndexerProcess,
           messages: Sequence[common_pb2.Message]) -> list[commitlog_pb2.AppendResult]:
    """Append, then wait until the indexer has dispatched the messages (their units are readable)."""
    response = commitlog.stub.AppendBatch(commitlog_pb2.AppendBatchRequest(messages=messages), timeout=10)
    info = commitlog.stub.GetStoreInfo(commitlog_pb2.GetStoreInfoRequest(), timeout=5)
    indexer.wait_caught_up(info.max_offset)
    return list(response.results)


def queue_records(commitlog: CommitLogProcess, indexer: IndexerProcess, topic: str,
                  queue_id: int) -> list[tuple[indexer_pb2.QueueUnit, MessageRecord]]:
    """Every (unit, record) of a queue the indexer has dispatched."""
    found: list[tuple[indexer_pb2.QueueUnit, MessageRecord]] = []
    offset = 0
    while True:
        try:
            response = indexer.stub.GetQueueEntries(indexer_pb2.GetQueueEntriesRequest(
                topic=topic, queue_id=queue_id, from_offset=offset, max_count=1024), timeout=5)
        except Exception as exc:  # a queue not yet created: NOT_FOUND
            if "NOT_FOUND" in str(getattr(exc, "code", lambda: "")()):
                return found
            raise
        if not response.units:
            return found
        for unit in response.units:
            data = commitlog.stub.Read(commitlog_pb2.ReadRequest(offset=unit.commitlog_offset, size=unit.size),
                                       timeout=5).data
            found.append((unit, decode_record(data)))
        offset = response.units[-1].queue_offset + 1


def wait_for_records(commitlog: CommitLogProcess, indexer: IndexerProcess, topic: str, queue_id: int, count: int,
                     timeout_s: float) -> list[tuple[indexer_pb2.QueueUnit, MessageRecord]]:
    deadline = time.monotonic() + timeout_s
    while True:
        found = queue_records(commitlog, indexer, topic, queue_id)
        if len(found) >= count or time.monotonic() > deadline:
            return found
        time.sleep(0.05)
