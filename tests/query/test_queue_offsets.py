"""Offset by time, the offset range and the earliest store time of a queue, against real services."""

from __future__ import annotations

import time

import grpc
import pytest

from mqstore.v1 import query_pb2
from tests.query.query_process import System, message


def test_offsets_of_a_queue(system: System) -> None:
    stamps = []
    for i in range(6):
        stamps.append(system.append([message("Offsets", 3, f"o{i}".encode())])[0].store_timestamp)
        time.sleep(0.003)
    stub = system.query.stub
    span = stub.GetQueueOffsetRange(query_pb2.GetQueueOffsetRangeRequest(topic="Offsets", queue_id=3), timeout=5)
    assert (span.topic, span.queue_id, span.min_offset, span.max_offset) == ("Offsets", 3, 0, 6)
    for i, stamp in enumerate(stamps):
        found = stub.SearchOffset(query_pb2.SearchOffsetRequest(topic="Offsets", queue_id=3, timestamp=stamp))
        assert stamps[found.offset] == stamp, i  # the nearest unit; equal store times go to the earliest
    before = stub.SearchOffset(query_pb2.SearchOffsetRequest(topic="Offsets", queue_id=3, timestamp=0))
    assert before.offset == 0
    earliest = stub.GetEarliestMsgStoreTime(query_pb2.GetEarliestMsgStoreTimeRequest(topic="Offsets", queue_id=3))
    assert earliest.store_timestamp == stamps[0]


def test_an_unknown_queue_is_empty(system: System) -> None:
    stub = system.query.stub
    span = stub.GetQueueOffsetRange(query_pb2.GetQueueOffsetRangeRequest(topic="OffsetsNone", queue_id=0))
    assert (span.min_offset, span.max_offset) == (0, 0)
    assert stub.SearchOffset(query_pb2.SearchOffsetRequest(topic="OffsetsNone", timestamp=123)).offset == 0
    with pytest.raises(grpc.RpcError) as info:
        stub.GetEarliestMsgStoreTime(query_pb2.GetEarliestMsgStoreTimeRequest(topic="OffsetsNone", queue_id=0))
    assert info.value.code() == grpc.StatusCode.NOT_FOUND and "OffsetsNone/0" in str(info.value.details())
