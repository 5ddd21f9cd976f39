"""Pull outcomes a healthy indexer rarely produces, from a scripted indexer on loopback (the
commitlog and query services are real processes): a missing ConsumeQueue file (OFFSET_FOUND_NULL),
units that do not match their records (DATA_LOSS), units past the commitlog's end and an indexer
that is down (UNAVAILABLE)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from mqstore.v1 import commitlog_pb2, indexer_pb2, indexer_pb2_grpc, query_pb2
from tests.commitlog.commitlog_process import CommitLogProcess, free_port, start_commitlog
from tests.query.query_process import QueryProcess, message, start_query

CQ_ENV = {"MQSTORE_MAPPED_FILE_SIZE_CONSUME_QUEUE": "6000"}  # 300 units per ConsumeQueue file


class ScriptedIndexer(indexer_pb2_grpc.IndexerServiceServicer):  # type: ignore[misc]
    """GetQueueEntries answers whatever the test put in ``entries``; WatchArrivals stays silent."""

    def __init__(self) -> None:
        self.entries = indexer_pb2.GetQueueEntriesResponse()
        self.stopped = threading.Event()

    def GetQueueEntries(self, request: Any, context: Any) -> indexer_pb2.GetQueueEntriesResponse:
        return self.entries

    def WatchArrivals(self, request: Any, context: Any) -> Iterator[indexer_pb2.Arrival]:
        while context.is_active() and not self.stopped.wait(0.1):
            pass
        return iter(())


@pytest.fixture(scope="module")
def scripted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ScriptedIndexer, CommitLogProcess,
                                                                          QueryProcess]]:
    root: Path = tmp_path_factory.mktemp("stub-indexer")
    indexer = ScriptedIndexer()
    server = grpc.server(futures.ThreadPoolExecutor(8))
    indexer_pb2_grpc.add_IndexerServiceServicer_to_server(indexer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    commitlog = start_commitlog(root / "broker", CQ_ENV)
    query = start_query(root / "query", commitlog.address, f"127.0.0.1:{port}", CQ_ENV)
    try:
        yield indexer, commitlog, query
    finally:
        indexer.stopped.set()
        try:
            assert query.stop() == 0
            assert commitlog.stop() == 0
        finally:
            server.stop(0)


def pull(query: QueryProcess, offset: int) -> query_pb2.PullMessageResponse:
    response: query_pb2.PullMessageResponse = query.stub.PullMessage(
        query_pb2.PullMessageRequest(topic="Hole", queue_id=0, queue_offset=offset), timeout=10)
    return response


def test_missing_consume_queue_file_is_offset_found_null(scripted: Any) -> None:
    indexer, _, query = scripted
    indexer.entries = indexer_pb2.GetQueueEntriesResponse(units=[], min_offset=0, max_offset=1000)
    response = pull(query, 500)
    assert query_pb2.GetMessageStatus.Name(response.status) == "GET_MESSAGE_STATUS_OFFSET_FOUND_NULL"
    assert (response.next_begin_offset, response.min_offset, response.max_offset) == (600, 0, 1000)
    assert pull(query, 0).next_begin_offset == 300


def test_units_that_do_not_match_their_records_are_data_loss(scripted: Any) -> None:
    indexer, commitlog, query = scripted
    appended = commitlog.stub.AppendBatch(commitlog_pb2.AppendBatchRequest(
        messages=[message("Hole", 0, b"one"), message("Hole", 0, b"two")])).results
    units = [indexer_pb2.QueueUnit(queue_offset=i, commitlog_offset=r.commitlog_offset, size=r.wrote_bytes)
             for i, r in enumerate(appended)]
    indexer.entries = indexer_pb2.GetQueueEntriesResponse(units=units, min_offset=0, max_offset=2)
    assert [m.body for m in pull(query, 0).messages] == [b"one", b"two"]
    # The second record is not the size its unit says: the first message is returned, the pull stops there.
    bad_second = [units[0], indexer_pb2.QueueUnit(queue_offset=1, commitlog_offset=units[1].commitlog_offset,
                                                  size=units[1].size - 1)]
    indexer.entries = indexer_pb2.GetQueueEntriesResponse(units=bad_second, min_offset=0, max_offset=2)
    response = pull(query, 0)
    assert ([m.body for m in response.messages], response.next_begin_offset) == ([b"one"], 1)
    # As the first unit, the same damage is an error naming the queue offset.
    shifted = indexer_pb2.QueueUnit(queue_offset=0, commitlog_offset=units[0].commitlog_offset + 4, size=units[0].size)
    indexer.entries = indexer_pb2.GetQueueEntriesResponse(units=[shifted], min_offset=0, max_offset=2)
    with pytest.raises(grpc.RpcError) as info:
        pull(query, 0)
    assert info.value.code() == grpc.StatusCode.DATA_LOSS and "queue offset 0" in str(info.value.details())


def test_units_past_the_commitlog_end_are_unavailable(scripted: Any) -> None:
    indexer, commitlog, query = scripted
    end = commitlog.stub.GetStoreInfo(commitlog_pb2.GetStoreInfoRequest()).max_offset
    indexer.entries = indexer_pb2.GetQueueEntriesResponse(
        units=[indexer_pb2.QueueUnit(queue_offset=0, commitlog_offset=end + 100, size=120)], min_offset=0,
        max_offset=1)
    with pytest.raises(grpc.RpcError) as info:
        pull(query, 0)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE and "retry" in str(info.value.details())


def test_an_unreachable_indexer_is_unavailable(scripted: Any, tmp_path: Path) -> None:
    _, commitlog, _ = scripted
    orphan = start_query(tmp_path / "orphan", commitlog.address, f"127.0.0.1:{free_port()}")
    try:
        for call, request in [(orphan.stub.PullMessage, query_pb2.PullMessageRequest(topic="Hole")),
                              (orphan.stub.QueryMessage, query_pb2.QueryMessageRequest(topic="Hole", key="k")),
                              (orphan.stub.SearchOffset, query_pb2.SearchOffsetRequest(topic="Hole"))]:
            with pytest.raises(grpc.RpcError) as info:
                call(request, timeout=10)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE, call
            assert "indexer" in str(info.value.details())
    finally:
        assert orphan.stop() == 0
