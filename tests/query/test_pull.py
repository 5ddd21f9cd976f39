"""PullMessage against real services: every status with RocketMQ's next begin offset, tag filtering
(with a tags-code collision), decoded fields, and long polling woken by the indexer's arrivals."""

from __future__ import annotations

import threading
import time
import zlib
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from mqstore.v1 import commitlog_pb2, common_pb2, query_pb2
from services.store.formats.java_hash import java_string_hash
from tests.geometry import BOTH, drop_preallocated_files, geometry_id
from tests.query.query_process import System, message, running_system

Status = query_pb2.GetMessageStatus


@pytest.fixture(scope="module", params=BOTH, ids=geometry_id)
def system(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    """The package's ``system`` fixture, once in each geometry (tests/geometry.py)."""
    root = tmp_path_factory.mktemp("query-system")
    try:
        with running_system(root, request.param.env()) as started:
            yield started
    finally:
        drop_preallocated_files(root)


def pull(system: System, topic: str, offset: int, queue_id: int = 0, timeout: float = 10,
         **fields: Any) -> query_pb2.PullMessageResponse:
    request = query_pb2.PullMessageRequest(topic=topic, queue_id=queue_id, queue_offset=offset, **fields)
    response: query_pb2.PullMessageResponse = system.query.stub.PullMessage(request, timeout=timeout)
    return response


def outcome(response: query_pb2.PullMessageResponse) -> tuple[str, int, int, int]:
    return Status.Name(response.status), response.next_begin_offset, response.min_offset, response.max_offset


def test_unknown_queue_is_an_empty_queue(system: System) -> None:
    assert outcome(pull(system, "PullNever", 0)) == ("GET_MESSAGE_STATUS_NO_MESSAGE_IN_QUEUE", 0, 0, 0)
    started = time.monotonic()
    # A consumer past the end of an empty queue is sent back to 0 at once, long poll or not.
    assert outcome(pull(system, "PullNever", 7, long_poll_ms=3000)) == ("GET_MESSAGE_STATUS_NO_MESSAGE_IN_QUEUE",
                                                                       0, 0, 0)
    assert time.monotonic() - started < 1.0


def test_statuses_and_next_begin_offsets(system: System) -> None:
    system.append([message("PullStatus", 0, f"m{i}".encode(), TAGS="TagA" if i % 2 else "TagB") for i in range(5)])
    first = pull(system, "PullStatus", 0, max_messages=2)
    assert outcome(first) == ("GET_MESSAGE_STATUS_FOUND", 2, 0, 5)
    assert [(m.queue_offset, m.body) for m in first.messages] == [(0, b"m0"), (1, b"m1")]
    rest = pull(system, "PullStatus", 2)
    assert outcome(rest) == ("GET_MESSAGE_STATUS_FOUND", 5, 0, 5)
    assert [m.queue_offset for m in rest.messages] == [2, 3, 4]
    assert outcome(pull(system, "PullStatus", 5)) == ("GET_MESSAGE_STATUS_OFFSET_OVERFLOW_ONE", 5, 0, 5)
    # 4.9.8: overshooting a queue whose min offset is 0 sends the consumer back to 0.
    assert outcome(pull(system, "PullStatus", 9)) == ("GET_MESSAGE_STATUS_OFFSET_OVERFLOW_BADLY", 0, 0, 5)
    # Everything filtered out: the next begin offset still moves past what was scanned.
    assert outcome(pull(system, "PullStatus", 0, subscription="TagC")) == \
        ("GET_MESSAGE_STATUS_NO_MATCHED_MESSAGE", 5, 0, 5)
    tag_a = pull(system, "PullStatus", 0, subscription=" TagA ||TagZ ")
    assert outcome(tag_a) == ("GET_MESSAGE_STATUS_FOUND", 5, 0, 5)
    assert [m.queue_offset for m in tag_a.messages] == [1, 3]
    # The batch stops at max messages: units after it are not walked (the next pull starts there).
    assert outcome(pull(system, "PullStatus", 0, subscription="TagA", max_messages=1)) == \
        ("GET_MESSAGE_STATUS_FOUND", 2, 0, 5)


def test_max_bytes_cuts_the_batch_but_the_first_message_always_fits(system: System) -> None:
    system.append([message("PullBytes", 0, bytes(300)) for _ in range(4)])
    size = pull(system, "PullBytes", 0, max_messages=1).messages[0].store_size
    assert outcome(pull(system, "PullBytes", 0, max_bytes=1)) == ("GET_MESSAGE_STATUS_FOUND", 1, 0, 4)
    assert outcome(pull(system, "PullBytes", 0, max_bytes=2 * size)) == ("GET_MESSAGE_STATUS_FOUND", 2, 0, 4)
    assert outcome(pull(system, "PullBytes", 1, max_bytes=2 * size + 1)) == ("GET_MESSAGE_STATUS_FOUND", 3, 0, 4)


def test_tags_code_collision_does_not_leak(system: System) -> None:
    assert java_string_hash("Aa") == java_string_hash("BB")
    tags = ["Aa", "BB", "Aa", "BB", "TagA", "BB"]
    system.append([message("PullCollide", 1, t.encode(), TAGS=t) for t in tags])
    for expression, expected in [("Aa", [0, 2]), ("BB", [1, 3, 5]), ("Aa || TagA", [0, 2, 4]), ("*", list(range(6)))]:
        response = pull(system, "PullCollide", 0, queue_id=1, subscription=expression)
        assert outcome(response) == ("GET_MESSAGE_STATUS_FOUND", 6, 0, 6), expression
        assert [m.queue_offset for m in response.messages] == expected, expression
        assert all(m.tags == tags[m.queue_offset] for m in response.messages)
    # Only collisions in the window: every record read, none returned, all walked.
    only = pull(system, "PullCollide", 4, queue_id=1, subscription="Aa")
    assert outcome(only) == ("GET_MESSAGE_STATUS_NO_MATCHED_MESSAGE", 6, 0, 6)


def test_messages_come_back_fully_decoded(system: System) -> None:
    plain = b"plain text body " * 10
    packed = zlib.compress(b"compressed body " * 500, 5)
    sent = [
        common_pb2.Message(topic="PullFields", queue_id=2, body=plain, flag=7, born_timestamp=1_700_000_000_123,
                           born_host="10.1.2.3:4567", reconsume_times=3,
                           properties={"TAGS": "TagA", "KEYS": "k1 k2", "UNIQ_KEY": "0A0102030000AAAA0000000000000001",
                                       "desc": "héllo 🚀"}),
        common_pb2.Message(topic="PullFields", queue_id=2, body=packed, sys_flag=0x1, born_host="127.0.0.1:1"),
    ]
    results = system.append(sent)
    response = pull(system, "PullFields", 0, queue_id=2)
    first, second = response.messages
    assert (first.topic, first.queue_id, first.queue_offset, first.commitlog_offset, first.msg_id) == \
        ("PullFields", 2, 0, results[0].commitlog_offset, results[0].msg_id)
    assert (first.tags, first.keys, first.uniq_key) == ("TagA", "k1 k2", "0A0102030000AAAA0000000000000001")
    assert dict(first.properties) == dict(sent[0].properties)
    assert (first.flag, first.born_timestamp, first.born_host, first.reconsume_times, first.sys_flag) == \
        (7, 1_700_000_000_123, "10.1.2.3:4567", 3, 0)
    assert first.store_timestamp == results[0].store_timestamp
    assert first.store_host == "127.0.0.1:10911" and first.store_size == results[0].wrote_bytes
    assert first.body == plain and first.body_crc == zlib.crc32(plain) & 0x7FFFFFFF and not first.body_compressed
    # Inflated as the consumer sees it; the flag and the CRC stay those of the stored (compressed) body.
    assert second.body == b"compressed body " * 500 and not second.body_compressed
    assert second.sys_flag & 0x1 and second.body_crc == zlib.crc32(packed) & 0x7FFFFFFF


def _pull_in_thread(system: System, topic: str, offset: int, **fields: Any) -> tuple[threading.Thread, dict[str, Any]]:
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["response"] = pull(system, topic, offset, timeout=30, **fields)
        except grpc.RpcError as exc:
            box["error"] = exc
        box["returned"] = time.monotonic()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, box


def _warm_up_arrivals(system: System, topic: str) -> None:
    """A long poll woken once: the query service follows the indexer's arrival stream from then on."""
    thread, box = _pull_in_thread(system, topic, 0, long_poll_ms=10_000)
    time.sleep(0.2)
    system.commitlog.stub.Append(_append_request(topic, b"warm"), timeout=5)
    thread.join(15)
    assert Status.Name(box["response"].status) == "GET_MESSAGE_STATUS_FOUND", box


def _append_request(topic: str, body: bytes, **properties: str) -> commitlog_pb2.AppendRequest:
    return commitlog_pb2.AppendRequest(message=message(topic, 0, body, **properties))


def test_long_poll_wakes_within_milliseconds_of_an_arrival(system: System) -> None:
    _warm_up_arrivals(system, "PullWake")
    latencies = []
    for round_ in range(5):
        offset = round_ + 1
        thread, box = _pull_in_thread(system, "PullWake", offset, long_poll_ms=10_000)
        time.sleep(0.3)
        assert thread.is_alive(), "the pull must wait while the queue has nothing new"
        system.commitlog.stub.Append(_append_request("PullWake", f"r{round_}".encode()), timeout=5)
        appended = time.monotonic()
        thread.join(15)
        response = box["response"]
        assert outcome(response) == ("GET_MESSAGE_STATUS_FOUND", offset + 1, 0, offset + 1)
        latencies.append(box["returned"] - appended)
    latencies.sort()
    print(f"long-poll wake latency after the append returned: median {latencies[2] * 1000:.1f} ms, "
          f"max {latencies[-1] * 1000:.1f} ms")
    # The append -> Tail -> dispatch -> arrival -> pull path, far below the 10 s the pulls could wait.
    assert latencies[2] < 0.1 and latencies[-1] < 1.0


def test_long_poll_times_out_with_nothing_new(system: System) -> None:
    system.append([message("PullTimeout", 0)])
    started = time.monotonic()
    response = pull(system, "PullTimeout", 1, long_poll_ms=400)
    elapsed = time.monotonic() - started
    assert outcome(response) == ("GET_MESSAGE_STATUS_OFFSET_OVERFLOW_ONE", 1, 0, 1)
    assert 0.38 <= elapsed < 1.5
    # A call deadline shorter than the long poll ends the wait in time for an answer, not an error.
    started = time.monotonic()
    response = pull(system, "PullTimeout", 1, long_poll_ms=10_000, timeout=1.0)
    assert Status.Name(response.status) == "GET_MESSAGE_STATUS_OFFSET_OVERFLOW_ONE"
    assert time.monotonic() - started < 1.0


def test_long_poll_with_a_filter_waits_for_a_matching_message(system: System) -> None:
    _warm_up_arrivals(system, "PullFiltered")
    thread, box = _pull_in_thread(system, "PullFiltered", 1, long_poll_ms=10_000, subscription="TagX")
    time.sleep(0.2)
    system.commitlog.stub.Append(_append_request("PullFiltered", b"other", TAGS="TagY"), timeout=5)
    time.sleep(0.3)
    assert thread.is_alive(), "a message that does not match must not end the wait"
    system.commitlog.stub.Append(_append_request("PullFiltered", b"mine", TAGS="TagX"), timeout=5)
    thread.join(15)
    response = box["response"]
    assert outcome(response) == ("GET_MESSAGE_STATUS_FOUND", 3, 0, 3)
    assert [(m.queue_offset, m.body) for m in response.messages] == [(2, b"mine")]
    # Timed out after filtering: the progress made is reported as NO_MATCHED_MESSAGE.
    system.append([message("PullFiltered", 0, b"n", TAGS="TagY")])
    response = pull(system, "PullFiltered", 3, long_poll_ms=300, subscription="TagX")
    assert outcome(response) == ("GET_MESSAGE_STATUS_NO_MATCHED_MESSAGE", 4, 0, 4)


@pytest.mark.parametrize("fields", [
    {"long_poll_ms": 15_001}, {"long_poll_ms": -1}, {"max_messages": 1025}, {"max_bytes": 32 * 1024 * 1024 + 1},
    {"subscription": "||"},
])
def test_out_of_bounds_pulls_are_invalid(system: System, fields: dict[str, Any]) -> None:
    with pytest.raises(grpc.RpcError) as info:
        pull(system, "PullStatus", 0, **fields)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details()
