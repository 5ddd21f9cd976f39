"""A real ``mqstore serve query`` process for tests, and a whole system (commitlog + indexer + query)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from mqstore.v1 import commitlog_pb2, common_pb2, query_pb2_grpc
from tests.commitlog.commitlog_process import (
    CommitLogProcess,
    ServiceProcess,
    start_commitlog,
    start_service_process,
)
from tests.indexer.indexer_process import IndexerProcess, start_indexer

#: A short persist interval so offset tests do not wait 5 s.
PERSIST_INTERVAL_MS = 200
#: Where the query service of a System reads data from: "files" (the default, as ``mqstore up``) or
#: "grpc"; MQSTORE_TEST_QUERY_READ_FROM=grpc runs the query tests against the gRPC data path.
DEFAULT_READ_FROM = os.environ.get("MQSTORE_TEST_QUERY_READ_FROM", "files")


def read_args(root: Path, read_from: str) -> tuple[str, ...]:
    """The query service's flags for a System on ``root`` reading ``read_from``."""
    if read_from == "files":
        return ("--store-root", str(root / "broker"), "--indexer-store", str(root / "indexer"))
    return ("--read-from", "grpc")


class QueryProcess(ServiceProcess):
    """The query service: ``.stub`` is a QueryService stub."""

    service_name = "mqstore.v1.QueryService"

    def __init__(self, store_dir: Path, port: int, proc: subprocess.Popen[bytes], log_path: Path) -> None:
        super().__init__(store_dir, port, proc, log_path)
        self.stub = query_pb2_grpc.QueryServiceStub(self.channel)


def start_query(store_dir: Path, commitlog_address: str, indexer_address: str,
                env_overrides: Mapping[str, str] | None = None, extra_args: Sequence[str] = (),
                port: int | None = None, timeout_s: float = 30.0) -> QueryProcess:
    args = ["--commitlog", commitlog_address, "--indexer", indexer_address,
            "--persist-interval-ms", str(PERSIST_INTERVAL_MS), *extra_args]
    return start_service_process(QueryProcess, "query", store_dir, args, env_overrides, timeout_s, port)


@dataclass
class System:
    """The three services on one temporary root, started in dependency order."""

    commitlog: CommitLogProcess
    indexer: IndexerProcess
    query: QueryProcess
    root: Path
    env: Mapping[str, str] | None = None
    read_from: str = DEFAULT_READ_FROM

    @classmethod
    def start(cls, root: Path, env: Mapping[str, str] | None = None, read_from: str = DEFAULT_READ_FROM) -> System:
        commitlog = start_commitlog(root / "broker", env)
        try:
            indexer = start_indexer(root / "indexer", commitlog.address, env)
            try:
                query = start_query(root / "query", commitlog.address, indexer.address, env,
                                    extra_args=read_args(root, read_from))
            except BaseException:
                indexer.kill9()
                raise
        except BaseException:
            commitlog.kill9()
            raise
        return cls(commitlog, indexer, query, root, env, read_from)

    def append(self, messages: Sequence[common_pb2.Message]) -> list[commitlog_pb2.AppendResult]:
        """Append and wait until the indexer has dispatched them."""
        results = list(self.commitlog.stub.AppendBatch(commitlog_pb2.AppendBatchRequest(messages=messages),
                                                       timeout=10).results)
        self.wait_dispatched()
        return results

    def wait_dispatched(self) -> None:
        info = self.commitlog.stub.GetStoreInfo(commitlog_pb2.GetStoreInfoRequest(), timeout=5)
        self.indexer.wait_caught_up(info.max_offset)

    def stop(self) -> None:
        """Readers first, each must stop cleanly (exit 0)."""
        codes = {}
        for name, handle in (("query", self.query), ("indexer", self.indexer), ("commitlog", self.commitlog)):
            if handle.running:
                codes[name] = handle.stop()
        bad = {name: code for name, code in codes.items() if code != 0}
        assert not bad, f"unclean stops {bad}"

    def restart_query(self, kill: bool = False, extra_args: Sequence[str] = ()) -> QueryProcess:
        """Stop the query service (SIGTERM, or SIGKILL with ``kill``) and start it again on its store and port."""
        old = self.query
        if kill:
            old.kill9()
        else:
            assert old.stop() == 0, old.logs()
        self.query = start_query(old.store_dir, self.commitlog.address, self.indexer.address, self.env,
                                 extra_args=[*read_args(self.root, self.read_from), *extra_args], port=old.port)
        return self.query

    def restart_indexer(self) -> IndexerProcess:
        """Stop the indexer cleanly and start it again on its store and port (the query service keeps its address)."""
        old = self.indexer
        assert old.stop() == 0, old.logs()
        self.indexer = start_service_process(IndexerProcess, "indexer", old.store_dir,
                                             ["--commitlog", self.commitlog.address], self.env, port=old.port)
        return self.indexer

    def kill_all(self) -> None:
        for handle in (self.query, self.indexer, self.commitlog):
            if handle.running:
                handle.kill9()


@contextlib.contextmanager
def running_system(root: Path, env: Mapping[str, str] | None = None,
                   read_from: str = DEFAULT_READ_FROM) -> Iterator[System]:
    """A system for a fixture: started, yielded, then stopped (each service cleanly; killed if not)."""
    started = System.start(root, env, read_from)
    try:
        yield started
    finally:
        try:
            started.stop()
        finally:
            started.kill_all()


def message(topic: str, queue_id: int, body: bytes = b"x", **properties: str) -> common_pb2.Message:
    return common_pb2.Message(topic=topic, queue_id=queue_id, body=body, properties=properties,
                              born_host="127.0.0.1:50000")


def wait_until(predicate: Callable[[], bool], timeout_s: float = 10.0, interval_s: float = 0.02) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met in time")
        time.sleep(interval_s)
