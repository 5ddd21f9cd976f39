"""Helpers for the replication tests: a leader and its followers as real ``mqstore commitlog``
processes on loopback, producers, and the differential check (every follower's files equal the
leader's)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from mqstore.v1 import commitlog_pb2, common_pb2, indexer_pb2
from services.server.service_auth import METADATA_KEY
from tests.commitlog.commitlog_process import CommitLogProcess, StartCommitLog, free_port
from tests.indexer.indexer_process import IndexerProcess, start_indexer

TOKEN = "replication-test-token"
AUTH = ((METADATA_KEY, TOKEN),)
FILE_SIZE = 256 * 1024
BASE_ENV = {
    "MQSTORE_SERVICE_TOKEN": TOKEN,
    "MQSTORE_MAPPED_FILE_SIZE_COMMIT_LOG": str(FILE_SIZE),  # rolls files every few hundred messages
    "MQSTORE_MAPPED_FILE_SIZE_CONSUME_QUEUE": str(20 * 64),  # a CQ file every 64 units
    "MQSTORE_MAX_HASH_SLOT_NUM": "64",
    "MQSTORE_MAX_INDEX_NUM": "400",
    "MQSTORE_HA_SEND_HEARTBEAT_INTERVAL": "500",
    "MQSTORE_HA_TRANSFER_BATCH_SIZE": str(4096),  # frames end inside records
    "MQSTORE_BROKER_NAME": "shard-t",
}


def leader_env(ha_port: int, **extra: str) -> dict[str, str]:
    return {**BASE_ENV, "MQSTORE_BROKER_ROLE": "SYNC_MASTER", "MQSTORE_HA_LISTEN_PORT": str(ha_port),
            "MQSTORE_HA_SEND_TIMEOUT": "10000", **extra}  # generous: a loaded 2-core machine


def follower_env(ha_port: int, **extra: str) -> dict[str, str]:
    return {**BASE_ENV, "MQSTORE_BROKER_ROLE": "SLAVE", "MQSTORE_HA_MASTER_ADDRESS": f"127.0.0.1:{ha_port}",
            **extra}


@dataclass
class Group:
    leader: CommitLogProcess
    followers: list[CommitLogProcess]
    ha_port: int


def start_group(start_commitlog: StartCommitLog, root: Path, followers: int) -> Group:
    ha_port = free_port()
    leader = start_commitlog(root / "leader", leader_env(ha_port))
    group = Group(leader, [], ha_port)
    for i in range(followers):  # the second one flushes before it reports (SYNC_FLUSH)
        flush = {"MQSTORE_FLUSH_DISK_TYPE": "SYNC_FLUSH"} if i == 1 else {}
        group.followers.append(start_commitlog(root / f"follower{i}", follower_env(ha_port, **flush)))
    return group


def message(i: int, producer: int = 0) -> common_pb2.Message:
    return common_pb2.Message(topic="HaTopic", queue_id=(i + producer) % 3, body=b"m%d-%d-" % (producer, i) * 20,
                              properties={"KEYS": f"k{producer}-{i}"})


def append(handle: CommitLogProcess, msg: common_pb2.Message) -> commitlog_pb2.AppendResult:
    return handle.stub.Append(commitlog_pb2.AppendRequest(message=msg), timeout=30, metadata=AUTH)


@dataclass
class Producers:
    """Producer threads sending unary Appends and small AppendBatches until stopped."""

    handle: CommitLogProcess
    count: int = 2
    acked: list[tuple[int, int]] = field(default_factory=list)  # (commitlog offset, size)
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> Producers:
        for p in range(self.count):
            thread = threading.Thread(target=self._run, args=(p,), daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def _run(self, producer: int) -> None:
        i = 0
        while not self._stop.is_set():
            try:
                if i % 2:
                    batch = commitlog_pb2.AppendBatchRequest(messages=[message(i + k, producer) for k in range(8)])
                    results = self.handle.stub.AppendBatch(batch, timeout=30, metadata=AUTH).results
                    self.acked.extend((r.commitlog_offset, r.wrote_bytes) for r in results)
                else:
                    result = append(self.handle, message(i, producer))
                    self.acked.append((result.commitlog_offset, result.wrote_bytes))
            except grpc.RpcError as exc:
                self.errors.append(f"{exc.code().name}: {exc.details()}")
            i += 8

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)


def max_offset(handle: CommitLogProcess) -> int:
    return int(handle.stub.GetStoreInfo(commitlog_pb2.GetStoreInfoRequest(), timeout=10, metadata=AUTH).max_offset)


def wait_caught_up(leader: CommitLogProcess, follower: CommitLogProcess, timeout_s: float = 30.0) -> int:
    target = max_offset(leader)
    deadline = time.monotonic() + timeout_s
    while (reached := max_offset(follower)) < target:
        assert time.monotonic() < deadline, f"follower at {reached}, leader at {target}:\n{follower.logs()[-3000:]}"
        time.sleep(0.05)
    return target


def assert_same_commitlog(leader: Path, follower: Path, upto: int) -> int:
    """The follower's commitlog equals the leader's up to ``upto``, file by file (same names, same
    bytes), from the follower's first file on; returns that file's start."""
    files = sorted((follower / "commitlog").iterdir())
    assert files, f"the follower at {follower} has no commitlog file"
    first = int(files[0].name)
    assert [int(p.name) for p in files if int(p.name) < upto] == list(range(first, upto, FILE_SIZE))
    for path in files:
        start = int(path.name)
        if start >= upto:
            break
        length = min(FILE_SIZE, upto - start)
        ours, theirs = (leader / "commitlog" / path.name).read_bytes()[:length], path.read_bytes()[:length]
        if ours != theirs:
            at = next(i for i in range(length) if ours[i] != theirs[i])
            raise AssertionError(f"the follower's commitlog differs from the leader's at offset {start + at}")
    return first


def logic_files(indexer_store: Path) -> dict[str, bytes]:
    """An indexer's ConsumeQueue files by path, and its index files in order (their names are the
    time each was created, so they are compared by position)."""
    root = next(p.parent for p in indexer_store.rglob("consumequeue") if p.is_dir())
    found = {str(p.relative_to(root)): p.read_bytes() for p in sorted((root / "consumequeue").rglob("*"))
             if p.is_file()}
    for i, path in enumerate(sorted((root / "index").iterdir()) if (root / "index").is_dir() else []):
        found[f"index#{i}"] = path.read_bytes()
    return found


def wait_indexed(indexer: IndexerProcess, end: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    request = indexer_pb2.GetDispatchStatusRequest()
    while indexer.stub.GetDispatchStatus(request, timeout=5, metadata=AUTH).reput_offset < end:
        assert time.monotonic() < deadline, indexer.logs()[-3000:]
        time.sleep(0.05)


def index_replicas(replicas: dict[Path, CommitLogProcess], end: int) -> list[dict[str, bytes]]:
    """Each replica's own indexer (its commitlog service's Tail, into the store given), run until it
    dispatched ``end`` and stopped cleanly: the :func:`logic_files` of each, in order."""
    indexers: list[IndexerProcess] = []
    try:
        for store, handle in replicas.items():
            indexers.append(start_indexer(store, handle.address, {**BASE_ENV, "MQSTORE_INDEXER_REPUT_SOURCE": "tail"}))
        for indexer in indexers:
            wait_indexed(indexer, end)
    finally:
        stop_indexers(indexers)
    return [logic_files(store) for store in replicas]


def stop_indexers(indexers: list[IndexerProcess]) -> None:
    """Stop each cleanly (exit code 0: its files are complete), or kill it if one stop failed."""
    try:
        for indexer in indexers:
            assert indexer.stop() == 0
    finally:
        for indexer in indexers:
            if indexer.running:
                indexer.kill9()
