"""The RocketMQ 5 protocol's answers, called with the vendored stubs (apache.rocketmq.v2) against
``mqstore up``: its status codes for bad input (unknown topic, too large a body, unknown or outdated
receipt handles, bad invisible durations, SQL filters, RPCs mqstore does not serve), the settings
stream, and ForwardMessageToDeadLetterQueue ending in %DLQ%<group> (readable through mqstore.v1)."""

from __future__ import annotations

import hashlib
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import duration_pb2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from apache.rocketmq.v2 import definition_pb2 as d
from apache.rocketmq.v2 import service_pb2 as s
from apache.rocketmq.v2 import service_pb2_grpc
from mqstore.v1 import commitlog_pb2, commitlog_pb2_grpc, common_pb2, gateway_pb2, groups_pb2, query_pb2
from services.store.formats.record import largest_body_always_stored
from tests.gateway.system_process import UpProcess
from tests.rocketmq5.test_official_python_client import official
from tests.rocketmq5.topics import create_topic

Code = d.Code


@pytest.fixture(scope="module")
def v2(up: UpProcess) -> Iterator[service_pb2_grpc.MessagingServiceStub]:
    yield service_pb2_grpc.MessagingServiceStub(up.channel)


def endpoints(up: UpProcess) -> d.Endpoints:
    host, port = up.gateway.rsplit(":", 1)
    return d.Endpoints(scheme=d.AddressScheme.IPv4, addresses=[d.Address(host=host, port=int(port))])


def message(topic: str, body: bytes, tag: str = "T") -> d.Message:
    return d.Message(topic=d.Resource(name=topic), body=body,
                     system_properties=d.SystemProperties(tag=tag, message_type=d.MessageType.NORMAL,
                                                          body_encoding=d.Encoding.IDENTITY))


def seconds(value: float) -> duration_pb2.Duration:
    out = duration_pb2.Duration()
    out.FromMilliseconds(int(value * 1000))
    return out


def receive(v2: service_pb2_grpc.MessagingServiceStub, topic: str, group: str, invisible_s: float,
            wait_s: float = 2, expression: str = "*", kind: int = d.FilterType.TAG
            ) -> tuple[list[d.Message], d.Status]:
    request = s.ReceiveMessageRequest(group=d.Resource(name=group), batch_size=16,
                                      message_queue=d.MessageQueue(topic=d.Resource(name=topic), id=-1),
                                      filter_expression=d.FilterExpression(type=kind, expression=expression),
                                      invisible_duration=seconds(invisible_s), long_polling_timeout=seconds(wait_s))
    messages, status = [], None
    for answer in v2.ReceiveMessage(request, timeout=wait_s + 5):
        if answer.HasField("message"):
            messages.append(answer.message)
        elif answer.HasField("status"):
            status = answer.status
    assert status is not None
    return messages, status


def receive_all(v2: service_pb2_grpc.MessagingServiceStub, topic: str, group: str, invisible_s: float, count: int
                ) -> list[d.Message]:
    """Receive until ``count`` messages came (a receive returns what the indexer has dispatched so far)."""
    got: list[d.Message] = []
    deadline = time.monotonic() + 10
    while len(got) < count and time.monotonic() < deadline:
        got += receive(v2, topic, group, invisible_s)[0]
    return got


def ack(v2: service_pb2_grpc.MessagingServiceStub, topic: str, group: str, handle: str) -> s.AckMessageResponse:
    return v2.AckMessage(s.AckMessageRequest(group=d.Resource(name=group), topic=d.Resource(name=topic),
                                             entries=[s.AckMessageEntry(receipt_handle=handle)]), timeout=10)


def test_routes_settings_and_bad_input(up: UpProcess, v2: service_pb2_grpc.MessagingServiceStub) -> None:
    create_topic(up, "rmq5-proto", 2)
    route = v2.QueryRoute(s.QueryRouteRequest(topic=d.Resource(name="rmq5-proto"), endpoints=endpoints(up)),
                          timeout=10)
    assert route.status.code == Code.OK == 20000
    assert [q.id for q in route.message_queues] == [0, 1]
    assert route.message_queues[0].broker.endpoints == endpoints(up)
    settings = d.Settings(client_type=d.ClientType.PRODUCER, publishing=d.Publishing(topics=[d.Resource(name="x")]))
    [answer] = list(v2.Telemetry(iter([s.TelemetryCommand(settings=settings)]), timeout=10))
    advertised = answer.settings.publishing.max_body_size
    with grpc.insecure_channel(up.commitlog) as channel:
        store = commitlog_pb2_grpc.CommitLogServiceStub(channel).GetStoreInfo(commitlog_pb2.GetStoreInfoRequest(),
                                                                               timeout=10)
    assert store.max_message_size > 0
    assert answer.status.code == Code.OK and advertised == largest_body_always_stored(store.max_message_size)

    def send_body(size: int, properties: int) -> d.Status:
        big = message("rmq5-proto", b"x" * size)
        big.user_properties.update({f"p{i}": "v" * 2000 for i in range(properties)})
        answer = v2.SendMessage(s.SendMessageRequest(messages=[big]), timeout=30)
        return answer.entries[0].status if answer.entries else answer.status

    # The largest advertised body is stored even with ~32 KB of properties; one byte more, or the store's
    # maxMessageSize, is MESSAGE_BODY_TOO_LARGE as the settings and docs/rocketmq5.md say, never
    # MESSAGE_ILLEGAL (40000).
    assert send_body(advertised, properties=16).code == Code.OK
    assert send_body(advertised + 1, properties=0).code == Code.MESSAGE_BODY_TOO_LARGE
    assert send_body(store.max_message_size, properties=0).code == Code.MESSAGE_BODY_TOO_LARGE
    far = message("rmq5-proto", b"much later")
    far.system_properties.message_type = d.MessageType.DELAY
    far.system_properties.delivery_timestamp.FromSeconds(int(time.time()) + 400 * 86400)
    beyond = v2.SendMessage(s.SendMessageRequest(messages=[far]), timeout=10)
    assert beyond.status.code == Code.ILLEGAL_DELIVERY_TIME and "timerMaxDelaySec" in beyond.status.message
    sent = v2.SendMessage(s.SendMessageRequest(messages=[message("rmq5-proto", b"hello")]), timeout=10)
    assert sent.status.code == Code.OK and len(sent.entries[0].message_id) == 32

    bogus = ack(v2, "rmq5-proto", "g-proto", "not-a-handle")
    assert bogus.status.code == Code.INVALID_RECEIPT_HANDLE and bogus.entries[0].status.code == bogus.status.code
    _, bad_time = receive(v2, "rmq5-proto", "g-proto", invisible_s=0.1)
    assert bad_time.code == Code.ILLEGAL_INVISIBLE_TIME
    _, sql = receive(v2, "rmq5-proto", "g-proto", 5, expression="a > 1", kind=d.FilterType.SQL)
    assert sql.code == Code.ILLEGAL_FILTER_EXPRESSION
    [pull] = list(v2.PullMessage(s.PullMessageRequest(group=d.Resource(name="g")), timeout=10))
    assert pull.status.code == Code.NOT_IMPLEMENTED


def test_redelivery_outdated_handles_and_dead_letters(up: UpProcess, v2: service_pb2_grpc.MessagingServiceStub
                                                      ) -> None:
    topic, group = "rmq5-redeliver", "g-redeliver"
    create_topic(up, topic, 1)
    sent = v2.SendMessage(s.SendMessageRequest(messages=[message(topic, b"once", tag="A"),
                                                         message(topic, b"filtered", tag="B")]), timeout=10)
    assert sent.status.code == Code.OK
    [first], status = receive(v2, topic, group, invisible_s=1, expression="A")
    assert status.code == Code.OK and first.system_properties.delivery_attempt == 1
    time.sleep(1.2)
    [again], _ = receive(v2, topic, group, invisible_s=30, expression="A")
    assert again.system_properties.message_id == first.system_properties.message_id
    assert again.system_properties.delivery_attempt == 2
    outdated = ack(v2, topic, group, first.system_properties.receipt_handle)
    assert outdated.status.code == Code.INVALID_RECEIPT_HANDLE and "earlier hand-out" in outdated.status.message
    forwarded = v2.ForwardMessageToDeadLetterQueue(s.ForwardMessageToDeadLetterQueueRequest(
        group=d.Resource(name=group), topic=d.Resource(name=topic),
        receipt_handle=again.system_properties.receipt_handle, message_id=again.system_properties.message_id,
        delivery_attempt=2, max_delivery_attempts=16), timeout=10)
    assert forwarded.status.code == Code.OK
    assert ack(v2, topic, group, again.system_properties.receipt_handle).status.code == Code.INVALID_RECEIPT_HANDLE
    nothing, status = receive(v2, topic, group, invisible_s=5, wait_s=0.5, expression="A")
    assert (nothing, status.code) == ([], Code.MESSAGE_NOT_FOUND)

    dlq = up.stub.Pull(query_pb2.PullMessageRequest(topic=f"%DLQ%{group}", queue_id=0, queue_offset=0,
                                                    long_poll_ms=3000), timeout=10)
    assert [m.body for m in dlq.messages] == [b"once"]
    assert dlq.messages[0].uniq_key == first.system_properties.message_id
    # Everything up to the acked (forwarded) message and the filtered one is committed for the group.
    committed = up.stub.QueryOffset(query_pb2.QueryConsumerOffsetRequest(consumer_group=group, topic=topic,
                                                                         queue_id=0), timeout=10)
    assert committed.offset == 2


def test_the_flag_turns_the_protocol_off(monkeypatch: pytest.MonkeyPatch) -> None:
    from gateway.rocketmq5 import registration
    assert registration.enabled()
    monkeypatch.setenv(registration.ENV_FLAG, "0")
    assert not registration.enabled()


def test_a_message_sent_through_mqstore_v1_reads_the_same_over_v2(up: UpProcess,
                                                                  v2: service_pb2_grpc.MessagingServiceStub) -> None:
    topic = "rmq5-from-v1"
    create_topic(up, topic, 1)
    properties = {"TAGS": "V1", "KEYS": "k1 k2", "color": "red"}
    sent = up.stub.Send(gateway_pb2.SendRequest(message=common_pb2.Message(topic=topic, body=b"from v1",
                                                                           properties=properties)), timeout=10)
    [got], status = receive(v2, topic, "g-from-v1", invisible_s=5)
    system = got.system_properties
    assert status.code == Code.OK
    assert (system.message_id, system.tag, list(system.keys), dict(got.user_properties), got.body) == (
        sent.msg_id, "V1", ["k1", "k2"], {"color": "red"}, b"from v1")
    assert (system.queue_offset, system.delivery_attempt, system.message_type) == (0, 1, d.MessageType.NORMAL)
    assert ack(v2, topic, "g-from-v1", system.receipt_handle).status.code == Code.OK


def test_consumers_are_group_members_while_connected(up: UpProcess, v2: service_pb2_grpc.MessagingServiceStub
                                                     ) -> None:
    topic, group, client = "rmq5-members", "g-members", "host@1234@0@rmq5test"
    create_topic(up, topic, 1)
    metadata = (("x-mq-client-id", client),)
    settings = d.Settings(client_type=d.ClientType.SIMPLE_CONSUMER, subscription=d.Subscription(
        group=d.Resource(name=group), subscriptions=[d.SubscriptionEntry(topic=d.Resource(name=topic))]))
    release = threading.Event()

    def commands() -> Iterator[s.TelemetryCommand]:
        yield s.TelemetryCommand(settings=settings)
        release.wait(30)

    stream = v2.Telemetry(commands(), timeout=30, metadata=metadata)
    assert next(stream).status.code == Code.OK
    beat = v2.Heartbeat(s.HeartbeatRequest(group=d.Resource(name=group), client_type=d.ClientType.SIMPLE_CONSUMER),
                        timeout=10, metadata=metadata)
    assert beat.status.code == Code.OK
    [described] = up.stub.DescribeGroups(groups_pb2.DescribeGroupsRequest(group=group), timeout=10).groups
    assert [(m.client_id, list(m.topics)) for m in described.members] == [(client, [topic])]

    ended = v2.NotifyClientTermination(s.NotifyClientTerminationRequest(group=d.Resource(name=group)), timeout=10,
                                       metadata=metadata)
    assert ended.status.code == Code.OK
    release.set()
    stream.cancel()
    groups = up.stub.DescribeGroups(groups_pb2.DescribeGroupsRequest(group=group), timeout=10).groups
    assert all(not g.members for g in groups)


def test_acks_commit_the_group_offset_soon(up: UpProcess, v2: service_pb2_grpc.MessagingServiceStub) -> None:
    topic, group = "rmq5-commits", "g-commits"
    create_topic(up, topic, 1)
    sent = v2.SendMessage(s.SendMessageRequest(messages=[message(topic, b"a"), message(topic, b"b")]), timeout=10)
    assert sent.status.code == Code.OK
    got = receive_all(v2, topic, group, 30, 2)
    assert [m.body for m in got] == [b"a", b"b"]
    for m in got:  # the second ack comes within the commit interval of the first: committed a little later
        assert ack(v2, topic, group, m.system_properties.receipt_handle).status.code == Code.OK
    request = query_pb2.QueryConsumerOffsetRequest(consumer_group=group, topic=topic, queue_id=0)
    deadline = time.monotonic() + 3
    while up.stub.QueryOffset(request, timeout=10).offset != 2:
        assert time.monotonic() < deadline, "the acks' offset was not committed"
        time.sleep(0.05)


# -- bad bytes: every RPC answers the protocol's BAD_REQUEST, never gRPC UNKNOWN ------------------------
_SERVICE = s.DESCRIPTOR.services_by_name["MessagingService"]


def _invalid_utf8(descriptor: Any, depth: int = 0) -> bytes:
    """A serialised ``descriptor`` whose first string field (at the top, else inside a message field)
    holds bytes that are not UTF-8, which protobuf refuses to decode."""
    def field(number: int, payload: bytes) -> bytes:
        return _varint(number << 3 | 2) + _varint(len(payload)) + payload

    for f in descriptor.fields:
        if f.type == f.TYPE_STRING:
            return field(f.number, b"\xff\xfe bad")
    for f in descriptor.fields:
        if f.type == f.TYPE_MESSAGE and depth < 3 and not f.message_type.full_name.startswith("google."):
            inner = _invalid_utf8(f.message_type, depth + 1)
            if inner:
                return field(f.number, inner)
    return b""


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _response_class(name: str) -> Any:
    return getattr(s, name, None) or getattr(d, name)


@pytest.mark.parametrize("method", [m.name for m in _SERVICE.methods])
def test_every_rpc_answers_invalid_utf8_with_bad_request(up: UpProcess, method: str) -> None:
    descriptor = _SERVICE.methods_by_name[method]
    payload = _invalid_utf8(descriptor.input_type)
    assert payload, f"{descriptor.input_type.full_name} has no string field to spoil"
    path = f"/{_SERVICE.full_name}/{method}"
    response_type = _response_class(descriptor.output_type.name)
    if descriptor.client_streaming:
        call = up.channel.stream_stream(path, request_serializer=None, response_deserializer=response_type.FromString)
        answers = call(iter([payload]), timeout=10)
        first = next(answers)
        answers.cancel()
    elif descriptor.server_streaming:
        call = up.channel.unary_stream(path, request_serializer=None, response_deserializer=response_type.FromString)
        first = next(iter(call(payload, timeout=10)))
    else:
        call = up.channel.unary_unary(path, request_serializer=None, response_deserializer=response_type.FromString)
        first = call(payload, timeout=10)
    assert first.status.code == Code.BAD_REQUEST, first
    assert "not a valid apache.rocketmq.v2" in first.status.message


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(method=st.sampled_from([m.name for m in _SERVICE.methods if not m.client_streaming and not m.server_streaming]),
       data=st.binary(max_size=64))
def test_fuzzed_bytes_never_end_in_unknown_or_internal(up: UpProcess, method: str, data: bytes) -> None:
    descriptor = _SERVICE.methods_by_name[method]
    response_type = _response_class(descriptor.output_type.name)
    call = up.channel.unary_unary(f"/{_SERVICE.full_name}/{method}", request_serializer=None,
                                  response_deserializer=response_type.FromString)
    try:
        answer = call(data, timeout=10)
    except grpc.RpcError as exc:
        assert exc.code() not in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL), (method, data, exc)
        return
    assert answer.status.code != Code.INTERNAL_ERROR or "Traceback" not in answer.status.message


def test_a_producer_starts_on_a_topic_that_does_not_exist_yet(up: UpProcess,
                                                              v2: service_pb2_grpc.MessagingServiceStub) -> None:
    """QueryRoute has the v1 API's rule for a new topic: with auto-create on (the default) a token that may
    produce gets the route the first send uses (the default queue count), and that send creates the
    topic; nothing is created by the lookup itself."""
    route = v2.QueryRoute(s.QueryRouteRequest(topic=d.Resource(name="rmq5-new"), endpoints=endpoints(up)),
                          timeout=10)
    assert route.status.code == Code.OK and len(route.message_queues) == 8
    topics = {t.topic for t in up.stub.ListTopics(commitlog_pb2.ListTopicsRequest(), timeout=10).topics}
    assert "rmq5-new" not in topics, "a route lookup creates nothing"
    sent = v2.SendMessage(s.SendMessageRequest(messages=[message("rmq5-new", b"first")]), timeout=10)
    assert sent.status.code == Code.OK
    again = v2.QueryRoute(s.QueryRouteRequest(topic=d.Resource(name="rmq5-new"), endpoints=endpoints(up)),
                          timeout=10)
    assert again.status.code == Code.OK and [q.id for q in again.message_queues] == list(range(8))
    bad = v2.QueryRoute(s.QueryRouteRequest(topic=d.Resource(name="bad topic!"), endpoints=endpoints(up)),
                        timeout=10)
    assert bad.status.code != Code.OK


def test_a_v1_sharding_key_is_a_v2_message_group(up: UpProcess, v2: service_pb2_grpc.MessagingServiceStub,
                                                 tmp_path: Path) -> None:
    """mqstore's own producer with a sharding key (one message at a time, and a batch): a v2 consumer sees
    the key as the messages' message group, FIFO, and gets them one at a time in send order."""
    from mqstore.client import Producer

    create_topic(up, "rmq5-sharded", 2)
    with Producer(up.gateway) as producer:
        for i in range(5):
            producer.send("rmq5-sharded", f"single {i}", sharding_key="order-7")
        producer.send_batch("rmq5-sharded", [f"batched {i}" for i in range(5)], sharding_key="order-7")
    seen: list[bytes] = []
    deadline = time.monotonic() + 30
    while len(seen) < 10 and time.monotonic() < deadline:
        messages, _ = receive(v2, "rmq5-sharded", "g-sharded", invisible_s=10, wait_s=1)
        assert len(messages) <= 1, "a message group's next message waits for the ack of the one before"
        for m in messages:
            assert m.system_properties.message_group == "order-7"
            assert m.system_properties.message_type == d.MessageType.FIFO
            seen.append(m.body)
            assert ack(v2, "rmq5-sharded", "g-sharded", m.system_properties.receipt_handle).status.code == Code.OK
    assert seen == [f"single {i}".encode() for i in range(5)] + [f"batched {i}".encode() for i in range(5)]
    # The official client's SimpleConsumer (another group) sees the same order.
    fifo = official("consume_fifo", up.gateway, tmp_path, topic="rmq5-sharded", group="g-sharded-official",
                    expect=10, wait_s=60)
    assert fifo["order"] == [b.decode() for b in seen]


def test_a_body_the_store_does_not_inflate_is_received_as_stored_and_flagged_gzip(
        up: UpProcess, v2: service_pb2_grpc.MessagingServiceStub) -> None:
    """A body flagged compressed that the one inflate rule leaves as stored (here LZ4, sysflag
    compression type 1) reaches a v2 consumer as RocketMQ 5's proxy sends any compressed body: its
    stored bytes, body_encoding GZIP, the digest of those bytes. A zlib body arrives inflated."""
    topic = "rmq5-compressed"
    create_topic(up, topic, 1)
    lz4 = b"\x04\x22\x4d\x18 an LZ4 frame the store has no codec for"
    for body, sys_flag in ((lz4, 0x101), (zlib.compress(b"squeezed " * 40), 0x1)):
        up.stub.Send(gateway_pb2.SendRequest(message=common_pb2.Message(topic=topic, body=body, sys_flag=sys_flag)),
                     timeout=10)
    got = receive_all(v2, topic, "g-compressed", invisible_s=5, count=2)
    assert [(m.body, m.system_properties.body_encoding, m.system_properties.body_digest.checksum) for m in got] == [
        (lz4, d.Encoding.GZIP, hashlib.md5(lz4).hexdigest().upper()),
        (b"squeezed " * 40, d.Encoding.IDENTITY, hashlib.md5(b"squeezed " * 40).hexdigest().upper())]
