"""The indexer process, fed the commitlog real RocketMQ wrote, builds what RocketMQ built."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from mqstore.v1 import commitlog_pb2, indexer_pb2
from services.store.formats.index_file import IndexFile
from tests.commitlog.commitlog_process import CommitLogProcess, start_commitlog
from tests.conftest import StoreFactory
from tests.indexer.indexer_process import IndexerProcess, start_indexer

FIXTURE_ENV = {
    "MQSTORE_MAPPED_FILE_SIZE_COMMIT_LOG": str(1024 * 1024),
    "MQSTORE_MAPPED_FILE_SIZE_CONSUME_QUEUE": "6000",
    "MQSTORE_MAX_HASH_SLOT_NUM": "100",
    "MQSTORE_MAX_INDEX_NUM": "400",
}
Rows = Callable[..., list[dict[str, Any]]]


@pytest.fixture(scope="module")
def built(pristine_store: StoreFactory, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[tuple[CommitLogProcess, IndexerProcess, Path]]:
    """A commitlog service on a copy of the normal fixture's commitlog, and an indexer that caught up."""
    fixture = pristine_store("normal-raw")
    root = tmp_path_factory.mktemp("fixture-indexer")
    shutil.copytree(fixture / "commitlog", root / "broker" / "commitlog")
    commitlog = start_commitlog(root / "broker", FIXTURE_ENV)
    indexer = start_indexer(root / "indexer", commitlog.address, FIXTURE_ENV)
    info = commitlog.stub.GetStoreInfo(commitlog_pb2.GetStoreInfoRequest())
    assert info.max_offset == 3008717
    indexer.wait_caught_up(info.max_offset)
    yield commitlog, indexer, root / "indexer"
    assert indexer.stop() == 0
    assert commitlog.stop() == 0


def test_consume_queues_are_byte_identical(built: tuple[CommitLogProcess, IndexerProcess, Path],
                                           pristine_store: StoreFactory) -> None:
    _, indexer, root = built
    indexer.stub.GetDispatchStatus(indexer_pb2.GetDispatchStatusRequest())
    expected_root = pristine_store("normal-raw") / "consumequeue"
    expected = sorted(p.relative_to(expected_root) for p in expected_root.rglob("*") if p.is_file())
    ours = sorted(p.relative_to(root / "consumequeue") for p in (root / "consumequeue").rglob("*") if p.is_file())
    assert ours == expected
    for rel in expected:
        assert (root / "consumequeue" / rel).read_bytes() == (expected_root / rel).read_bytes(), rel


def test_queue_rpcs_give_the_dump_rows(built: tuple[CommitLogProcess, IndexerProcess, Path], dump_rows: Rows) -> None:
    _, indexer, _ = built
    for r in dump_rows("normal", "cqrange"):
        if r["maxOffset"] == 0:
            continue
        request = indexer_pb2.GetQueueOffsetsRequest(topic=r["topic"], queue_id=r["queueId"])
        offsets = indexer.stub.GetQueueOffsets(request)
        assert (offsets.min_offset, offsets.max_offset, offsets.max_physic_offset) == \
            (r["minOffset"], r["maxOffset"], r["maxPhysicOffset"])
    cq_rows = dump_rows("normal", "cq")
    first = [r for r in cq_rows if (r["topic"], r["queueId"]) == ("TopicA", 1)][:40]
    units = indexer.stub.GetQueueEntries(indexer_pb2.GetQueueEntriesRequest(topic="TopicA", queue_id=1, max_count=40))
    assert [(u.queue_offset, u.commitlog_offset, u.size, u.tags_code) for u in units.units] == \
        [(r["cqOffset"], r["phyOffset"], r["size"], r["tagsCode"]) for r in first]


def test_every_key_query_gives_the_dump_offsets(built: tuple[CommitLogProcess, IndexerProcess, Path],
                                                dump_rows: Rows) -> None:
    _, indexer, _ = built
    rows = dump_rows("normal", "query")
    assert len(rows) > 3000
    for r in rows:
        result = indexer.stub.QueryByKey(indexer_pb2.QueryByKeyRequest(topic=r["topic"], key=r["key"], max_num=64))
        assert list(result.commitlog_offsets) == r["indexPhyOffsets"], r


def test_index_file_headers_equal_the_fixture(built: tuple[CommitLogProcess, IndexerProcess, Path],
                                              dump_rows: Rows) -> None:
    _, _, root = built
    files = sorted((root / "index").iterdir())
    expected = dump_rows("normal", "indexfile")
    assert len(files) == len(expected) == 16
    for path, row in zip(files, expected, strict=True):
        index = IndexFile(path, 100, 400)
        try:
            assert (index.begin_timestamp, index.end_timestamp, index.begin_phy_offset, index.end_phy_offset,
                    index.hash_slot_count, index.index_count) == \
                (row["beginTimestamp"], row["endTimestamp"], row["beginPhyOffset"], row["endPhyOffset"],
                 row["hashSlotCount"], row["indexCount"])
        finally:
            index.close()


@pytest.mark.parametrize(("method", "request_message", "code"), [
    ("GetQueueEntries", indexer_pb2.GetQueueEntriesRequest(topic="TopicA", queue_id=0, from_offset=-1),
     grpc.StatusCode.INVALID_ARGUMENT),
    ("GetQueueEntries", indexer_pb2.GetQueueEntriesRequest(topic="TopicA", queue_id=0, max_count=5000),
     grpc.StatusCode.INVALID_ARGUMENT),
    ("GetQueueEntries", indexer_pb2.GetQueueEntriesRequest(topic="Nope", queue_id=0), grpc.StatusCode.NOT_FOUND),
    ("GetQueueEntries", indexer_pb2.GetQueueEntriesRequest(topic="TopicA", queue_id=9), grpc.StatusCode.NOT_FOUND),
    ("GetQueueOffsets", indexer_pb2.GetQueueOffsetsRequest(topic="", queue_id=0), grpc.StatusCode.INVALID_ARGUMENT),
    ("GetQueueOffsets", indexer_pb2.GetQueueOffsetsRequest(topic="TopicA", queue_id=-1),
     grpc.StatusCode.INVALID_ARGUMENT),
    ("GetOffsetByTime", indexer_pb2.GetOffsetByTimeRequest(topic="TopicA", queue_id=0, timestamp=-5),
     grpc.StatusCode.INVALID_ARGUMENT),
    ("QueryByKey", indexer_pb2.QueryByKeyRequest(topic="TopicA", key="k", begin_timestamp=10, end_timestamp=5),
     grpc.StatusCode.INVALID_ARGUMENT),
    ("QueryByKey", indexer_pb2.QueryByKeyRequest(topic="TopicA", key=""), grpc.StatusCode.INVALID_ARGUMENT),
    ("QueryByKey", indexer_pb2.QueryByKeyRequest(topic="TopicA", key="k", max_num=-1),
     grpc.StatusCode.INVALID_ARGUMENT),
    ("QueryByKey", indexer_pb2.QueryByKeyRequest(topic="TopicA", key="k", skip=-1), grpc.StatusCode.INVALID_ARGUMENT),
    ("QueryByKey", indexer_pb2.QueryByKeyRequest(topic="TopicA", key="k", max_num=64, skip=961),
     grpc.StatusCode.INVALID_ARGUMENT),
])
def test_bad_requests_get_precise_codes(built: tuple[CommitLogProcess, IndexerProcess, Path], method: str,
                                        request_message: Any, code: grpc.StatusCode) -> None:
    _, indexer, _ = built
    with pytest.raises(grpc.RpcError) as info:
        getattr(indexer.stub, method)(request_message, timeout=5)
    assert info.value.code() == code
    assert info.value.details()
