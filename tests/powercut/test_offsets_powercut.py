"""Under SYNC_FLUSH a consumer offset is durable when its commit is answered: the query service's store on
the power-cut file system is cut right after the answer and restarted, and the offset is the last one
acknowledged (not an earlier persist interval's)."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from mqstore.v1 import commitlog_pb2, query_pb2
from tests.commitlog.commitlog_process import start_commitlog
from tests.indexer.indexer_process import start_indexer
from tests.powercut.mount import PowerCutMount, available
from tests.query.query_process import QueryProcess, message, read_args, start_query

UNAVAILABLE = available()
pytestmark = pytest.mark.skipif(UNAVAILABLE is not None, reason=f"no FUSE here: {UNAVAILABLE}")
SYNC_FLUSH = {"MQSTORE_FLUSH_DISK_TYPE": "SYNC_FLUSH"}
# Far longer than the test: only the commit path can make an offset durable.
PERSIST_INTERVAL = ("--persist-interval-ms", "600000")


def _commit(query: QueryProcess, offset: int) -> None:
    query.stub.UpdateConsumerOffset(query_pb2.UpdateConsumerOffsetRequest(
        consumer_group="g", topic="T", queue_id=0, offset=offset), timeout=10)


def _committed(query: QueryProcess) -> int | None:
    try:
        return int(query.stub.QueryConsumerOffset(query_pb2.QueryConsumerOffsetRequest(
            consumer_group="g", topic="T", queue_id=0), timeout=10).offset)
    except grpc.RpcError as exc:
        if exc.code() == grpc.StatusCode.NOT_FOUND:
            return None
        raise


def test_an_acknowledged_offset_survives_a_power_cut(tmp_path: Path, fs: PowerCutMount) -> None:
    commitlog = start_commitlog(tmp_path / "broker", SYNC_FLUSH)
    indexer = start_indexer(tmp_path / "indexer", commitlog.address, SYNC_FLUSH)
    handles = [commitlog, indexer]
    try:
        messages = [message("T", 0, b"%d" % i) for i in range(10)]
        commitlog.stub.AppendBatch(commitlog_pb2.AppendBatchRequest(messages=messages), timeout=10)
        info = commitlog.stub.GetStoreInfo(commitlog_pb2.GetStoreInfoRequest(), timeout=5)
        indexer.wait_caught_up(info.max_offset)
        args = (*read_args(tmp_path, "files"), *PERSIST_INTERVAL)
        query = start_query(fs.mount / "query", commitlog.address, indexer.address, SYNC_FLUSH, extra_args=args)
        handles.append(query)
        for offset in (3, 7, 10):
            _commit(query, offset)
        fs.cut(query.kill9)
        fs.start()
        query = start_query(fs.mount / "query", commitlog.address, indexer.address, SYNC_FLUSH, extra_args=args,
                            port=query.port)
        handles.append(query)
        assert _committed(query) == 10, "an acknowledged consumer offset rolled back after a power cut"
    finally:
        for handle in handles:
            if handle.running:
                handle.kill9()

