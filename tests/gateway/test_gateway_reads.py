"""Reads and admin through the gateway: pull, lookups, offsets, consumer offsets, topics (real processes)."""

from __future__ import annotations

import time

import grpc
import pytest

from mqstore.v1 import commitlog_pb2, common_pb2, gateway_pb2, query_pb2
from services.store.formats.message_id import make_message_id
from tests.gateway.system_process import UpProcess
from tests.waiting import eventually_found


def sent(up: UpProcess, topic: str, count: int, **properties: str) -> list[gateway_pb2.SendResult]:
    messages = [common_pb2.Message(topic=topic, body=f"{topic}-{i}".encode(), properties=properties)
                for i in range(count)]
    return list(up.stub.SendBatch(gateway_pb2.SendBatchRequest(messages=messages, queue_id=0), timeout=10).results)


def rpc_error(call: object, request: object) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as error:
        call(request, timeout=10)  # type: ignore[operator]
    return error.value


def indexed(up: UpProcess, topic: str, count: int, timeout_s: float = 10.0) -> None:
    """Wait until queue 0 of ``topic`` has ``count`` units: the indexer follows the commitlog by a few
    milliseconds, and a pull before it catches up rightly answers what is indexed so far."""
    deadline = time.monotonic() + timeout_s
    request = query_pb2.GetQueueOffsetRangeRequest(topic=topic, queue_id=0)
    while up.stub.GetQueueOffsets(request, timeout=10).max_offset < count:
        assert time.monotonic() < deadline, f"{topic} queue 0 did not reach {count} units"
        time.sleep(0.02)


def test_pull_reads_what_was_sent_with_tag_filter_and_long_poll(up: UpProcess) -> None:
    sent(up, "pull", 3, TAGS="TagA")
    sent(up, "pull", 2, TAGS="TagB")
    indexed(up, "pull", 5)
    response = up.stub.Pull(query_pb2.PullMessageRequest(topic="pull", queue_id=0, queue_offset=0,
                                                         subscription="TagB"), timeout=10)
    assert response.status == query_pb2.GET_MESSAGE_STATUS_FOUND
    assert [m.tags for m in response.messages] == ["TagB", "TagB"] and response.next_begin_offset == 5
    started = time.monotonic()
    caught_up = up.stub.Pull(query_pb2.PullMessageRequest(topic="pull", queue_id=0, queue_offset=5,
                                                          long_poll_ms=300), timeout=10)
    assert caught_up.status == query_pb2.GET_MESSAGE_STATUS_OFFSET_OVERFLOW_ONE
    assert time.monotonic() - started >= 0.25, "a long poll waits when there is nothing to return"


def test_get_message_by_either_id_kind(up: UpProcess) -> None:
    result = sent(up, "lookup", 1)[0]
    by_uniq = eventually_found(
        lambda: up.stub.GetMessage(query_pb2.ViewMessageRequest(msg_id=result.msg_id), timeout=10))
    by_offset = up.stub.GetMessage(query_pb2.ViewMessageRequest(msg_id=result.offset_msg_id), timeout=10)
    assert by_uniq.message == by_offset.message
    assert by_uniq.found_by == query_pb2.MESSAGE_ID_KIND_UNIQ_KEY
    assert by_offset.found_by == query_pb2.MESSAGE_ID_KIND_OFFSET


def test_an_offset_id_of_another_store_host_is_not_found_naming_it(up: UpProcess) -> None:
    other = make_message_id("10.9.8.7:10911", 0)
    error = rpc_error(up.stub.GetMessage, query_pb2.ViewMessageRequest(msg_id=other,
                                                                        kind=query_pb2.MESSAGE_ID_KIND_OFFSET))
    assert error.code() == grpc.StatusCode.NOT_FOUND
    assert "10.9.8.7:10911" in (error.details() or "") and "shard-0" in (error.details() or "")


def test_query_by_key_and_offset_by_time(up: UpProcess) -> None:
    before = int(time.time() * 1000)
    results = sent(up, "keyed", 4, KEYS="order-42 other")
    deadline = time.monotonic() + 10
    found: list[query_pb2.StoredMessage] = []
    while time.monotonic() < deadline and len(found) < 4:  # the index follows the commitlog
        found = list(up.stub.QueryByKey(query_pb2.QueryMessageRequest(topic="keyed", key="order-42"),
                                        timeout=10).messages)
        time.sleep(0.05)
    assert sorted(m.msg_id for m in found) == sorted(r.offset_msg_id for r in results)
    offset = up.stub.SearchOffset(query_pb2.SearchOffsetRequest(topic="keyed", queue_id=0, timestamp=before),
                                  timeout=10)
    assert offset.offset == 0
    offsets = up.stub.GetQueueOffsets(query_pb2.GetQueueOffsetRangeRequest(topic="keyed", queue_id=0), timeout=10)
    assert (offsets.queue_id, offsets.min_offset, offsets.max_offset) == (0, 0, 4)


def test_consumer_offsets_commit_and_query(up: UpProcess) -> None:
    sent(up, "consumed", 3)
    indexed(up, "consumed", 3)  # a commit past what is dispatched is refused (OUT_OF_RANGE), rightly
    key = {"consumer_group": "g1", "topic": "consumed", "queue_id": 0}
    error = rpc_error(up.stub.QueryOffset, query_pb2.QueryConsumerOffsetRequest(**key))  # type: ignore[arg-type]
    assert error.code() == grpc.StatusCode.NOT_FOUND
    up.stub.CommitOffset(query_pb2.UpdateConsumerOffsetRequest(offset=2, **key), timeout=10)  # type: ignore[arg-type]
    assert up.stub.QueryOffset(query_pb2.QueryConsumerOffsetRequest(**key), timeout=10).offset == 2  # type: ignore[arg-type]


def test_topic_admin(up: UpProcess) -> None:
    config = common_pb2.TopicConfig(topic="admin", read_queue_nums=2, write_queue_nums=2, perm=6)
    assert up.stub.CreateTopic(commitlog_pb2.TopicRequest(topic=config), timeout=10) == config
    error = rpc_error(up.stub.CreateTopic, commitlog_pb2.TopicRequest(topic=config))
    assert error.code() == grpc.StatusCode.ALREADY_EXISTS
    route = up.stub.GetRoute(gateway_pb2.GetRouteRequest(topic="admin"), timeout=10)
    assert [q.queue_id for q in route.queues] == [0, 1]
    wider = common_pb2.TopicConfig(topic="admin", read_queue_nums=4, write_queue_nums=4, perm=6)
    up.stub.UpdateTopic(commitlog_pb2.TopicRequest(topic=wider), timeout=10)
    assert len(up.stub.GetRoute(gateway_pb2.GetRouteRequest(topic="admin"), timeout=10).queues) == 4
    listed = {t.topic: t for t in up.stub.ListTopics(commitlog_pb2.ListTopicsRequest(), timeout=10).topics}
    assert listed["admin"].write_queue_nums == 4
    read_only = common_pb2.TopicConfig(topic="admin", read_queue_nums=4, write_queue_nums=4, perm=4)
    up.stub.UpdateTopic(commitlog_pb2.TopicRequest(topic=read_only), timeout=10)
    error = rpc_error(up.stub.Send, gateway_pb2.SendRequest(message=common_pb2.Message(topic="admin", body=b"x")))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION and "no writable queue" in (error.details() or "")


@pytest.mark.parametrize("call, request_, code, fragment", [
    ("Pull", query_pb2.PullMessageRequest(topic="never-created", queue_id=0), grpc.StatusCode.NOT_FOUND,
     "does not exist"),
    ("Pull", query_pb2.PullMessageRequest(topic="pull", queue_id=99), grpc.StatusCode.OUT_OF_RANGE, "0..7"),
    ("Pull", query_pb2.PullMessageRequest(topic="pull", queue_id=-1), grpc.StatusCode.INVALID_ARGUMENT, "queue id -1"),
    ("Pull", query_pb2.PullMessageRequest(topic="pull", queue_id=0, queue_offset=-5),
     grpc.StatusCode.INVALID_ARGUMENT, "negative"),
    ("Pull", query_pb2.PullMessageRequest(topic="pull", queue_id=0, max_messages=5000),
     grpc.StatusCode.INVALID_ARGUMENT, "1024"),
    ("GetMessage", query_pb2.ViewMessageRequest(msg_id=""), grpc.StatusCode.INVALID_ARGUMENT, "empty"),
    ("GetMessage", query_pb2.ViewMessageRequest(msg_id="XYZ"), grpc.StatusCode.INVALID_ARGUMENT, "hex digits"),
    ("GetMessage", query_pb2.ViewMessageRequest(msg_id="0" * 32), grpc.StatusCode.NOT_FOUND, ""),
    ("QueryByKey", query_pb2.QueryMessageRequest(topic="pull", key=""), grpc.StatusCode.INVALID_ARGUMENT, "key"),
    ("CommitOffset", query_pb2.UpdateConsumerOffsetRequest(consumer_group="", topic="pull"),
     grpc.StatusCode.INVALID_ARGUMENT, "group"),
    ("CreateTopic", commitlog_pb2.TopicRequest(topic=common_pb2.TopicConfig(topic="q", read_queue_nums=0,
                                                                            write_queue_nums=1, perm=6)),
     grpc.StatusCode.INVALID_ARGUMENT, "read_queue_nums"),
    ("UpdateTopic", commitlog_pb2.TopicRequest(topic=common_pb2.TopicConfig(topic="nope-never", read_queue_nums=1,
                                                                            write_queue_nums=1, perm=6)),
     grpc.StatusCode.NOT_FOUND, "nope-never"),
    ("GetRoute", gateway_pb2.GetRouteRequest(topic="%%%bad topic"), grpc.StatusCode.INVALID_ARGUMENT, "illegal"),
])
def test_bad_reads_are_refused_with_the_right_code(up: UpProcess, call: str, request_: object,
                                                   code: grpc.StatusCode, fragment: str) -> None:
    sent(up, "pull", 1)
    error = rpc_error(getattr(up.stub, call), request_)
    assert error.code() == code, error.details()
    assert fragment in (error.details() or "")
