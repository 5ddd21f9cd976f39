"""OpenTelemetry spans of the Python client, after the messaging semantic conventions.

The client has no tracing of its own to configure: it uses the application's global tracer provider
(``opentelemetry.trace.set_tracer_provider``, or the ``opentelemetry-instrument`` agent). Without the
``opentelemetry-api`` package, or while no provider is set, every helper here is a no-op that costs
one check, so the client keeps its small dependency set (grpcio, protobuf).

What a traced application gets:

* ``Producer.send``/``send_message``/``send_batch``: a PRODUCER span ``send <topic>`` (the spec's kind
  for a send that creates the message). Its context goes with the call as gRPC metadata (the gateway's
  SERVER span is its child) and is stored *with the message* in the user property ``traceparent``
  (plus ``tracestate`` when there is one), the W3C Trace Context header written by the global
  propagator. That is what RocketMQ 5 does: its OpenTelemetry instrumentations (rocketmq-clients and
  the Java agent's rocketmq-client instrumentation) inject the context into the message's user
  properties under the propagator's own keys, so a RocketMQ-aware consumer finds it where it looks.
* ``TransactionProducer.send``: one PRODUCER span ``send <topic>`` around the half, the local
  transaction and EndTransaction; the half stores its context and the commit copies the half's
  properties, so the commit and the consumer of the committed message are in the send's trace.
* ``PullConsumer.poll``: a CLIENT span ``receive <topic>`` for a poll that returned messages, linked
  to the send of each (:func:`received`).
* :func:`process`: a CONSUMER span ``process <topic>`` around the handling of one pulled message,
  linked to the send that produced it (and its child when nothing else is current, so Jaeger shows
  producer and consumer as one trace).

``messaging.system`` is ``rocketmq``: mqstore stores and serves RocketMQ's message model (topics and
queues, tags, keys, UNIQ_KEY message ids, consumer groups, RocketMQ's record and property layout), so
the conventions' well-known value for RocketMQ, and its ``messaging.rocketmq.*`` attributes, say
what the spans mean to tools that already know that system.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping, MutableMapping, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

try:
    from opentelemetry import propagate, trace
except ImportError:  # pragma: no cover - the client works without opentelemetry-api
    trace = None  # type: ignore[assignment]

#: The API's providers before an application sets one: tracing is off.
_UNSET_PROVIDERS = (trace.ProxyTracerProvider, trace.NoOpTracerProvider) if trace is not None else ()

if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from mqstore.client.models import Message

MESSAGING_SYSTEM = "rocketmq"
#: The user property the producer's trace context is stored under (W3C Trace Context).
TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
_SCOPE = "mqstore_client"


_NOOP: AbstractContextManager[None] = contextlib.nullcontext()
_MISSING = object()
_tracers: dict[int, Any] = {}


def _tracer() -> Any:
    """The application's tracer, or None when tracing is not set up (no API, or the default no-op
    provider): then nothing is created, injected or recorded. One tracer per provider, made once."""
    if trace is None:
        return None
    # The API's global, read directly: get_tracer_provider() costs ~2 us (an environment lookup) on
    # every send while no provider is set. Should the API rename it, the public call is used.
    provider: Any = getattr(trace, "_TRACER_PROVIDER", _MISSING)
    if provider is None:
        return None
    if provider is _MISSING:
        provider = trace.get_tracer_provider()
    if isinstance(provider, _UNSET_PROVIDERS):
        return None
    tracer = _tracers.get(id(provider))
    if tracer is None:
        tracer = _tracers[id(provider)] = provider.get_tracer(_SCOPE)
    return tracer


def _server_attributes(address: str) -> dict[str, Any]:
    host, sep, port = address.rpartition(":")
    if not sep:
        return {"server.address": address}
    attributes: dict[str, Any] = {"server.address": host.strip("[]")}
    if port.isdigit():
        attributes["server.port"] = int(port)
    return attributes


def send_span(topic: str, address: str, count: int = 1, *, tags: str | None = None,
              keys: Iterable[str] | str | None = None) -> AbstractContextManager[Span | None]:
    """A PRODUCER span around one send (``count`` > 1: a batch); None when tracing is off (a shared
    no-op context: a send pays one provider check). The caller stores :func:`message_properties`
    with the messages and sends :func:`call_metadata`."""
    tracer = _tracer()
    if tracer is None:
        return _NOOP
    return _send_span(tracer, topic, address, count, tags, keys)


@contextlib.contextmanager
def _send_span(tracer: Any, topic: str, address: str, count: int, tags: str | None,
               keys: Iterable[str] | str | None) -> Iterator[Span]:
    attributes: dict[str, Any] = {
        "messaging.system": MESSAGING_SYSTEM,
        "messaging.destination.name": topic,
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
        **_server_attributes(address),
    }
    if count > 1:
        attributes["messaging.batch.message_count"] = count
    if tags:
        attributes["messaging.rocketmq.message.tag"] = tags
    if keys:
        attributes["messaging.rocketmq.message.keys"] = list(keys.split() if isinstance(keys, str) else keys)
    with tracer.start_as_current_span(f"send {topic}", kind=trace.SpanKind.PRODUCER,
                                      attributes=attributes) as span:
        yield span


def sent(span: Span | None, msg_ids: Sequence[str]) -> None:
    """Record what the store answered: the message id of a single send, the count of a batch."""
    if span is None:
        return
    if len(msg_ids) == 1:
        span.set_attribute("messaging.message.id", msg_ids[0])
    elif msg_ids:
        span.set_attribute("messaging.batch.message_count", len(msg_ids))


def current_span() -> Span | None:
    """The application's current span while tracing is on (None otherwise or outside any span): calls
    made inside a send span, like a transactional send's half and end, carry its context with it."""
    if _tracer() is None:
        return None
    span: Span = trace.get_current_span()
    return span if span.get_span_context().is_valid else None


def message_properties(span: Span | None) -> dict[str, str]:
    """The current context as message properties (``traceparent``...); empty when tracing is off."""
    if span is None:
        return {}
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return {k: v for k, v in carrier.items() if k in (TRACEPARENT, TRACESTATE)}


def add_properties(properties: MutableMapping[str, str], trace_properties: Mapping[str, str]) -> None:
    """Add the trace properties, keeping a ``traceparent`` the application set itself."""
    if trace_properties and TRACEPARENT not in properties:
        properties.update(trace_properties)


def call_metadata(span: Span | None, metadata: Sequence[tuple[str, str]]) -> Sequence[tuple[str, str]]:
    """``metadata`` plus the current context's ``traceparent`` header, for the gateway's spans."""
    if span is None:
        return metadata
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return [*metadata, *carrier.items()]


def _producer_context(message: Message) -> Any:
    """The context the send stored with ``message`` (an empty one when it stored none)."""
    return propagate.extract({k: v for k, v in message.properties.items() if k in (TRACEPARENT, TRACESTATE)})


def received(group: str | None, address: str, started_ns: int, messages: Sequence[Message]) -> None:
    """A ``receive`` span for one poll that returned ``messages``, from ``started_ns`` to now, linked
    to each message's send. Kind CLIENT, as the conventions (1.26 and later) give a receive that asks
    the broker (it was CONSUMER before). A poll that returns nothing makes no span: long polls that
    come back empty would only fill the traces."""
    tracer = _tracer() if messages else None
    if tracer is None:
        return
    links = []
    for message in messages:
        context = trace.get_current_span(_producer_context(message)).get_span_context()
        if context.is_valid:
            links.append(trace.Link(context))
    topics = {m.topic for m in messages}
    attributes: dict[str, Any] = {
        "messaging.system": MESSAGING_SYSTEM,
        "messaging.operation.type": "receive",
        "messaging.operation.name": "receive",
        "messaging.batch.message_count": len(messages),
        **_server_attributes(address),
    }
    if len(topics) == 1:
        attributes["messaging.destination.name"] = messages[0].topic
    if group:
        attributes["messaging.consumer.group.name"] = group
    name = f"receive {messages[0].topic}" if len(topics) == 1 else "receive"
    tracer.start_span(name, kind=trace.SpanKind.CLIENT, attributes=attributes, links=links,
                      start_time=started_ns).end()


@contextlib.contextmanager
def process(message: Message, group: str | None = None) -> Iterator[Span | None]:
    """A CONSUMER span around the processing of one message, linked to the send that produced it
    (the ``traceparent`` stored with the message). With no span current, the send's context is also
    the parent, so the message's path from producer to consumer is one trace. None when tracing is off::

        for message in consumer.poll():
            with mqstore.client.tracing.process(message, group="orders"):
                handle(message)
    """
    tracer = _tracer()
    if tracer is None:
        yield None
        return
    producer = _producer_context(message)
    producer_context = trace.get_current_span(producer).get_span_context()
    links = [trace.Link(producer_context)] if producer_context.is_valid else []
    parent = None
    if producer_context.is_valid and not trace.get_current_span().get_span_context().is_valid:
        parent = producer
    attributes: dict[str, Any] = {
        "messaging.system": MESSAGING_SYSTEM,
        "messaging.destination.name": message.topic,
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.message.id": message.msg_id,
        "messaging.destination.partition.id": str(message.queue_id),
        "messaging.rocketmq.message.queue_offset": message.queue_offset,
    }
    if group:
        attributes["messaging.consumer.group.name"] = group
    if message.tags:
        attributes["messaging.rocketmq.message.tag"] = message.tags
    if message.keys:
        attributes["messaging.rocketmq.message.keys"] = list(message.keys)
    with tracer.start_as_current_span(f"process {message.topic}", context=parent, kind=trace.SpanKind.CONSUMER,
                                      attributes=attributes, links=links) as span:
        yield span

__all__ = ["MESSAGING_SYSTEM", "TRACEPARENT", "current_span", "process", "received", "send_span"]
