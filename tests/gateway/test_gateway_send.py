"""Sends through the gateway: queue selection, UNIQ_KEY, batches and streams (real processes)."""

from __future__ import annotations

import collections
import time

import grpc
import pytest

from mqstore.v1 import commitlog_pb2, common_pb2, gateway_pb2, query_pb2
from services.store.formats.java_hash import java_string_hash
from services.store.formats.uniq_key import decode_uniq_key
from tests.gateway.system_process import UpProcess
from tests.waiting import eventually_found

PUT_OK = commitlog_pb2.PUT_MESSAGE_STATUS_PUT_OK


def send(up: UpProcess, topic: str, body: bytes = b"x", **kwargs: object) -> gateway_pb2.SendResult:
    properties = kwargs.pop("properties", {})
    request = gateway_pb2.SendRequest(message=common_pb2.Message(topic=topic, body=body, properties=properties),
                                      **kwargs)  # type: ignore[arg-type]
    return up.stub.Send(request, timeout=10)


def pull_all(up: UpProcess, topic: str, queue_id: int, until: int = 0) -> list[query_pb2.StoredMessage]:
    """Every message of a queue; with ``until``, long polls until the queue has that many (the indexer
    dispatches a moment after the commitlog acknowledges)."""
    messages: list[query_pb2.StoredMessage] = []
    offset = 0
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        response = up.stub.Pull(query_pb2.PullMessageRequest(topic=topic, queue_id=queue_id, queue_offset=offset,
                                                             max_messages=1024,
                                                             long_poll_ms=2000 if offset < until else 0), timeout=10)
        if response.status != query_pb2.GET_MESSAGE_STATUS_FOUND:
            if offset >= until:
                return messages
            continue
        messages.extend(response.messages)
        offset = response.next_begin_offset
    raise AssertionError(f"{topic}:{queue_id} did not reach offset {until}: it has {offset}")


def test_every_message_gets_a_uniq_key_in_the_client_layout(up: UpProcess) -> None:
    results = [send(up, "uniq") for _ in range(5)]
    ids = [r.msg_id for r in results]
    assert len(set(ids)) == 5 and all(len(i) == 32 and i == i.upper() for i in ids)
    first = decode_uniq_key(ids[0])
    assert first.ip == "127.0.0.1"
    assert [decode_uniq_key(i).counter for i in ids] == [first.counter + k for k in range(5)]
    # The message is stored with it: found by the id its producer got back.
    found = eventually_found(
        lambda: up.stub.GetMessage(query_pb2.ViewMessageRequest(msg_id=ids[2]), timeout=10)).message
    assert found.uniq_key == ids[2] and found.msg_id == results[2].offset_msg_id


def test_a_producer_uniq_key_is_kept(up: UpProcess) -> None:
    mine = "0A0000010001000000010000000000AB"
    result = send(up, "uniq-own", properties={"UNIQ_KEY": mine})
    assert result.msg_id == mine
    found = eventually_found(lambda: up.stub.GetMessage(query_pb2.ViewMessageRequest(msg_id=mine), timeout=10))
    assert found.message.uniq_key == mine


def test_born_host_is_the_producer_not_the_gateway(up: UpProcess) -> None:
    result = send(up, "born")
    message = up.stub.GetMessage(query_pb2.ViewMessageRequest(msg_id=result.offset_msg_id), timeout=10).message
    host, _, port = message.born_host.rpartition(":")
    assert host == "127.0.0.1" and int(port) != up.base_port


def test_round_robin_spreads_sends_over_every_queue(up: UpProcess) -> None:
    queues = collections.Counter(send(up, "spread").queue_id for _ in range(32))
    assert sorted(queues) == list(range(8)) and set(queues.values()) == {4}


def test_a_sharding_key_keeps_order_on_one_queue(up: UpProcess) -> None:
    """RocketMQ's SelectMessageQueueByHash: Java hashCode of the key modulo the writable queues."""
    last_offsets = {}
    for key in ("order-1", "order-2", "客户-7", "Aa", "BB"):
        results = [send(up, "ordered", f"{key}:{i}".encode(), sharding_key=key) for i in range(6)]
        expected = abs(java_string_hash(key)) % 8  # Java: abs(hashCode % 8)
        assert {r.queue_id for r in results} == {expected}
        offsets = [r.queue_offset for r in results]
        assert offsets == sorted(offsets) and len(set(offsets)) == 6
        last_offsets[key] = offsets[-1]
    queue = abs(java_string_hash("order-1")) % 8
    stored = [m.body for m in pull_all(up, "ordered", queue, until=last_offsets["order-1"] + 1)]
    assert [b for b in stored if b.startswith(b"order-1:")] == [f"order-1:{i}".encode() for i in range(6)]


def test_an_explicit_queue_is_honoured_and_checked(up: UpProcess) -> None:
    assert send(up, "explicit", queue_id=5).queue_id == 5
    with pytest.raises(grpc.RpcError) as error:
        send(up, "explicit", queue_id=8)
    assert error.value.code() == grpc.StatusCode.OUT_OF_RANGE
    assert "0..7" in (error.value.details() or "")


def test_a_batch_goes_to_one_queue_with_dense_offsets(up: UpProcess) -> None:
    messages = [common_pb2.Message(topic="batch", body=f"m{i}".encode(), properties={"KEYS": f"k{i}"})
                for i in range(300)]
    response = up.stub.SendBatch(gateway_pb2.SendBatchRequest(messages=messages), timeout=10)
    assert {r.status for r in response.results} == {PUT_OK}
    assert len({r.queue_id for r in response.results}) == 1
    offsets = [r.queue_offset for r in response.results]
    assert offsets == list(range(offsets[0], offsets[0] + 300))
    assert len({r.msg_id for r in response.results}) == 300
    stored = pull_all(up, "batch", response.results[0].queue_id, until=offsets[-1] + 1)
    assert [m.body for m in stored][-300:] == [m.body for m in messages]


def test_a_bad_batch_names_the_message_and_writes_nothing(up: UpProcess) -> None:
    good = common_pb2.Message(topic="batch-bad", body=b"ok")
    before = up.store_state()  # the commitlog's end and its topics
    for messages, fragment in (
            ([good, common_pb2.Message(topic="other", body=b"x")], "message #1"),
            ([good, good, common_pb2.Message(topic="batch-bad", body=b"x", properties={"A\x01": "b"})], "#2"),
            ([], "empty")):
        with pytest.raises(grpc.RpcError) as error:
            up.stub.SendBatch(gateway_pb2.SendBatchRequest(messages=messages), timeout=10)
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert fragment in (error.value.details() or "")
    assert up.store_state() == before


def test_a_stream_acknowledges_every_message_in_order(up: UpProcess) -> None:
    count = 2000
    requests = (gateway_pb2.SendRequest(message=common_pb2.Message(topic="stream", body=f"s{i}".encode()))
                for i in range(count))
    results = list(up.stub.SendStream(requests, timeout=60))
    assert len(results) == count and {r.status for r in results} == {PUT_OK}
    per_queue: dict[int, list[int]] = collections.defaultdict(list)
    for r in results:
        per_queue[r.queue_id].append(r.queue_offset)
    assert all(offsets == list(range(offsets[0], offsets[0] + len(offsets))) for offsets in per_queue.values())
    bodies = {m.body for q, offsets in per_queue.items() for m in pull_all(up, "stream", q, until=offsets[-1] + 1)}
    assert bodies == {f"s{i}".encode() for i in range(count)}


def test_a_bad_message_ends_the_stream_naming_its_sequence_number(up: UpProcess) -> None:
    def requests():  # type: ignore[no-untyped-def]
        for i in range(10):
            yield gateway_pb2.SendRequest(message=common_pb2.Message(topic="stream-bad" if i != 7 else "bad topic!",
                                                                     body=b"x"))
    received = []
    with pytest.raises(grpc.RpcError) as error:
        for result in up.stub.SendStream(requests(), timeout=30):
            received.append(result)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "message #7" in (error.value.details() or "")
    # Everything acknowledged before it is stored; nothing from #7 on.
    assert len(received) <= 7
    last = {r.queue_id: r.queue_offset + 1 for r in received}
    stored = sum(len(pull_all(up, "stream-bad", q, until=last.get(q, 0))) for q in range(8))
    time.sleep(0.3)  # anything more would have been dispatched by now
    assert stored == len(received) == sum(len(pull_all(up, "stream-bad", q)) for q in range(8))


@pytest.mark.parametrize("message, code, fragment", [
    (common_pb2.Message(topic="", body=b"x"), grpc.StatusCode.INVALID_ARGUMENT, "topic is empty"),
    (common_pb2.Message(topic="a b", body=b"x"), grpc.StatusCode.INVALID_ARGUMENT, "illegal characters"),
    (common_pb2.Message(topic="t", body=b""), grpc.StatusCode.INVALID_ARGUMENT, "body"),
    (common_pb2.Message(topic="t", body=b"x" * (65 * 1024)), grpc.StatusCode.INVALID_ARGUMENT, "maxMessageSize"),
])
def test_bad_sends_say_what_to_fix(up: UpProcess, message: common_pb2.Message, code: grpc.StatusCode,
                                   fragment: str) -> None:
    with pytest.raises(grpc.RpcError) as error:
        up.stub.Send(gateway_pb2.SendRequest(message=message), timeout=10)
    assert error.value.code() == code
    assert fragment in (error.value.details() or "")


def test_the_route_lists_the_queues_of_the_one_shard(up: UpProcess) -> None:
    send(up, "routed")
    route = up.stub.GetRoute(gateway_pb2.GetRouteRequest(topic="routed"), timeout=10)
    assert [(q.queue_id, q.shard, q.shard_queue_id, q.writable, q.readable) for q in route.queues] == [
        (i, "shard-0", i, True, True) for i in range(8)]


def test_concurrent_sends_share_batches_and_a_bad_one_fails_alone(up: UpProcess) -> None:
    """64 Sends in flight at once go to the commitlog as a few AppendBatch calls; the one the
    commitlog refuses (properties over 32767 bytes) gets its own error, the others are stored."""
    def request(i: int) -> gateway_pb2.SendRequest:
        properties = {"big": "v" * 40_000} if i == 17 else {"KEYS": f"c{i}"}
        return gateway_pb2.SendRequest(message=common_pb2.Message(topic="concurrent", body=f"c{i}".encode(),
                                                                  properties=properties), queue_id=0)
    futures = [up.stub.Send.future(request(i), timeout=30) for i in range(64)]
    outcomes: list[gateway_pb2.SendResult | grpc.RpcError] = []
    for future in futures:
        try:
            outcomes.append(future.result())
        except grpc.RpcError as error:
            outcomes.append(error)
    bad = outcomes.pop(17)
    assert isinstance(bad, grpc.RpcError) and bad.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "PROPERTIES_SIZE_EXCEEDED" in (bad.details() or "") and "message #" not in (bad.details() or "")
    results = [o for o in outcomes if isinstance(o, gateway_pb2.SendResult)]
    assert len(results) == 63
    assert sorted(r.queue_offset for r in results) == list(range(63))
    stored = pull_all(up, "concurrent", 0, until=63)
    assert sorted(m.body for m in stored) == sorted(f"c{i}".encode() for i in range(64) if i != 17)
