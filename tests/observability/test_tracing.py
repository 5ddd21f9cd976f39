"""OpenTelemetry tracing across real service processes, exported by OTLP/gRPC to a receiver in the test.

Each request carries a ``traceparent`` the test made up (the caller's span), so every span the
services make for it must land in that one trace, whichever process made it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from mqstore.v1 import commitlog_pb2, gateway_pb2, gateway_pb2_grpc, query_pb2
from services.server import channels, tracing
from tests.commitlog.commitlog_process import commitlog_env
from tests.observability.conftest import GatewayProcess, Observed
from tests.observability.otlp_receiver import (
    SPAN_KIND_CLIENT,
    SPAN_KIND_SERVER,
    OtlpReceiver,
    ReceivedSpan,
    new_traceparent,
    tracing_env,
)
from tests.query.query_process import message

GATEWAY = "mqstore-gateway"
COMMITLOG = "mqstore-commitlog"
INDEXER = "mqstore-indexer"
QUERY = "mqstore-query"
FLUSH_WAIT = "commitlog.flush_wait"


def _one(spans: list[ReceivedSpan], service: str, name: str, kind: int | None = None) -> ReceivedSpan:
    found = [s for s in spans if s.service == service and s.name == name and (kind is None or s.kind == kind)]
    assert len(found) == 1, f"expected one {name} span of {service}, got {len(found)} in {spans}"
    return found[0]


SpanCondition = Callable[[list[ReceivedSpan]], bool]


def _has(service: str, name: str, count: int = 1) -> SpanCondition:
    return lambda spans: sum(s.service == service and s.name == name for s in spans) >= count


def _all(*conditions: SpanCondition) -> SpanCondition:
    return lambda spans: all(c(spans) for c in conditions)


def _within(child: ReceivedSpan, parent: ReceivedSpan) -> None:
    assert parent.start_ns <= child.start_ns <= child.end_ns <= parent.end_ns, (child, parent)


def test_append_under_sync_flush_has_a_flush_wait_span_in_the_callers_trace(observed: Observed) -> None:
    header, trace_id, caller_span = new_traceparent()
    result = observed.system.commitlog.stub.Append(
        commitlog_pb2.AppendRequest(message=message("TraceAppend", 0, b"traced")),
        metadata=[("traceparent", header)], timeout=10)
    assert result.status == commitlog_pb2.PUT_MESSAGE_STATUS_PUT_OK

    spans = observed.receiver.wait_for(trace_id, _all(_has(COMMITLOG, "/mqstore.v1.CommitLogService/Append"),
                                                      _has(COMMITLOG, FLUSH_WAIT)))
    server = _one(spans, COMMITLOG, "/mqstore.v1.CommitLogService/Append", SPAN_KIND_SERVER)
    assert server.parent_span_id == caller_span
    flush = _one(spans, COMMITLOG, FLUSH_WAIT)
    assert flush.parent_span_id == server.span_id
    assert flush.attributes["flush_disk_type"] == "SYNC_FLUSH"
    assert flush.attributes["group_commit"] is True
    _within(flush, server)


def test_append_batch_and_stream_time_the_engines_flush_wait(observed: Observed) -> None:
    """AppendBatch and AppendStream wait for the flush in a worker thread: the span is made there,
    under the call's server span (the context follows the work into the thread)."""
    stub = observed.system.commitlog.stub
    batch_header, batch_trace, _ = new_traceparent()
    response = stub.AppendBatch(commitlog_pb2.AppendBatchRequest(
        messages=[message("TraceBatch", 0, b"a"), message("TraceBatch", 1, b"b")]),
        metadata=[("traceparent", batch_header)], timeout=10)
    assert len(response.results) == 2
    stream_header, stream_trace, _ = new_traceparent()
    acks = list(stub.AppendStream(iter([commitlog_pb2.AppendRequest(message=message("TraceStream", 0, b"s"))] * 3),
                                  metadata=[("traceparent", stream_header)], timeout=10))
    assert [a.status for a in acks] == [commitlog_pb2.PUT_MESSAGE_STATUS_PUT_OK] * 3

    for trace_id, method in ((batch_trace, "AppendBatch"), (stream_trace, "AppendStream")):
        name = f"/mqstore.v1.CommitLogService/{method}"
        spans = observed.receiver.wait_for(trace_id, _all(_has(COMMITLOG, name), _has(COMMITLOG, FLUSH_WAIT)))
        server = _one(spans, COMMITLOG, name, SPAN_KIND_SERVER)
        flushes = [s for s in spans if s.name == FLUSH_WAIT]
        assert flushes and all(f.parent_span_id == server.span_id for f in flushes)
        if method == "AppendBatch":  # a stream's single messages may join the PutBatcher's group commit
            assert all(f.attributes["group_commit"] is False for f in flushes)
        assert sum(int(str(f.attributes["messages"])) for f in flushes) == (2 if method == "AppendBatch" else 3)
        for flush in flushes:
            _within(flush, server)


def test_pull_crosses_query_indexer_and_commitlog_in_one_trace(observed: Observed) -> None:
    system = observed.system
    system.append([message("TracePull", 0, b"one"), message("TracePull", 0, b"two")])
    header, trace_id, caller_span = new_traceparent()
    response = system.query.stub.PullMessage(query_pb2.PullMessageRequest(topic="TracePull", queue_id=0),
                                             metadata=[("traceparent", header)], timeout=10)
    assert [m.body for m in response.messages] == [b"one", b"two"]

    spans = observed.receiver.wait_for(trace_id, _all(
        _has(QUERY, "/mqstore.v1.QueryService/PullMessage"),
        _has(INDEXER, "/mqstore.v1.IndexerService/GetQueueEntries"),
        _has(COMMITLOG, "/mqstore.v1.CommitLogService/ReadBatch")))
    assert {s.service for s in spans} == {QUERY, INDEXER, COMMITLOG}
    pull = _one(spans, QUERY, "/mqstore.v1.QueryService/PullMessage", SPAN_KIND_SERVER)
    assert pull.parent_span_id == caller_span
    for service, method in ((INDEXER, "/mqstore.v1.IndexerService/GetQueueEntries"),
                            (COMMITLOG, "/mqstore.v1.CommitLogService/ReadBatch")):
        server = _one(spans, service, method, SPAN_KIND_SERVER)
        client = _one(spans, QUERY, method, SPAN_KIND_CLIENT)  # the query service's call of it
        assert client.parent_span_id == pull.span_id
        assert server.parent_span_id == client.span_id
        _within(client, pull)


def test_send_and_pull_through_the_gateway_are_one_trace_each(observed: Observed, gateway: GatewayProcess) -> None:
    """The issue's two paths: a Send is gateway -> commitlog (with the flush wait), a Pull is
    gateway -> query -> indexer and commitlog."""
    stub = gateway_pb2_grpc.MessagingServiceStub(gateway.channel)
    header, send_trace, caller_span = new_traceparent()
    sent = stub.Send(gateway_pb2.SendRequest(message=message("TraceGateway", 0, b"via gateway")),
                     metadata=[("traceparent", header)], timeout=10)
    assert sent.status == commitlog_pb2.PUT_MESSAGE_STATUS_PUT_OK
    spans = observed.receiver.wait_for(send_trace, _all(_has(GATEWAY, "/mqstore.v1.MessagingService/Send"),
                                                        _has(COMMITLOG, FLUSH_WAIT)))
    send = _one(spans, GATEWAY, "/mqstore.v1.MessagingService/Send", SPAN_KIND_SERVER)
    assert send.parent_span_id == caller_span
    # Concurrent Sends share one AppendBatch (gateway/send_batcher.py); a lone Send leads its batch, so
    # its trace holds the hop: Send -> batched_append (its wait) and Send -> AppendBatch -> flush wait.
    waited = _one(spans, GATEWAY, "gateway.batched_append")
    append_client = _one(spans, GATEWAY, "/mqstore.v1.CommitLogService/AppendBatch", SPAN_KIND_CLIENT)
    append = _one(spans, COMMITLOG, "/mqstore.v1.CommitLogService/AppendBatch", SPAN_KIND_SERVER)
    assert waited.parent_span_id == send.span_id
    assert append_client.parent_span_id in (send.span_id, waited.span_id)
    assert append.parent_span_id == append_client.span_id
    assert _one(spans, COMMITLOG, FLUSH_WAIT).parent_span_id == append.span_id

    observed.system.wait_dispatched()
    header, pull_trace, caller_span = new_traceparent()
    pulled = stub.Pull(query_pb2.PullMessageRequest(topic="TraceGateway", queue_id=sent.queue_id),
                       metadata=[("traceparent", header)], timeout=10)
    assert [m.body for m in pulled.messages] == [b"via gateway"]
    spans = observed.receiver.wait_for(pull_trace, _all(
        _has(GATEWAY, "/mqstore.v1.MessagingService/Pull"), _has(QUERY, "/mqstore.v1.QueryService/PullMessage"),
        _has(INDEXER, "/mqstore.v1.IndexerService/GetQueueEntries"),
        _has(COMMITLOG, "/mqstore.v1.CommitLogService/ReadBatch")))
    pull = _one(spans, GATEWAY, "/mqstore.v1.MessagingService/Pull", SPAN_KIND_SERVER)
    assert pull.parent_span_id == caller_span
    query_client = _one(spans, GATEWAY, "/mqstore.v1.QueryService/PullMessage", SPAN_KIND_CLIENT)
    query = _one(spans, QUERY, "/mqstore.v1.QueryService/PullMessage", SPAN_KIND_SERVER)
    assert (query_client.parent_span_id, query.parent_span_id) == (pull.span_id, query_client.span_id)
    for service, method in ((INDEXER, "/mqstore.v1.IndexerService/GetQueueEntries"),
                            (COMMITLOG, "/mqstore.v1.CommitLogService/ReadBatch")):
        client = _one(spans, QUERY, method, SPAN_KIND_CLIENT)
        assert client.parent_span_id == query.span_id
        assert _one(spans, service, method, SPAN_KIND_SERVER).parent_span_id == client.span_id


def test_search_offset_crosses_the_indexers_blocking_channel(observed: Observed) -> None:
    """The indexer (a thread-pool server) reads store times from the commitlog on a blocking channel:
    that hop joins the trace too."""
    system = observed.system
    stored = system.append([message("TraceSearch", 0, b"t")])[0]
    header, trace_id, _ = new_traceparent()
    system.query.stub.SearchOffset(query_pb2.SearchOffsetRequest(topic="TraceSearch", queue_id=0,
                                                                 timestamp=stored.store_timestamp),
                                   metadata=[("traceparent", header)], timeout=10)
    read = "/mqstore.v1.CommitLogService/Read"
    spans = observed.receiver.wait_for(trace_id, _all(_has(COMMITLOG, read), _has(INDEXER, read)))
    by_time = _one(spans, INDEXER, "/mqstore.v1.IndexerService/GetOffsetByTime", SPAN_KIND_SERVER)
    client = _one(spans, INDEXER, read, SPAN_KIND_CLIENT)
    server = _one(spans, COMMITLOG, read, SPAN_KIND_SERVER)
    assert client.parent_span_id == by_time.span_id
    assert server.parent_span_id == client.span_id


def test_long_lived_streams_and_health_checks_make_no_spans(observed: Observed) -> None:
    """Tail (indexer -> commitlog), WatchArrivals (query -> indexer) and the health probes run all the
    time, but their spans would only say that a connection exists: none are exported."""
    observed.system.append([message("TraceQuiet", 0)])  # the Tail and WatchArrivals streams carry data
    header, trace_id, _ = new_traceparent()
    observed.system.commitlog.stub.GetStoreInfo(commitlog_pb2.GetStoreInfoRequest(),
                                                metadata=[("traceparent", header)], timeout=5)
    observed.receiver.wait_for(trace_id, _has(COMMITLOG, "/mqstore.v1.CommitLogService/GetStoreInfo"))
    names = {s.name for s in observed.receiver.spans}
    assert not {n for n in names if n.endswith(("/Tail", "/WatchArrivals")) or "grpc.health" in n}, names


_PROBE = """
import json, logging, sys
from services.server import tracing
from services.server.logs import configure_logging

configure_logging(stream=sys.stdout)
assert tracing.init_tracing("probe")
with tracing.span("probe.outer", key="v"):
    logging.getLogger("probe").info("inside")
    with tracing.child_span("probe.inner"):
        pass
    print(json.dumps({"trace": tracing.current_trace_id()}), flush=True)
with tracing.child_span("probe.orphan"):  # no span of a request around it: no trace of its own
    pass
tracing.shutdown_tracing()
"""


def test_in_process_spans_and_log_lines_share_the_trace(tmp_path: Path) -> None:
    """``span``/``child_span`` with tracing on, in a process of its own (the provider is global), and
    the JSON log lines written inside a span carry its trace and span ids."""
    receiver = OtlpReceiver().start()
    try:
        env = {**commitlog_env(tracing_env(receiver)), "PYTHONPATH": str(Path(__file__).parents[2])}
        done = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True,
                              text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        lines = [json.loads(line) for line in done.stdout.splitlines()]
        trace_id = next(line["trace"] for line in lines if "trace" in line)
        spans = receiver.wait_for(trace_id, _all(_has("mqstore-probe", "probe.outer"),
                                                 _has("mqstore-probe", "probe.inner")))
        outer = _one(spans, "mqstore-probe", "probe.outer")
        assert outer.attributes == {"key": "v"}
        assert _one(spans, "mqstore-probe", "probe.inner").parent_span_id == outer.span_id
        assert not [s for s in receiver.spans if s.name == "probe.orphan"]
        inside = next(line for line in lines if line.get("msg") == "inside")
        assert (inside["trace_id"], inside["span_id"]) == (trace_id, outer.span_id)
    finally:
        receiver.stop()


def test_tracing_off_adds_no_interceptor() -> None:
    """This test process has not called init_tracing: no interceptor anywhere, plain channels."""
    assert not tracing.ENABLED
    assert tracing.server_interceptors() == []
    assert tracing.aio_server_interceptors() == []
    assert tracing.client_interceptors() == []
    assert tracing.aio_client_interceptors() == []
    with tracing.span("noop", attribute=1) as span:
        assert span is None
    with tracing.child_span("noop") as span:
        assert span is None
    assert tracing.current_trace_id() is None
    channel = channels.sync_channel("127.0.0.1:1")
    try:
        assert type(channel).__module__ == "grpc._channel"  # not OpenTelemetry's intercepting wrapper
    finally:
        channel.close()


@pytest.mark.parametrize(("env", "on"), [
    ({}, False),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317"}, True),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://jaeger:4317"}, True),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": " "}, False),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317", "OTEL_SDK_DISABLED": "TRUE"}, False),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317", "OTEL_SDK_DISABLED": "false"}, True),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317", "OTEL_TRACES_EXPORTER": "none"}, False),
    ({"OTEL_TRACES_SAMPLER": "always_on"}, False),
])
def test_tracing_is_on_only_when_the_standard_environment_asks(env: dict[str, str], on: bool) -> None:
    assert tracing.tracing_requested(env) is on


@pytest.mark.parametrize(("method", "traced"), [
    ("/mqstore.v1.CommitLogService/Append", True),
    ("/mqstore.v1.QueryService/PullMessage", True),
    ("/mqstore.v1.CommitLogService/Tail", False),
    ("/mqstore.v1.IndexerService/WatchArrivals", False),
    ("/grpc.health.v1.Health/Check", False),
    ("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", False),
])
def test_which_methods_are_traced(method: str, traced: bool) -> None:
    assert tracing.traced_method(method) is traced
    assert tracing.traced_method("/mqstore.v1.QueryService/PullMessage", frozenset({"mqstore.v1.QueryService"})) \
        is False
