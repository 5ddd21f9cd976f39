"""An OTLP/gRPC trace receiver in the test process: what Jaeger or a Collector is to the services.

The services export to ``OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:<port>``; every span they send
is kept with the ``service.name`` of the process that sent it, so a test can follow one trace id
across processes.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass, field

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

SPAN_KIND_SERVER = trace_pb2.Span.SPAN_KIND_SERVER
SPAN_KIND_CLIENT = trace_pb2.Span.SPAN_KIND_CLIENT
SPAN_KIND_INTERNAL = trace_pb2.Span.SPAN_KIND_INTERNAL
SPAN_KIND_PRODUCER = trace_pb2.Span.SPAN_KIND_PRODUCER
SPAN_KIND_CONSUMER = trace_pb2.Span.SPAN_KIND_CONSUMER
STATUS_ERROR = trace_pb2.Status.STATUS_CODE_ERROR


@dataclass(frozen=True)
class ReceivedSpan:
    service: str
    name: str
    kind: int
    trace_id: str
    span_id: str
    parent_span_id: str
    attributes: dict[str, object] = field(default_factory=dict)
    start_ns: int = 0
    end_ns: int = 0
    #: (trace id, span id) of each link.
    links: tuple[tuple[str, str], ...] = ()
    status_code: int = 0
    status_message: str = ""


def _value(value: common_pb2.AnyValue) -> object:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, kind) if kind in ("string_value", "bool_value", "int_value", "double_value") else None


class OtlpReceiver(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.spans: list[ReceivedSpan] = []
        self.exports = 0
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="otlp"))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self._server)  # type: ignore[no-untyped-call]
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self.endpoint = f"http://127.0.0.1:{self.port}"

    def start(self) -> OtlpReceiver:
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop(0).wait()

    def Export(self, request: trace_service_pb2.ExportTraceServiceRequest,
               context: grpc.ServicerContext) -> trace_service_pb2.ExportTraceServiceResponse:
        received = []
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            service = str(resource.get("service.name", ""))
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    received.append(ReceivedSpan(
                        service, span.name, span.kind, span.trace_id.hex(), span.span_id.hex(),
                        span.parent_span_id.hex(), {a.key: _value(a.value) for a in span.attributes},
                        span.start_time_unix_nano, span.end_time_unix_nano,
                        tuple((link.trace_id.hex(), link.span_id.hex()) for link in span.links),
                        span.status.code, span.status.message))
        with self._cond:
            self.spans.extend(received)
            self.exports += 1
            self._cond.notify_all()
        return trace_service_pb2.ExportTraceServiceResponse()

    def trace(self, trace_id: str) -> list[ReceivedSpan]:
        with self._cond:
            return [s for s in self.spans if s.trace_id == trace_id]

    def wait_for(self, trace_id: str, done: Callable[[list[ReceivedSpan]], bool],
                 timeout_s: float = 15.0) -> list[ReceivedSpan]:
        """The spans of ``trace_id`` once ``done(spans)`` holds; AssertionError with what came after the timeout."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                spans = [s for s in self.spans if s.trace_id == trace_id]
                if done(spans):
                    return spans
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    names = sorted((s.service, s.name) for s in spans)
                    raise AssertionError(f"trace {trace_id} incomplete after {timeout_s}s: {names}")
                self._cond.wait(remaining)


def new_traceparent() -> tuple[str, str, str]:
    """A sampled W3C ``traceparent`` for a caller span of the test: (header, trace id, span id)."""
    trace_id, span_id = os.urandom(16).hex(), os.urandom(8).hex()
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


def tracing_env(receiver: OtlpReceiver) -> dict[str, str]:
    """The standard OTEL_* settings that turn tracing on, exporting to ``receiver`` quickly."""
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.endpoint,
        "OTEL_EXPORTER_OTLP_INSECURE": "true",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        "OTEL_TRACES_SAMPLER": "always_on",
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_SDK_DISABLED": "false",
        "OTEL_SERVICE_NAME": "",  # each process names itself mqstore-<service>
    }
