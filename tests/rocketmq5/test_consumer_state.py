"""v2 consumer state lives in the shard (the query service's pop checkpoints), not in a gateway process:
with ``mqstore up --gateway-workers 2`` a receipt handed out by one worker is acked or changed through
the other, attempts survive a restart of the gateway's workers, a message past its max attempts reaches
%DLQ%<group> with no consumer online (moved once, though every worker looks), and a push consumer's
receipts are renewed while its listener runs (auto_renew), for the raw protocol and the official
Python client's PushConsumer."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from apache.rocketmq.v2 import definition_pb2 as d
from apache.rocketmq.v2 import service_pb2 as s
from apache.rocketmq.v2 import service_pb2_grpc
from bench.services import free_port_block
from mqstore.v1 import query_pb2
from tests.gateway.system_process import UpProcess, start_up
from tests.gateway.test_gateway_workers import _all_metrics_answer, _wait, _worker_pids
from tests.rocketmq5.test_official_python_client import official
from tests.rocketmq5.test_protocol import ack, endpoints, message, receive_all, seconds
from tests.rocketmq5.topics import create_topic

MAX_ATTEMPTS = 3
#: Push consumers give no invisible duration: theirs, short so a listener outlasts it quickly.
PUSH_INVISIBLE_MS = 2000
WORKERS = 2


@pytest.fixture(scope="module")
def up2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpProcess]:
    metrics = free_port_block(7)  # commitlog, indexer, query, one per gateway worker, scheduler
    started = start_up(tmp_path_factory.mktemp("up") / "store",
                       {"MQSTORE_RMQ5_MAX_DELIVERY_ATTEMPTS": str(MAX_ATTEMPTS),
                        "MQSTORE_RMQ5_DEFAULT_INVISIBLE_MS": str(PUSH_INVISIBLE_MS)},
                       extra_args=["--gateway-workers", str(WORKERS), "--metrics-base-port", str(metrics)])
    started.metrics_base_port = metrics
    try:
        _wait(lambda: len(_worker_pids(started.logs())) == WORKERS and _all_metrics_answer(started, WORKERS), 30,
              "both gateway workers serving")
        yield started
        assert started.stop() == 0, started.logs()[-5000:]
    finally:
        started.kill_all()


def _route_lookups(up: UpProcess, worker: int) -> float:
    url = f"http://127.0.0.1:{up.metrics_base_port + 4 + worker}/metrics"
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    return sum(float(v) for v in re.findall(r'^mqstore_gateway_calls_total\{[^}]*method="GetRoute"[^}]*\} (\S+)$',
                                            text, re.M))


def _channels_on_each_worker(up: UpProcess, topic: str) -> dict[int, grpc.Channel]:
    """A channel (its own connection) per worker: new connections until each worker has one; which worker
    took a connection shows in its metrics (a QueryRoute's route lookup)."""
    found: dict[int, grpc.Channel] = {}
    for _ in range(40):
        channel = grpc.insecure_channel(up.gateway, options=[("grpc.use_local_subchannel_pool", 1)])
        before = [_route_lookups(up, i) for i in range(WORKERS)]
        route = service_pb2_grpc.MessagingServiceStub(channel).QueryRoute(
            s.QueryRouteRequest(topic=d.Resource(name=topic), endpoints=endpoints(up)), timeout=10)
        assert route.status.code == d.Code.OK
        [worker] = [i for i in range(WORKERS) if _route_lookups(up, i) > before[i]]
        if worker in found:
            channel.close()
        else:
            found[worker] = channel
        if len(found) == WORKERS:
            return found
    raise AssertionError(f"40 connections reached only workers {sorted(found)}")


def _attempts(messages: list[d.Message]) -> list[tuple[bytes, int]]:
    return [(m.body, m.system_properties.delivery_attempt) for m in messages]


def test_a_receipt_works_through_any_worker_and_attempts_survive_a_gateway_restart(up2: UpProcess) -> None:
    topic, group = "rmq5-shared", "g-shared"
    create_topic(up2, topic, 1)
    channels = _channels_on_each_worker(up2, topic)
    first, other = (service_pb2_grpc.MessagingServiceStub(channels[i]) for i in range(WORKERS))
    sent = first.SendMessage(s.SendMessageRequest(messages=[message(topic, b"m0"), message(topic, b"m1")]),
                             timeout=10)
    assert sent.status.code == d.Code.OK
    m0, m1 = receive_all(first, topic, group, 30, 2)
    assert _attempts([m0, m1]) == [(b"m0", 1), (b"m1", 1)]

    # The other worker serves what the first handed out.
    acked = ack(other, topic, group, m0.system_properties.receipt_handle)
    assert acked.status.code == d.Code.OK, acked.status.message
    changed = other.ChangeInvisibleDuration(s.ChangeInvisibleDurationRequest(
        group=d.Resource(name=group), topic=d.Resource(name=topic), receipt_handle=m1.system_properties.receipt_handle,
        invisible_duration=seconds(0), message_id=m1.system_properties.message_id), timeout=10)
    assert changed.status.code == d.Code.OK, changed.status.message
    [again] = receive_all(other, topic, group, 1, 1)
    assert _attempts([again]) == [(b"m1", 2)]
    for channel in channels.values():
        channel.close()

    # Both workers killed (the supervisor starts new ones): nothing the consumer sees changes.
    old = _worker_pids(up2.logs())
    for pid in old.values():
        os.kill(pid, signal.SIGKILL)
    _wait(lambda: all(p not in old.values() for p in _worker_pids(up2.logs()).values())
          and _all_metrics_answer(up2, WORKERS), 30, "both workers restarted")
    with grpc.insecure_channel(up2.gateway) as channel:
        v2 = service_pb2_grpc.MessagingServiceStub(channel)
        [third] = receive_all(v2, topic, group, 30, 1)
        assert _attempts([third]) == [(b"m1", 3)], "m0 stays acked; m1 keeps its attempts"
        assert ack(v2, topic, group, third.system_properties.receipt_handle).status.code == d.Code.OK
    offset = up2.stub.QueryOffset(query_pb2.QueryConsumerOffsetRequest(consumer_group=group, topic=topic, queue_id=0),
                                  timeout=10)
    assert offset.offset == 2


def test_an_exhausted_message_reaches_the_dlq_with_no_consumer_online(up2: UpProcess) -> None:
    topic, group = "rmq5-exhausted", "g-exhausted"
    create_topic(up2, topic, 1)
    with grpc.insecure_channel(up2.gateway) as channel:
        v2 = service_pb2_grpc.MessagingServiceStub(channel)
        assert v2.SendMessage(s.SendMessageRequest(messages=[message(topic, b"x")]), timeout=10).status.code == \
            d.Code.OK
        for attempt in range(1, MAX_ATTEMPTS + 1):
            [got] = receive_all(v2, topic, group, 1, 1)  # never acked: visible again after 1 s
            assert _attempts([got]) == [(b"x", attempt)]
    # No consumer receives any more: the gateway moves it on its own, once (both workers look).
    dlq = f"%DLQ%{group}"
    deadline = time.monotonic() + 15
    dead: list[query_pb2.StoredMessage] = []
    while not dead and time.monotonic() < deadline:
        try:
            dead = list(up2.stub.Pull(query_pb2.PullMessageRequest(topic=dlq, queue_id=0, queue_offset=0,
                                                                   long_poll_ms=2000), timeout=10).messages)
        except grpc.RpcError as exc:  # the dead-letter topic is created by the first dead letter
            assert exc.code() == grpc.StatusCode.NOT_FOUND, exc
            time.sleep(0.3)
    assert [m.body for m in dead] == [b"x"]
    assert dead[0].uniq_key == got.system_properties.message_id
    assert dead[0].reconsume_times == MAX_ATTEMPTS, "RECONSUME_TIMES: the deliveries"
    time.sleep(2)  # another round of both workers
    again = up2.stub.Pull(query_pb2.PullMessageRequest(topic=dlq, queue_id=0, queue_offset=0), timeout=10)
    assert len(again.messages) == 1, "dead-lettered once"
    offset = up2.stub.QueryOffset(query_pb2.QueryConsumerOffsetRequest(consumer_group=group, topic=topic, queue_id=0),
                                  timeout=10)
    assert offset.offset == 1, "counted as acked"


def _push_receive(v2: service_pb2_grpc.MessagingServiceStub, topic: str, group: str, metadata: tuple[tuple[str, str]],
                  auto_renew: bool, wait_s: float) -> list[d.Message]:
    request = s.ReceiveMessageRequest(group=d.Resource(name=group), batch_size=16, auto_renew=auto_renew,
                                      message_queue=d.MessageQueue(topic=d.Resource(name=topic), id=-1),
                                      filter_expression=d.FilterExpression(type=d.FilterType.TAG, expression="*"),
                                      invisible_duration=seconds(2), long_polling_timeout=seconds(wait_s))
    return [a.message for a in v2.ReceiveMessage(request, metadata=metadata, timeout=wait_s + 5)
            if a.HasField("message")]


def test_a_push_consumers_receipt_is_renewed_while_its_telemetry_stream_is_open(up2: UpProcess) -> None:
    topic, group = "rmq5-renew", "g-renew"
    create_topic(up2, topic, 1)
    metadata = (("x-mq-client-id", "renew-client-1"),)
    settings = d.Settings(client_type=d.ClientType.PUSH_CONSUMER, subscription=d.Subscription(
        group=d.Resource(name=group), subscriptions=[d.SubscriptionEntry(
            topic=d.Resource(name=topic), expression=d.FilterExpression(type=d.FilterType.TAG, expression="*"))]))
    closing = threading.Event()

    def commands() -> Iterator[s.TelemetryCommand]:
        yield s.TelemetryCommand(settings=settings)
        closing.wait(60)

    with grpc.insecure_channel(up2.gateway) as channel:  # one connection: telemetry and receives on one worker
        v2 = service_pb2_grpc.MessagingServiceStub(channel)
        assert v2.SendMessage(s.SendMessageRequest(messages=[message(topic, b"long")]), timeout=10).status.code == \
            d.Code.OK
        stream = v2.Telemetry(commands(), metadata=metadata, timeout=60)
        assert next(stream).status.code == d.Code.OK
        try:
            got: list[d.Message] = []
            deadline = time.monotonic() + 10
            while not got and time.monotonic() < deadline:
                got = _push_receive(v2, topic, group, metadata, True, 2)
            [first] = got
            time.sleep(5)  # more than twice its invisible duration of 2 s
            assert _push_receive(v2, topic, group, metadata, False, 1) == [], "renewed: not delivered again"
            acked = ack(v2, topic, group, first.system_properties.receipt_handle)
            assert acked.status.code == d.Code.OK, "a renewal keeps the client's receipt valid"
        finally:
            closing.set()
            stream.cancel()


def test_a_long_push_listener_gets_no_duplicate(up2: UpProcess, tmp_path: Path) -> None:
    topic, group = "rmq5-slow-push", "g-slow-push"
    create_topic(up2, topic, 1)
    with grpc.insecure_channel(up2.gateway) as channel:
        v2 = service_pb2_grpc.MessagingServiceStub(channel)
        assert v2.SendMessage(s.SendMessageRequest(messages=[message(topic, b"slow")]), timeout=10).status.code == \
            d.Code.OK
    listen_s = 3 * PUSH_INVISIBLE_MS / 1000
    calls = official("slow_push", up2.gateway, tmp_path, topic=topic, group=group, listen_s=listen_s, wait_s=30,
                     linger_s=1)["calls"]
    assert [(c["body"], c["attempt"]) for c in calls] == [("slow", 1)], calls
    assert calls[0]["done"] - calls[0]["at"] >= listen_s
