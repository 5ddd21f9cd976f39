"""The commitlog loses a tail in a crash recovery while the indexer runs: the indexer drops what it
built from the lost records and indexes what is written afterwards, never pointing at a wrong record."""

from __future__ import annotations

import time
import urllib.request
from pathlib import Path

import pytest

from mqstore.v1 import commitlog_pb2, common_pb2, indexer_pb2
from services.store.formats.record import decode_record
from tests.commitlog.commitlog_process import CommitLogProcess, StartCommitLog, free_port
from tests.indexer.indexer_process import IndexerProcess, start_indexer
from tests.indexer.test_indexer_crash import all_units

# recoverCorruptionMode: cut: the damaged record stands for a crash that lost the records from it on.
ENV = {"MQSTORE_MAPPED_FILE_SIZE_COMMIT_LOG": str(1024 * 1024), "MQSTORE_RECOVER_CORRUPTION_MODE": "cut"}


def append(commitlog: CommitLogProcess, first: int, count: int, body_size: int) -> list[commitlog_pb2.AppendResult]:
    messages = [common_pb2.Message(topic="TruncT", queue_id=i % 2, body=b"b" * body_size,
                                   properties={"KEYS": f"key-{i}"}) for i in range(first, first + count)]
    return list(commitlog.stub.AppendBatch(commitlog_pb2.AppendBatchRequest(messages=messages)).results)


def max_offset(commitlog: CommitLogProcess) -> int:
    return int(commitlog.stub.GetStoreInfo(commitlog_pb2.GetStoreInfoRequest()).max_offset)


def found(indexer: IndexerProcess, key: str) -> list[int]:
    return list(indexer.stub.QueryByKey(indexer_pb2.QueryByKeyRequest(topic="TruncT", key=key)).commitlog_offsets)


@pytest.mark.parametrize("source", ["files", "tail"])
@pytest.mark.parametrize("indexer_down", [False, True], ids=["indexer-running", "indexer-down"])
def test_indexer_follows_a_truncated_commitlog(start_commitlog: StartCommitLog, tmp_path: Path,
                                               indexer_down: bool, source: str) -> None:
    """Running, the indexer sees the log shorter than its reput offset. Down while the log regrows
    past that offset with other records, it only knows the commitlog restarted (a new incarnation)
    and recovered to an offset below what it had dispatched. Either reading the commitlog's files
    (the recovery rewrote bytes under it) or its byte-carrying Tail."""
    broker = tmp_path / "broker"
    commitlog = start_commitlog(broker, ENV)
    indexer_env = {**ENV, "MQSTORE_INDEXER_REPUT_SOURCE": source}
    indexer = start_indexer(tmp_path / "indexer", commitlog.address, indexer_env)
    try:
        results = append(commitlog, 0, 100, 300)
        indexer.wait_caught_up(max_offset(commitlog))
        cut = results[60].commitlog_offset
        if indexer_down:
            assert indexer.stop() == 0
        commitlog.kill9()
        # The crash lost records 60.. : corrupt record 60's body so recovery stops there.
        with open(broker / "commitlog" / f"{0:020d}", "r+b") as f:
            f.seek(cut + 100)
            f.write(b"\xff\xff\xff")
        commitlog = start_commitlog(broker, ENV, port=commitlog.port)  # where the indexer looks
        info = commitlog.stub.GetStoreInfo(commitlog_pb2.GetStoreInfoRequest())
        assert info.recovered_offset == info.max_offset == cut
        # New records of another size land where the lost ones were.
        new = append(commitlog, 1000, 50, 777)
        assert new[0].commitlog_offset == cut
        assert max_offset(commitlog) > results[-1].commitlog_offset  # past the old reput offset
        if indexer_down:
            indexer = start_indexer(tmp_path / "indexer", commitlog.address, indexer_env)
        indexer.wait_caught_up(max_offset(commitlog))
        for queue_id in (0, 1):
            units = all_units(indexer, "TruncT", queue_id)
            assert [u.queue_offset for u in units] == list(range(len(units)))
            assert len(units) == 30 + 25
            data = commitlog.stub.ReadBatch(commitlog_pb2.ReadBatchRequest(ranges=[
                commitlog_pb2.ByteRange(offset=u.commitlog_offset, size=u.size) for u in units])).data
            for unit, raw in zip(units, data, strict=True):
                record = decode_record(raw)
                assert (record.queue_id, record.queue_offset, record.commitlog_offset) == \
                    (queue_id, unit.queue_offset, unit.commitlog_offset)
        assert found(indexer, "key-59") == [results[59].commitlog_offset]
        assert found(indexer, "key-70") == []  # lost with the tail
        assert found(indexer, "key-1010") == [new[10].commitlog_offset]
        # It cut exactly at the lost records; it did not fall back to rebuilding everything.
        assert "rebuilding from" not in indexer.logs()
    finally:
        assert indexer.stop() == 0


def test_dispatch_lag_is_reported_by_rpc_and_metrics(start_commitlog: StartCommitLog, tmp_path: Path) -> None:
    commitlog = start_commitlog(tmp_path / "broker", ENV)
    port = free_port()
    indexer = start_indexer(tmp_path / "indexer", commitlog.address, {**ENV, "MQSTORE_METRICS_PORT": str(port)})
    try:
        results = append(commitlog, 0, 40, 100)
        status = indexer.wait_caught_up(max_offset(commitlog))
        assert status.connected and status.behind_bytes == 0 and status.behind_ms == 0
        assert status.dispatched_records == 40
        assert status.reput_offset == results[-1].commitlog_offset + results[-1].wrote_bytes
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        assert "mqstore_indexer_dispatch_behind_bytes 0.0" in text
        assert "mqstore_indexer_dispatched_records_total 40.0" in text
        commitlog.kill9()  # the indexer notices the commitlog is gone
        deadline = time.monotonic() + 10
        while indexer.status().connected and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not indexer.status().connected
    finally:
        assert indexer.stop() == 0
