"""Commitlog files deleted before fileReservedTime because the disk is full.

Real processes on a real small filesystem (tmpfs, else an ext4 loop file): the commitlog service owns
the mount, the indexer and the query service sit at ``<root>/indexer`` and ``<root>/query`` as under
``mqstore up`` (symlinked off the mount, so only commitlog files and a ballast file fill it). The disk
is filled past diskSpaceCleanForciblyRatio (0.85) but below diskSpaceWarningLevelRatio (0.90):

* by default (protectUnconsumedData true) the files stay, every acknowledged message stays readable,
  and sends are RESOURCE_EXHAUSTED naming the disk and the groups, until space is freed or the groups
  commit past the data;
* with protectUnconsumedData false (RocketMQ's behaviour) the oldest files go although their 72 h are
  not over, each with a WARNING naming it, its offsets and the groups whose unconsumed messages it
  held, and counted.
"""

from __future__ import annotations

import contextlib
import os
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.resilience import backend_error
from mqstore.v1 import commitlog_pb2, common_pb2, query_pb2
from services.store.formats.consumer_offsets_file import read_offset_table
from tests.commitlog.commitlog_process import CommitLogProcess, free_port, start_commitlog
from tests.commitlog.small_disk import MIB, small_filesystem
from tests.indexer.indexer_process import IndexerProcess, start_indexer
from tests.query.query_process import QueryProcess, start_query

TOPIC = "Early"
BODY = b"e" * 30_000  # about 34 records a 1 MiB file
MESSAGES = 150  # four full files and part of a fifth
ENV = {
    "MQSTORE_MAPPED_FILE_SIZE_COMMIT_LOG": str(MIB),
    "MQSTORE_MAPPED_FILE_SIZE_CONSUME_QUEUE": str(300 * 20),
    "MQSTORE_MAX_HASH_SLOT_NUM": "500",
    "MQSTORE_MAX_INDEX_NUM": "2000",
    # The clean-commitlog thread every 200 ms, a cleaning round in each.
    "MQSTORE_FLUSH_INTERVAL_CONSUME_QUEUE": "200",
    "MQSTORE_CLEAN_RESOURCE_INTERVAL": "200",
}
FILLED_RATIO = 0.875  # past diskSpaceCleanForciblyRatio 0.85, below diskSpaceWarningLevelRatio 0.90


@dataclass
class Deployment:
    root: Path
    commitlog: CommitLogProcess
    indexer: IndexerProcess
    query: QueryProcess
    metrics_port: int
    results: list[commitlog_pb2.AppendResult]

    def commit(self, group: str, offset: int) -> None:
        """Commit ``offset`` for ``group`` on the topic's queue and wait until the query service wrote it."""
        self.query.stub.UpdateConsumerOffset(query_pb2.UpdateConsumerOffsetRequest(
            consumer_group=group, topic=TOPIC, queue_id=0, offset=offset), timeout=5)
        path = self.root / "query" / "config" / "consumerOffset.json"
        wait_until(lambda: _on_disk(path).get(f"{TOPIC}@{group}", {}).get("0") == offset)

    def info(self) -> commitlog_pb2.StoreInfo:
        return self.commitlog.stub.GetStoreInfo(commitlog_pb2.GetStoreInfoRequest(), timeout=5)

    def send(self) -> commitlog_pb2.AppendResult:
        message = common_pb2.Message(topic="Probe", body=b"probe", born_host="127.0.0.1:50000")
        return self.commitlog.stub.Append(commitlog_pb2.AppendRequest(message=message), timeout=10)

    def assert_all_readable(self) -> None:
        """Every acknowledged message is still there (none answers NOT_FOUND)."""
        for result in self.results:
            found = self.query.stub.ViewMessage(query_pb2.ViewMessageRequest(
                msg_id=result.msg_id, kind=query_pb2.MESSAGE_ID_KIND_OFFSET), timeout=5)
            assert found.message.commitlog_offset == result.commitlog_offset

    def fill(self) -> None:
        """The ballast file takes the disk to FILLED_RATIO used."""
        st = os.statvfs(self.root)
        total, used = st.f_blocks * st.f_frsize, (st.f_blocks - st.f_bfree) * st.f_frsize
        with open(self.root / "ballast", "ab") as ballast:
            ballast.write(b"\0" * max(0, int(FILLED_RATIO * total) - used))

    def warnings(self, prefix: str) -> list[dict[str, Any]]:
        return [r for r in self.commitlog.log_records() if r.get("level") == "WARNING" and
                str(r.get("msg", "")).startswith(prefix)]

    def metric(self, name: str) -> float:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as response:
            text = response.read().decode()
        return sum(s.value for family in text_string_to_metric_families(text) for s in family.samples
                   if s.name == name)


def _on_disk(path: Path) -> dict[str, dict[str, int]]:
    """What the store holds: the file and the commits its journal appended since."""
    try:
        return {key: {str(q): o for q, o in queues.items()} for key, queues in read_offset_table(path).items()}
    except (OSError, ValueError, KeyError):
        return {}


def wait_until(condition: Callable[[], bool], timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@contextlib.contextmanager
def deployment(tmp_path: Path, protect: bool | None) -> Iterator[Deployment]:
    """``protect``: protectUnconsumedData (None: its default)."""
    with small_filesystem(tmp_path, 32) as root:
        for name in ("indexer", "query"):
            (tmp_path / name).mkdir()
            (root / name).symlink_to(tmp_path / name)
        metrics_port = free_port()
        env = ENV if protect is None else {**ENV, "MQSTORE_PROTECT_UNCONSUMED_DATA": str(protect).lower()}
        started: list[CommitLogProcess | IndexerProcess | QueryProcess] = []
        try:
            commitlog = start_commitlog(root, {**env, "MQSTORE_METRICS_PORT": str(metrics_port)})
            started.append(commitlog)
            indexer = start_indexer(tmp_path / "indexer", commitlog.address, env)
            started.append(indexer)
            query = start_query(tmp_path / "query", commitlog.address, indexer.address, env)
            started.append(query)
            results: list[commitlog_pb2.AppendResult] = []
            batch = [common_pb2.Message(topic=TOPIC, queue_id=0, body=BODY, born_host="127.0.0.1:50000")] * 10
            while len(results) < MESSAGES:
                request = commitlog_pb2.AppendBatchRequest(messages=batch)
                results.extend(commitlog.stub.AppendBatch(request, timeout=10).results)
            end = results[-1].commitlog_offset + results[-1].wrote_bytes
            indexer.wait_caught_up(end)
            # Only flushed files are deleted; the flush service takes one file a round (500 ms).
            wait_until(lambda: commitlog.stub.GetStoreInfo(commitlog_pb2.GetStoreInfoRequest(),
                                                           timeout=5).flushed_offset >= end)
            yield Deployment(root, commitlog, indexer, query, metrics_port, results)
        finally:
            for handle in reversed(started):  # readers first; each must stop cleanly
                code = handle.stop()
                assert code == 0, handle.logs()[-3000:]


def queue_offsets_by_file(results: list[commitlog_pb2.AppendResult]) -> dict[int, tuple[int, int]]:
    """{file start: (first, last queue offset of the topic's messages in it)}."""
    files: dict[int, tuple[int, int]] = {}
    for result in results:
        start = result.commitlog_offset - result.commitlog_offset % MIB
        first, _ = files.get(start, (result.queue_offset, 0))
        files[start] = (first, result.queue_offset)
    return files


def test_without_protection_files_go_early_with_a_warning_naming_the_groups_and_are_counted(tmp_path: Path) -> None:
    with deployment(tmp_path, protect=False) as system:
        system.commit("Lagging", 3)  # its offset lies below everything deleted
        system.commit("Middle", 50)  # in the second file
        system.commit("Done", MESSAGES)  # consumed everything
        system.fill()
        wait_until(lambda: system.info().min_offset == 4 * MIB)  # all but the last file
        # Each deletion's WARNING may reach the log a moment after the offset moved.
        wait_until(lambda: len(system.warnings("deleted commitlog file")) >= 4)

        warned = {r["file"]: r for r in system.warnings("deleted commitlog file")}
        by_file = queue_offsets_by_file(system.results)
        assert sorted(warned) == [f"{start:020d}" for start in sorted(by_file)[:4]]
        for start, (first, last) in sorted(by_file.items())[:4]:
            record = warned[f"{start:020d}"]
            assert f"(commitlog offsets [{start}, {start + MIB}), 1.0 MiB) before its fileReservedTime of 72 h" \
                in record["msg"], record
            assert "above diskSpaceCleanForciblyRatio 0.85" in record["msg"] and str(system.root) in record["msg"]
            expected = sorted(g for g, committed in (("Lagging", 3), ("Middle", 50)) if committed <= last)
            assert record["groups"] == expected, record
            lagging = f"Lagging (topic {TOPIC} queue 0: committed offset 3, {last + 1 - max(3, first)} unconsumed"
            assert lagging in record["msg"] and "Done" not in record["msg"], record
        assert system.metric("mqstore_commitlog_early_deleted_files_total") == 4
        assert system.metric("mqstore_commitlog_early_deleted_bytes_total") == 4 * MIB
        system.send()  # below the watermark: writes go on


def test_by_default_unconsumed_data_is_kept_and_writes_refused_naming_the_groups(tmp_path: Path) -> None:
    with deployment(tmp_path, protect=None) as system:
        system.commit("Lagging", 3)
        system.commit("Never", 0)  # subscribed, consumed nothing yet
        system.commit("Done", MESSAGES)
        system.fill()
        wait_until(lambda: len(system.warnings("refusing writes instead of deleting unconsumed data")) == 1)
        with pytest.raises(grpc.RpcError) as refused:
            system.send()
        details = refused.value.details() or ""
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, refused.value
        assert details.startswith("disk full: ") and f"mounted at {system.root})" in details, details
        assert "% used" in details and "above diskSpaceCleanForciblyRatio 0.85" in details, details
        assert "protectUnconsumedData keeps commitlog file 00000000000000000000 (commitlog offsets [0, 1048576))" \
            in details, details
        assert f"Lagging (topic {TOPIC} queue 0: committed offset 3," in details and "Done" not in details, details
        assert f"Never (topic {TOPIC} queue 0: committed offset 0," in details, details
        via_gateway = backend_error("the commitlog of shard-0 (127.0.0.1:1)", Refused(details))
        assert via_gateway.code == grpc.StatusCode.RESOURCE_EXHAUSTED and via_gateway.details.startswith(
            "the commitlog of shard-0 (127.0.0.1:1) refused the write because its disk is full"), via_gateway
        assert "Lagging" in via_gateway.details and "Never" in via_gateway.details
        system.assert_all_readable()
        info = system.info()
        assert info.min_offset == 0 and info.mapped_file_count >= 5, "no unconsumed file may be deleted"
        assert system.metric("mqstore_commitlog_early_deleted_files_total") == 0

        # Space freed: writes resume by themselves; filled again: refused again.
        (system.root / "ballast").unlink()
        wait_until(_accepted(system))
        system.fill()
        wait_until(lambda: len(system.warnings("refusing writes instead of deleting unconsumed data")) == 2)
        assert not _accepted(system)()

        # The groups consume past the data: its files may go, and writes resume.
        system.commit("Lagging", MESSAGES)
        system.commit("Never", MESSAGES)
        wait_until(_accepted(system))
        assert system.info().min_offset >= 4 * MIB
        deleted = system.warnings("deleted commitlog file")
        assert deleted and all(r["groups"] == [] for r in deleted), deleted
        assert system.metric("mqstore_commitlog_early_deleted_files_total") == len(deleted)


def _accepted(system: Deployment) -> Callable[[], bool]:
    def accepted() -> bool:
        try:
            system.send()
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, exc
            return False
        return True
    return accepted


class Refused(grpc.aio.AioRpcError):
    """A commitlog's RESOURCE_EXHAUSTED as the gateway receives it."""

    def __init__(self, details: str) -> None:
        super().__init__(grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.aio.Metadata(), grpc.aio.Metadata(), details,
                         None)


def test_the_gateway_tells_a_full_disk_as_such_not_as_busy() -> None:
    full = backend_error("the commitlog of shard-0 (127.0.0.1:1)", Refused(
        "disk full: the disk of /s/commitlog (mounted at /s) is 91.0% used (...); nothing was written"))
    assert full.code == grpc.StatusCode.RESOURCE_EXHAUSTED and full.not_applied
    assert full.details.startswith("the commitlog of shard-0 (127.0.0.1:1) refused the write because its disk is "
                                   "full (disk full: the disk of /s/commitlog"), full.details
    assert "busy" not in full.details
    busy = backend_error("the commitlog of shard-0 (127.0.0.1:1)", Refused("broker busy: ..."))
    assert "is busy (broker busy: ...); back off and retry" in busy.details
