"""Traces an operator can read: an idle system starts (almost) no traces, a transactional message is one
trace from the producer's send through its commit to the consumer, and a collector that is down costs a
bounded number of log lines.

- internal polling (the scheduler's GetQueueOffsets, the query service's lag refresh, ...) starts no
  trace: an RPC made outside any trace is not sampled, and the callee follows that decision, even
  under ``OTEL_TRACES_SAMPLER=always_on`` (what the fixtures run with). The idle window here is 10 s
  rather than 30 s: the polling runs every second or faster, so 10 s holds the same rounds;
- ``TransactionProducer.send`` is one PRODUCER span around the half, the local transaction and the
  EndTransaction call: the gateway's EndTransaction is in that trace, and the committed message carries
  the half's ``traceparent``, so the consumer's ``process`` span is in it too;
- with the collector down, the exporter's WARNING/ERROR lines are rate-limited (the first one, then at
  most one per interval with the count of those held back).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from tests.commitlog.commitlog_process import commitlog_env, free_port
from tests.observability.conftest import TracedUp
from tests.observability.otlp_receiver import SPAN_KIND_CONSUMER, SPAN_KIND_PRODUCER, SPAN_KIND_SERVER

REPO = Path(__file__).parents[2]
IDLE_WINDOW_S = 10.0
END_TRANSACTION = "/mqstore.v1.MessagingService/EndTransaction"


def test_an_idle_system_starts_fewer_than_one_trace_a_second(traced_up: TracedUp) -> None:
    receiver = traced_up.receiver
    time.sleep(1.0)  # what a previous test sent is exported by now (the batch delay is 100 ms)
    start_ns = time.time_ns()
    time.sleep(IDLE_WINDOW_S)
    end_ns = time.time_ns()
    time.sleep(1.0)  # the window's last spans reach the receiver
    in_window = [s for s in receiver.spans if start_ns <= s.start_ns < end_ns]
    roots = [s for s in in_window if not s.parent_span_id]
    exported_ids = {s.span_id for s in receiver.spans}
    orphans = [s for s in in_window if s.parent_span_id and s.parent_span_id not in exported_ids]
    names = sorted({(s.service, s.name) for s in roots + orphans})
    assert len(roots) < IDLE_WINDOW_S, f"{len(roots)} root spans in {IDLE_WINDOW_S:.0f} s idle: {names}"
    # A callee's span under a caller's span that was never exported is a trace fragment, just as bad.
    assert len(orphans) < IDLE_WINDOW_S, f"{len(orphans)} spans without their parent in {IDLE_WINDOW_S:.0f} s: {names}"


_TRANSACTION_APP = """
import json, sys, time
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from mqstore.client import PullConsumer, tracing
from mqstore.client.transaction_producer import TransactionProducer, TransactionState

gateway, endpoint, topic = sys.argv[1:4]
provider = TracerProvider(resource=Resource.create({"service.name": "payments-app"}))
provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=endpoint, insecure=True)))
trace.set_tracer_provider(provider)
out = {}
with TransactionProducer("payments-producers", lambda message, arg: TransactionState.COMMIT,
                         address=gateway) as producer:
    result = producer.send(topic, b"paid", keys="payment-1")
    out["committed"] = result.state.name
    out["msg_id"] = result.half.msg_id
with PullConsumer("payments-group", topic, gateway, rebalance=False, long_poll_ms=1000) as consumer:
    deadline = time.monotonic() + 20
    messages = []
    while not messages and time.monotonic() < deadline:
        messages = consumer.poll(timeout=1)
    with tracing.process(messages[0], group="payments-group") as span:
        context = span.get_span_context()
        out["process"] = [format(context.trace_id, "032x"), format(context.span_id, "016x")]
    out["traceparent"] = messages[0].properties.get("traceparent")
provider.shutdown()
print(json.dumps(out), flush=True)
"""


def test_a_transaction_commit_and_its_consumer_are_one_trace(traced_up: TracedUp) -> None:
    env = {**commitlog_env(), "PYTHONPATH": str(REPO)}
    env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    done = subprocess.run([sys.executable, "-c", _TRANSACTION_APP, traced_up.up.gateway,
                           traced_up.receiver.endpoint, "TracedPayments"],
                          env=env, capture_output=True, text=True, timeout=90, check=False)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["committed"] == "COMMIT"
    trace_id, process_span_id = out["process"]
    spans = traced_up.receiver.wait_for(trace_id, lambda s: any(x.name == END_TRANSACTION for x in s)
                                        and any(x.kind == SPAN_KIND_CONSUMER for x in s))
    sends = [s for s in spans if s.name == "send TracedPayments" and s.kind == SPAN_KIND_PRODUCER]
    assert len(sends) == 1, [(s.service, s.name) for s in spans]
    send = sends[0]
    assert send.attributes["messaging.message.id"] == out["msg_id"]
    end = next(s for s in spans if s.name == END_TRANSACTION and s.kind == SPAN_KIND_SERVER)
    process = next(s for s in spans if s.span_id == process_span_id)
    assert (trace_id, send.span_id) in process.links and process.parent_span_id == send.span_id
    # the commit happened inside the send: the gateway's EndTransaction is a descendant of it
    by_id = {s.span_id: s for s in spans}
    ancestor = end
    while ancestor.parent_span_id in by_id and ancestor.span_id != send.span_id:
        ancestor = by_id[ancestor.parent_span_id]
    assert ancestor.span_id == send.span_id, (end, send)
    assert str(out["traceparent"]).split("-")[1] == trace_id


_DOWN_COLLECTOR = """
import time
from services.server import logs, tracing

logs.configure_logging()
assert tracing.init_tracing("probe")
deadline = time.monotonic() + 4
while time.monotonic() < deadline:
    with tracing.span("probe.work"):
        pass
    time.sleep(0.05)
tracing.shutdown_tracing()
"""


def test_a_collector_that_is_down_costs_a_bounded_number_of_log_lines() -> None:
    endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    env = {**commitlog_env(), "PYTHONPATH": str(REPO), "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
           "OTEL_EXPORTER_OTLP_INSECURE": "true", "OTEL_BSP_SCHEDULE_DELAY": "100", "OTEL_SDK_DISABLED": "false",
           "OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_TIMEOUT": "2"}
    done = subprocess.run([sys.executable, "-c", _DOWN_COLLECTOR], env=env, capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    loud = [line for line in lines
            if line["level"] in ("WARNING", "ERROR") and line["logger"].startswith("opentelemetry")]
    assert loud, "the exporter said nothing about the collector being down"
    # 4 s of spans: the first line, then at most one per interval (a minute): not one or two a second.
    assert len(loud) <= 2, [line["msg"] for line in loud]
