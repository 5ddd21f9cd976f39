"""One message's path from producer to consumer is one trace: a Python producer and consumer (an
application process with its own OpenTelemetry SDK) against ``mqstore up``, every span exported to the
in-process OTLP receiver.

- the producer's send is a PRODUCER span with the messaging conventions' attributes; its context goes
  to the gateway (the gateway's SERVER span is its child) and is stored with the message in the
  ``traceparent`` property;
- the poll that returned it is a CLIENT ``receive`` span linked to the send;
- the consumer's processing of that message is a CONSUMER span linked to (and, with nothing else
  current, a child of) the send;
- the gRPC hops carry the current attribute names (``server.address``/``server.port`` on CLIENT spans,
  ``network.peer.*`` on SERVER spans, no deprecated ``net.peer.*``);
- a first send to a new topic (auto-created) leaves no error span anywhere in its trace.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.commitlog.commitlog_process import commitlog_env
from tests.observability.conftest import TracedUp
from tests.observability.otlp_receiver import (
    SPAN_KIND_CLIENT,
    SPAN_KIND_CONSUMER,
    SPAN_KIND_PRODUCER,
    SPAN_KIND_SERVER,
    STATUS_ERROR,
    ReceivedSpan,
)

APP = "orders-app"
GATEWAY = "mqstore-gateway"
COMMITLOG = "mqstore-commitlog"
SEND = "/mqstore.v1.MessagingService/Send"
APPEND_BATCH = "/mqstore.v1.CommitLogService/AppendBatch"

_APP_SCRIPT = """
import asyncio, json, sys, time
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from mqstore.client import Producer, PullConsumer, tracing

gateway, endpoint, topic = sys.argv[1:4]
provider = TracerProvider(resource=Resource.create({"service.name": "orders-app"}))
provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=endpoint, insecure=True)))
trace.set_tracer_provider(provider)
out = {}
with Producer(gateway) as producer:
    out["msg_id"] = producer.send(topic, b"traced", tags="created", keys="order-1").msg_id
    out["batch_ids"] = [r.msg_id for r in producer.send_batch(topic + "Batch", [b"a", b"b", b"c"])]
with PullConsumer("trace-group", topic, gateway, rebalance=False, long_poll_ms=1000) as consumer:
    deadline = time.monotonic() + 20
    messages = []
    while not messages and time.monotonic() < deadline:
        messages = consumer.poll(timeout=1)
    message = messages[0]
    with tracing.process(message, group="trace-group") as span:
        context = span.get_span_context()
        out["process"] = [format(context.trace_id, "032x"), format(context.span_id, "016x")]
    out["properties"] = message.properties


async def aio_send():
    from mqstore.client.aio import AsyncProducer, AsyncPullConsumer

    async with AsyncProducer(gateway) as producer:
        msg_id = (await producer.send(topic + "Aio", b"async")).msg_id
    async with AsyncPullConsumer("aio-group", topic + "Aio", gateway, long_poll_ms=1000) as consumer:
        messages = []
        while not messages:
            messages = await consumer.poll(timeout=1)
    return msg_id, messages[0].properties["traceparent"]


out["aio_msg_id"], out["aio_traceparent"] = asyncio.run(aio_send())
provider.shutdown()
print(json.dumps(out), flush=True)
"""


def _one(spans: list[ReceivedSpan], service: str, name: str, kind: int) -> ReceivedSpan:
    found = [s for s in spans if s.service == service and s.name == name and s.kind == kind]
    assert len(found) == 1, f"expected one {name} span of {service}, got {[(s.service, s.name) for s in spans]}"
    return found[0]


@pytest.fixture(scope="module")
def app_run(traced_up: TracedUp) -> dict[str, object]:
    env = {**commitlog_env(), "PYTHONPATH": str(Path(__file__).parents[2])}
    env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    done = subprocess.run([sys.executable, "-c", _APP_SCRIPT, traced_up.up.gateway, traced_up.receiver.endpoint,
                           "TracedOrders"], env=env, capture_output=True, text=True, timeout=90, check=False)
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_the_producer_stores_its_trace_context_with_the_message(traced_up: TracedUp,
                                                                app_run: dict[str, object]) -> None:
    properties = app_run["properties"]
    assert isinstance(properties, dict)
    version, trace_id, span_id, flags = str(properties["traceparent"]).split("-")
    assert version == "00" and int(flags, 16) & 1  # sampled
    spans = traced_up.receiver.wait_for(trace_id, lambda s: any(x.name == SEND and x.service == GATEWAY for x in s))
    send = _one(spans, APP, "send TracedOrders", SPAN_KIND_PRODUCER)
    assert send.span_id == span_id
    port = int(traced_up.up.gateway.rsplit(":", 1)[1])
    assert send.attributes == {
        "messaging.system": "rocketmq", "messaging.destination.name": "TracedOrders",
        "messaging.operation.type": "send", "messaging.operation.name": "send",
        "messaging.message.id": app_run["msg_id"], "messaging.rocketmq.message.tag": "created",
        "messaging.rocketmq.message.keys": ["order-1"], "server.address": "127.0.0.1", "server.port": port}
    # The gateway's span of the call is the send's child: the context went along as gRPC metadata.
    gateway_send = _one(spans, GATEWAY, SEND, SPAN_KIND_SERVER)
    assert gateway_send.parent_span_id == span_id
    # ... and names the message, so Jaeger finds the trace by topic or message id.
    assert gateway_send.attributes["messaging.destination.name"] == "TracedOrders"
    assert gateway_send.attributes["messaging.message.id"] == app_run["msg_id"]


def test_the_consumers_processing_span_links_to_the_send(traced_up: TracedUp, app_run: dict[str, object]) -> None:
    properties = app_run["properties"]
    assert isinstance(properties, dict)
    _, trace_id, send_span_id, _ = str(properties["traceparent"]).split("-")
    process_trace, process_span = app_run["process"]  # type: ignore[misc]
    spans = traced_up.receiver.wait_for(trace_id, lambda s: any(x.kind == SPAN_KIND_CONSUMER for x in s))
    process = _one(spans, APP, "process TracedOrders", SPAN_KIND_CONSUMER)
    assert (process.trace_id, process.span_id) == (process_trace, process_span)
    assert (trace_id, send_span_id) in process.links
    assert process.parent_span_id == send_span_id  # nothing else was current: one trace in Jaeger
    assert process.attributes["messaging.system"] == "rocketmq"
    assert process.attributes["messaging.operation.type"] == "process"
    assert process.attributes["messaging.operation.name"] == "process"
    assert process.attributes["messaging.destination.name"] == "TracedOrders"
    assert process.attributes["messaging.consumer.group.name"] == "trace-group"
    assert process.attributes["messaging.message.id"] == app_run["msg_id"]


def test_a_poll_that_returns_the_message_is_a_receive_span_linked_to_the_send(
        traced_up: TracedUp, app_run: dict[str, object]) -> None:
    properties = app_run["properties"]
    assert isinstance(properties, dict)
    _, trace_id, send_span_id, _ = str(properties["traceparent"]).split("-")
    receives = [s for s in traced_up.receiver.spans if s.service == APP and s.name == "receive TracedOrders"]
    assert len(receives) == 1, receives
    receive = receives[0]
    assert receive.kind == SPAN_KIND_CLIENT  # the conventions' kind for a receive since 1.26
    assert (trace_id, send_span_id) in receive.links
    assert receive.attributes["messaging.operation.type"] == "receive"
    assert receive.attributes["messaging.batch.message_count"] == 1
    assert receive.attributes["messaging.consumer.group.name"] == "trace-group"
    assert receive.attributes["messaging.destination.name"] == "TracedOrders"


def test_a_batch_send_is_one_producer_span_with_its_message_count(traced_up: TracedUp,
                                                                  app_run: dict[str, object]) -> None:
    batches = [s for s in traced_up.receiver.spans if s.name == "send TracedOrdersBatch"]
    assert len(batches) == 1 and batches[0].kind == SPAN_KIND_PRODUCER
    assert batches[0].attributes["messaging.batch.message_count"] == 3
    assert "messaging.message.id" not in batches[0].attributes


def test_grpc_hops_use_the_current_attribute_names(traced_up: TracedUp, app_run: dict[str, object]) -> None:
    properties = app_run["properties"]
    assert isinstance(properties, dict)
    trace_id = str(properties["traceparent"]).split("-")[1]
    spans = traced_up.receiver.wait_for(trace_id, lambda s: any(x.name == APPEND_BATCH for x in s))
    client = _one(spans, GATEWAY, APPEND_BATCH, SPAN_KIND_CLIENT)
    assert client.attributes["server.address"] == "127.0.0.1"
    assert f"127.0.0.1:{client.attributes['server.port']}" == traced_up.up.commitlog
    for server in (_one(spans, GATEWAY, SEND, SPAN_KIND_SERVER),
                   _one(spans, COMMITLOG, APPEND_BATCH, SPAN_KIND_SERVER)):
        assert server.attributes["network.peer.address"] == "127.0.0.1"
        assert isinstance(server.attributes["network.peer.port"], int)
    deprecated = {k for s in traced_up.receiver.spans for k in s.attributes if k.startswith("net.")}
    assert not deprecated, deprecated


def test_a_first_send_to_a_new_topic_has_no_error_span(traced_up: TracedUp, app_run: dict[str, object]) -> None:
    """TracedOrders did not exist: the send auto-created it, and nothing in its trace is an error (the
    gateway used to ask the shard to create the topic its send had just created: ALREADY_EXISTS)."""
    properties = app_run["properties"]
    assert isinstance(properties, dict)
    trace_id = str(properties["traceparent"]).split("-")[1]
    spans = traced_up.receiver.wait_for(trace_id, lambda s: any(x.name == APPEND_BATCH for x in s))
    errors = [(s.service, s.name, s.status_message) for s in spans if s.status_code == STATUS_ERROR]
    assert not errors, errors
    assert not [s for s in spans if s.name.endswith("/CreateTopic")]


def test_the_asyncio_client_traces_alike(traced_up: TracedUp, app_run: dict[str, object]) -> None:
    _, trace_id, span_id, _ = str(app_run["aio_traceparent"]).split("-")
    spans = traced_up.receiver.wait_for(trace_id, lambda s: any(x.name == SEND and x.service == GATEWAY for x in s))
    send = _one(spans, APP, "send TracedOrdersAio", SPAN_KIND_PRODUCER)
    assert send.span_id == span_id and send.attributes["messaging.message.id"] == app_run["aio_msg_id"]
    assert _one(spans, GATEWAY, SEND, SPAN_KIND_SERVER).parent_span_id == span_id
    receive = next(s for s in traced_up.receiver.spans if s.service == APP and s.name == "receive TracedOrdersAio")
    assert receive.kind == SPAN_KIND_CLIENT and (trace_id, span_id) in receive.links


def test_without_a_tracer_provider_the_client_adds_nothing(traced_up: TracedUp) -> None:
    """This test process set no provider: the client makes no span and stores no traceparent."""
    from opentelemetry import trace

    from mqstore.client import Producer, PullConsumer

    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    with Producer(traced_up.up.gateway) as producer:
        producer.send("UntracedOrders", b"plain")
    with PullConsumer(None, "UntracedOrders", traced_up.up.gateway, long_poll_ms=1000) as consumer:
        messages = consumer.poll(timeout=5)
    assert [m.body for m in messages] == [b"plain"]
    assert "traceparent" not in messages[0].properties
