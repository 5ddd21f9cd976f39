"""The indexer's gRPC surface beyond the fixture data: arrivals, offset by time, health, reflection."""

from __future__ import annotations

import queue
import threading
import time
from pathlib import Path

import grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from mqstore.v1 import commitlog_pb2, common_pb2, indexer_pb2
from tests.commitlog.commitlog_process import StartCommitLog
from tests.geometry import GeometryPreset
from tests.indexer.indexer_process import start_indexer


def test_arrivals_offset_by_time_and_reflection(store_geometry: GeometryPreset, start_commitlog: StartCommitLog,
                                                tmp_path: Path) -> None:
    commitlog = start_commitlog(tmp_path / "broker", store_geometry.env())
    indexer = start_indexer(tmp_path / "indexer", commitlog.address, store_geometry.env())
    arrivals: queue.Queue[indexer_pb2.Arrival] = queue.Queue()
    watch = indexer.stub.WatchArrivals(indexer_pb2.WatchArrivalsRequest())

    def collect() -> None:
        try:
            for arrival in watch:
                arrivals.put(arrival)
        except grpc.RpcError as exc:  # the test cancels the stream when done
            assert exc.code() == grpc.StatusCode.CANCELLED

    reader = threading.Thread(target=collect, daemon=True)
    reader.start()
    try:
        time.sleep(0.3)  # the subscription is registered once the stream is open
        stamps = []
        for i in range(6):
            result = commitlog.stub.Append(commitlog_pb2.AppendRequest(message=common_pb2.Message(
                topic="Watched", queue_id=1, body=f"m{i}".encode())))
            stamps.append(result.store_timestamp)
            time.sleep(0.01)
        seen: dict[tuple[str, int], int] = {}
        deadline = time.monotonic() + 10
        while seen.get(("Watched", 1), 0) < 6 and time.monotonic() < deadline:
            try:
                a = arrivals.get(timeout=0.5)
            except queue.Empty:
                continue
            seen[(a.topic, a.queue_id)] = max(seen.get((a.topic, a.queue_id), 0), a.max_offset)
        assert seen[("Watched", 1)] == 6

        by_time = indexer.stub.GetOffsetByTime(indexer_pb2.GetOffsetByTimeRequest(
            topic="Watched", queue_id=1, timestamp=stamps[3]))
        assert stamps[by_time.offset] == stamps[3]  # the nearest entry (ties go to the earlier one)
        assert indexer.stub.GetOffsetByTime(indexer_pb2.GetOffsetByTimeRequest(
            topic="Watched", queue_id=1, timestamp=0)).offset == 0

        queues = indexer.stub.ListQueues(indexer_pb2.ListQueuesRequest()).queues
        assert [(q.topic, q.queue_id, q.max_offset) for q in queues] == [("Watched", 1, 6)]

        services = reflection_pb2_grpc.ServerReflectionStub(indexer.channel).ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
        names = {s.name for response in services for s in response.list_services_response.service}
        assert {"mqstore.v1.IndexerService", "grpc.health.v1.Health"} <= names
    finally:
        watch.cancel()
        reader.join(5)
        assert indexer.stop() == 0
