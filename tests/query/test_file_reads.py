"""Reads from the store files (services/query/local_files.py) against real processes.

- Producers sending fast (batches) and slowly (one by one) while consumers long-poll across commitlog
  and ConsumeQueue file rolls (small geometry): every pulled record is the acknowledged one, in order,
  none missing, none at or past the max offset the answer reports (the indexer's published bound).
- A unit the indexer wrote into the ConsumeQueue file but has not published is never returned.
- The same store read from the files and over gRPC (``--read-from grpc``) answers the same.
"""

from __future__ import annotations

import dataclasses
import struct
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from mqstore.v1 import commitlog_pb2, indexer_pb2, indexer_pb2_grpc, query_pb2
from services.store.formats.consume_queue import ConsumeQueue
from tests.commitlog.commitlog_process import start_commitlog
from tests.geometry import SMALL, drop_preallocated_files
from tests.query.query_process import QueryProcess, System, message, running_system, start_query

Status = query_pb2.GetMessageStatus
TOPIC = "FileReads"
QUEUES = 2
FAST_BATCHES = 40
FAST_BATCH = 16
SLOW_MESSAGES = 60


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    root = tmp_path_factory.mktemp("file-reads")
    try:
        with running_system(root, SMALL.env(), read_from="files") as started:
            yield started
    finally:
        drop_preallocated_files(root)


def _pull(stub: Any, topic: str, queue_id: int, offset: int, **fields: Any) -> query_pb2.PullMessageResponse:
    request = query_pb2.PullMessageRequest(topic=topic, queue_id=queue_id, queue_offset=offset, **fields)
    response: query_pb2.PullMessageResponse = stub.PullMessage(request, timeout=20)
    return response


def _body(kind: str, n: int) -> bytes:
    return f"{kind}-{n:05d}-".encode() * (40 + n % 23)  # 0.4 - 1.3 KB: a 64 KiB commitlog file rolls often


def test_producers_and_consumers_across_rolls(system: System) -> None:
    acked: dict[tuple[int, int], tuple[bytes, int]] = {}  # (queue, queue offset) -> (body, commitlog offset)
    lock = threading.Lock()
    producing = threading.Event()
    producing.set()
    errors: list[BaseException] = []

    def record(results: Any, bodies: list[bytes]) -> None:
        with lock:
            for result, body in zip(results, bodies, strict=True):
                assert commitlog_pb2.PutMessageStatus.Name(result.status) == "PUT_MESSAGE_STATUS_PUT_OK"
                acked[(result.queue_id, result.queue_offset)] = (body, result.commitlog_offset)

    def fast() -> None:
        for b in range(FAST_BATCHES):
            bodies = [_body("fast", b * FAST_BATCH + i) for i in range(FAST_BATCH)]
            msgs = [message(TOPIC, i % QUEUES, body, KEYS=f"fast{b * FAST_BATCH + i}") for i, body in enumerate(bodies)]
            response = system.commitlog.stub.AppendBatch(commitlog_pb2.AppendBatchRequest(messages=msgs), timeout=20)
            record(response.results, bodies)

    def slow() -> None:
        for n in range(SLOW_MESSAGES):
            body = _body("slow", n)
            one = [message(TOPIC, n % QUEUES, body, KEYS=f"slow{n}")]
            response = system.commitlog.stub.AppendBatch(commitlog_pb2.AppendBatchRequest(messages=one), timeout=20)
            record(response.results, [body])
            time.sleep(0.01)

    pulled: dict[int, list[tuple[int, bytes, int]]] = {q: [] for q in range(QUEUES)}

    def consume(queue_id: int) -> None:
        offset = 0
        while True:
            response = _pull(system.query.stub, TOPIC, queue_id, offset, max_messages=7, long_poll_ms=500)
            for m in response.messages:
                # never a record at or past the bound the answer reports (what the indexer published)
                assert m.queue_offset < response.max_offset, (m.queue_offset, response.max_offset)
                pulled[queue_id].append((m.queue_offset, m.body, m.commitlog_offset))
            offset = response.next_begin_offset
            if not producing.is_set() and not response.messages:
                with lock:
                    expected = sum(1 for q, _ in acked if q == queue_id)
                if offset >= expected:
                    return

    def guarded(target: Any, *args: Any) -> Any:
        def run() -> None:
            try:
                target(*args)
            except BaseException as exc:  # noqa: BLE001 - reported by the test thread
                errors.append(exc)
        return threading.Thread(target=run)

    producers = [guarded(fast), guarded(slow)]
    consumers = [guarded(consume, q) for q in range(QUEUES)]
    for thread in consumers + producers:
        thread.start()
    for thread in producers:
        thread.join(120)
    producing.clear()
    for thread in consumers:
        thread.join(120)
    assert not errors, errors
    total = FAST_BATCHES * FAST_BATCH + SLOW_MESSAGES
    assert len(acked) == total
    for queue_id in range(QUEUES):
        got = pulled[queue_id]
        assert [offset for offset, _, _ in got] == list(range(len(got))), "in order, none missing, none twice"
        assert len(got) == sum(1 for q, _ in acked if q == queue_id)
        for offset, body, commitlog_offset in got:
            assert (body, commitlog_offset) == acked[(queue_id, offset)]
    # the workload crossed commitlog and ConsumeQueue file rolls
    assert len(list((system.root / "broker" / "commitlog").iterdir())) > 3
    assert max(len(got) for got in pulled.values()) > SMALL.cq_units_per_file


def test_files_and_grpc_answer_the_same(system: System) -> None:
    """A second query service on the same store, reading over gRPC: the same answers."""
    system.wait_dispatched()
    grpc_query = start_query(system.root / "query-grpc", system.commitlog.address, system.indexer.address,
                             SMALL.env(), extra_args=["--read-from", "grpc"])
    try:
        files, remote = system.query.stub, grpc_query.stub
        for queue_id in range(QUEUES):
            offset = 0
            while True:
                a = _pull(files, TOPIC, queue_id, offset, max_messages=32)
                b = _pull(remote, TOPIC, queue_id, offset, max_messages=32)
                assert a == b
                if not a.messages:
                    break
                offset = a.next_begin_offset
            for edge in (10_000, offset, offset + 1):
                assert _pull(files, TOPIC, queue_id, edge) == _pull(remote, TOPIC, queue_id, edge)
            assert _pull(files, TOPIC, queue_id, 0, subscription="NoSuchTag") == \
                _pull(remote, TOPIC, queue_id, 0, subscription="NoSuchTag")
        sample = _pull(files, TOPIC, 1, 300, max_messages=16).messages
        assert sample
        for m in sample:
            view = query_pb2.ViewMessageRequest(msg_id=m.msg_id)
            assert files.ViewMessage(view, timeout=10) == remote.ViewMessage(view, timeout=10)
            keys = m.properties["KEYS"]
            by_key = query_pb2.QueryMessageRequest(topic=TOPIC, key=keys, max_num=8)
            answer = files.QueryMessage(by_key, timeout=10)
            assert [x.msg_id for x in answer.messages] == [m.msg_id]
            assert answer == remote.QueryMessage(by_key, timeout=10)
            for stamp in (m.store_timestamp, m.store_timestamp - 1, m.store_timestamp + 1):
                search = query_pb2.SearchOffsetRequest(topic=TOPIC, queue_id=1, timestamp=stamp)
                assert files.SearchOffset(search, timeout=10) == remote.SearchOffset(search, timeout=10)
        for request in (query_pb2.SearchOffsetRequest(topic=TOPIC, queue_id=0, timestamp=0),
                        query_pb2.SearchOffsetRequest(topic=TOPIC, queue_id=0, timestamp=2**62),
                        query_pb2.SearchOffsetRequest(topic="NoSuchTopic", queue_id=0, timestamp=1)):
            assert files.SearchOffset(request, timeout=10) == remote.SearchOffset(request, timeout=10)
        missing = query_pb2.QueryMessageRequest(topic=TOPIC, key="no-such-key")
        assert files.QueryMessage(missing, timeout=10) == remote.QueryMessage(missing, timeout=10)
    finally:
        assert grpc_query.stop() == 0


# -- a unit written but not published ----------------------------------------------------------------
class PublishingIndexer(indexer_pb2_grpc.IndexerServiceServicer):  # type: ignore[misc]
    """An indexer whose published max offset the test sets; WatchArrivals stays silent."""

    def __init__(self) -> None:
        self.max_offset = 0
        self.stopped = threading.Event()

    def GetQueueOffsets(self, request: Any, context: Any) -> indexer_pb2.QueueOffsets:
        return indexer_pb2.QueueOffsets(topic=request.topic, queue_id=request.queue_id, min_offset=0,
                                        max_offset=self.max_offset)

    def WatchArrivals(self, request: Any, context: Any) -> Iterator[indexer_pb2.Arrival]:
        while context.is_active() and not self.stopped.wait(0.1):
            pass
        return iter(())


@pytest.fixture()
def unpublished(tmp_path: Path) -> Iterator[tuple[PublishingIndexer, Any, QueryProcess, Path]]:
    indexer = PublishingIndexer()
    server = grpc.server(futures.ThreadPoolExecutor(4))
    indexer_pb2_grpc.add_IndexerServiceServicer_to_server(indexer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    env = SMALL.env()
    commitlog = start_commitlog(tmp_path / "broker", env)
    query = start_query(tmp_path / "query", commitlog.address, f"127.0.0.1:{port}", env,
                        extra_args=["--store-root", str(tmp_path / "broker"),
                                    "--indexer-store", str(tmp_path / "indexer")])
    try:
        yield indexer, commitlog, query, tmp_path / "indexer"
    finally:
        indexer.stopped.set()
        try:
            assert query.stop() == 0
            assert commitlog.stop() == 0
        finally:
            server.stop(0)


def test_a_unit_in_the_file_but_not_published_is_not_returned(
        unpublished: tuple[PublishingIndexer, Any, QueryProcess, Path]) -> None:
    indexer, commitlog, query, indexer_root = unpublished
    msgs = [message("Unpublished", 0, f"m{i}".encode()) for i in range(5)]
    results = commitlog.stub.AppendBatch(commitlog_pb2.AppendBatchRequest(messages=msgs), timeout=10).results
    # The indexer's real writer puts all five units; it has published three of them.
    cq = ConsumeQueue(indexer_root / "consumequeue", "Unpublished", 0, SMALL.cq_file_size)
    cq.put_batch([(r.commitlog_offset, r.wrote_bytes, 0, r.queue_offset) for r in results])
    indexer.max_offset = 3
    try:
        response = _pull(query.stub, "Unpublished", 0, 0)
        assert [m.body for m in response.messages] == [b"m0", b"m1", b"m2"]
        assert (response.next_begin_offset, response.max_offset) == (3, 3)
        response = _pull(query.stub, "Unpublished", 0, 3)
        assert Status.Name(response.status) == "GET_MESSAGE_STATUS_OFFSET_OVERFLOW_ONE"
        assert not response.messages
        # Published: a pull at the old bound asks the indexer again and gets the rest.
        indexer.max_offset = 5
        response = _pull(query.stub, "Unpublished", 0, 3)
        assert [m.body for m in response.messages] == [b"m3", b"m4"]
        # A bound past the units in the file (the queue was cut under a stale bound): no unit is invented.
        indexer.max_offset = 7
        response = _pull(query.stub, "Unpublished", 0, 5)
        assert not response.messages
        assert Status.Name(response.status) != "GET_MESSAGE_STATUS_FOUND"
    finally:
        cq.shutdown()


# -- IndexFile read by another process while the indexer writes -------------------------------------
def test_a_read_only_index_reader_follows_slots_past_a_lagging_header(tmp_path: Path) -> None:
    """The indexer writes entry, slot, then header: a reader that sees a slot finds a complete entry,
    even while the header still has the count from before the batch."""
    from services.store.formats.index_file import IndexFile
    from services.store.formats.index_reader import IndexReader
    from services.store.formats.java_hash import index_key_hash_fast

    index_dir = tmp_path / "index"
    index_dir.mkdir()
    writer = IndexFile(index_dir / "20260101000000000", SMALL.hash_slot_num, SMALL.index_num, create=True)
    reader = IndexReader(index_dir, SMALL.hash_slot_num, SMALL.index_num, max_msgs_num_batch=64)
    try:
        now = 1_800_000_000_000
        writer.put_items([(index_key_hash_fast("T#a"), 100, now), (index_key_hash_fast("T#b"), 200, now)])
        assert reader.query_offset("T", "a", 8, 0, 2**62).phy_offsets == [100]
        before = writer.stored_header()
        writer.put_items([(index_key_hash_fast("T#a"), 300, now + 1000)])
        # the header of the batch not written yet: the slot already names the complete new entry
        writer._mm[0:40] = struct.pack(">qqqqii", *dataclasses.astuple(before))
        assert reader.query_offset("T", "a", 8, 0, 2**62).phy_offsets == [300, 100]
        assert reader.query_offset("T", "a", 8, 0, 2**62, skip=1).phy_offsets == [100]
        assert reader.query_offset("T", "b", 8, 0, 2**62).phy_offsets == [200]
        assert reader.query_offset("T", "c", 8, 0, 2**62).phy_offsets == []
    finally:
        reader.close()
        writer.close()


# -- a commitlog truncated under a running indexer -------------------------------------------------
def test_pulls_after_the_commitlog_lost_a_tail_return_the_new_records(tmp_path: Path) -> None:
    """The indexer cuts its queues and announces it on the arrival stream: bounds learned before are
    forgotten, and the queue offsets of the lost records are served from the records written since."""
    env = {"MQSTORE_MAPPED_FILE_SIZE_COMMIT_LOG": str(1024 * 1024), "MQSTORE_RECOVER_CORRUPTION_MODE": "cut"}
    system = System.start(tmp_path, env, read_from="files")
    try:
        old = system.append([message("Cut", i % 2, b"o" * 300) for i in range(100)])
        assert len(_pull(system.query.stub, "Cut", 0, 0, max_messages=64).messages) == 50  # bounds learned
        cut = old[60].commitlog_offset
        system.commitlog.kill9()
        with open(tmp_path / "broker" / "commitlog" / f"{0:020d}", "r+b") as f:  # record 60 damaged: cut there
            f.seek(cut + 100)
            f.write(b"\xff\xff\xff")
        system.commitlog = start_commitlog(tmp_path / "broker", env, port=system.commitlog.port)
        new = system.append([message("Cut", i % 2, b"n" * 777) for i in range(50)])
        assert new[0].commitlog_offset == cut
        for queue_id in (0, 1):
            response = _pull(system.query.stub, "Cut", queue_id, 0, max_messages=64)
            got = [(m.queue_offset, m.body, m.commitlog_offset) for m in response.messages]
            want = [(r.queue_offset, b"o" * 300, r.commitlog_offset) for r in old[:60] if r.queue_id == queue_id]
            want += [(r.queue_offset, b"n" * 777, r.commitlog_offset) for r in new if r.queue_id == queue_id]
            assert got == want
            assert response.max_offset == 55
    finally:
        try:
            system.stop()
        finally:
            system.kill_all()
