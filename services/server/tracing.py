"""OpenTelemetry tracing for every mqstore process, on only when the standard OTEL_* environment asks.

Tracing is on when ``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is set,
``OTEL_SDK_DISABLED`` is not ``true`` and ``OTEL_TRACES_EXPORTER`` is not ``none``. Spans then go by
OTLP/gRPC (what Jaeger and the OpenTelemetry Collector ingest on port 4317) through a batch processor;
the SDK itself reads the other variables (``OTEL_TRACES_SAMPLER``, ``OTEL_BSP_*``,
``OTEL_EXPORTER_OTLP_HEADERS``, ``OTEL_RESOURCE_ATTRIBUTES``, ...).

Off is the default and must cost nothing on the hot path: the SDK is not even imported, the servers
and channels get no interceptor at all (the lists below are empty), and in-process spans are one
check of the module-level :data:`ENABLED` flag. Hot paths test ``tracing.ENABLED`` themselves before
building attributes.

Long-lived streams (the commitlog's Tail, the indexer's WatchArrivals), health checks and reflection
are never traced: a span that lives as long as a connection says nothing and is only exported at its
end. ``OTEL_PYTHON_GRPC_EXCLUDED_SERVICES`` (comma-separated gRPC service names) excludes more.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import logging
import os
import threading
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import grpc

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer
    from opentelemetry.util.types import AttributeValue

log = logging.getLogger(__name__)

#: True once :func:`init_tracing` turned tracing on in this process. Read it, never set it.
ENABLED = False

ENDPOINT_ENVS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
#: Methods never traced: long-lived streams (one span per connection would say nothing).
UNTRACED_METHODS = frozenset({"Tail", "WatchArrivals"})
#: gRPC services never traced: probes and tooling.
UNTRACED_SERVICE_PREFIXES = ("grpc.health.", "grpc.reflection.")
EXCLUDED_SERVICES_ENV = "OTEL_PYTHON_GRPC_EXCLUDED_SERVICES"
#: ``messaging.system`` of mqstore's spans: it stores RocketMQ's message model (docs/observability.md).
MESSAGING_SYSTEM = "rocketmq"
SHUTDOWN_TIMEOUT_S = 3.0

_provider: TracerProvider | None = None
_tracer: Tracer | None = None
_current_span: Callable[[], Span] | None = None
_NOOP: AbstractContextManager[None] = contextlib.nullcontext()


def tracing_requested(env: Mapping[str, str] | None = None) -> bool:
    """Whether the standard environment asks for traces (an endpoint, and not disabled)."""
    env = os.environ if env is None else env
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if env.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return False
    return any(env.get(name, "").strip() for name in ENDPOINT_ENVS)


def init_tracing(service_name: str) -> bool:
    """Turn tracing on for this process if the environment asks; returns whether it is on.

    Call once at process start, before servers and channels are built (they take their interceptors
    then). ``service.name`` is ``OTEL_SERVICE_NAME`` if set, else ``mqstore-<service_name>``.
    """
    global ENABLED, _provider, _tracer, _current_span
    if ENABLED:
        return True
    if not tracing_requested():
        return False
    exporter_name = os.environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() or "otlp"
    if exporter_name not in ("otlp", "otlp_proto_grpc"):
        log.warning("OTEL_TRACES_EXPORTER=%s is not supported here: exporting by OTLP/gRPC", exporter_name)
    # Imported here so a process without tracing never loads the SDK.
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    name = os.environ.get("OTEL_SERVICE_NAME", "").strip() or f"mqstore-{service_name}"
    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: name}))
    provider.sampler = _internal_calls_unsampled(provider.sampler)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    _rate_limit_exporter_logs()
    trace.set_tracer_provider(provider)
    _provider = provider
    _tracer = provider.get_tracer("mqstore")
    _current_span = trace.get_current_span
    _install_log_correlation()
    ENABLED = True
    endpoint = next((os.environ[e] for e in ENDPOINT_ENVS if os.environ.get(e, "").strip()), "")
    log.info("tracing on: spans of %s go by OTLP/gRPC to %s", name, endpoint,
             extra={"service_name": name, "otlp_endpoint": endpoint})
    return True


def shutdown_tracing() -> None:
    """Export the spans still buffered and stop the exporter; call on the process's stop path.
    Bounded: a collector that is down costs the stop at most SHUTDOWN_TIMEOUT_S."""
    global ENABLED, _provider, _tracer, _current_span
    provider, _provider = _provider, None
    ENABLED = False
    _tracer = _current_span = None
    if provider is None:
        return
    # The SDK's own shutdown waits out the exporter's retries (10 s and more with the collector
    # down): run it aside and give it a bounded time; what is not exported by then is dropped.
    stopper = threading.Thread(target=provider.shutdown, name="otel-shutdown", daemon=True)
    stopper.start()
    stopper.join(SHUTDOWN_TIMEOUT_S)
    if stopper.is_alive():
        log.warning("spans not exported within %.0f s at stop (is the collector reachable?): dropped",
                    SHUTDOWN_TIMEOUT_S)


def _internal_calls_unsampled(configured: Any) -> Any:
    """The configured sampler (``OTEL_TRACES_SAMPLER``), except that internal polling starts no trace.

    An RPC made outside any trace is a process's own background work (the scheduler polling
    GetQueueOffsets, the query service refreshing its view of the log or its lag figures): dozens a
    second that would drown the traces of requests. Its CLIENT span is not sampled; the unsampled
    context still goes with the call, and the callee drops a span whose remote parent was not sampled
    (whatever the configured sampler: ``always_on`` included), so no half-trace starts there either.
    """
    from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult
    from opentelemetry.trace import SpanKind, get_current_span

    class InternalCallsUnsampled(Sampler):
        def should_sample(self, parent_context: Any, trace_id: int, name: str, kind: Any = None,
                          attributes: Any = None, links: Any = None, trace_state: Any = None) -> SamplingResult:
            parent = get_current_span(parent_context).get_span_context()
            if (not parent.is_valid and kind == SpanKind.CLIENT) or \
                    (parent.is_valid and parent.is_remote and not parent.trace_flags.sampled):
                return SamplingResult(Decision.DROP, None, parent.trace_state if parent.is_valid else None)
            result: SamplingResult = configured.should_sample(parent_context, trace_id, name, kind, attributes,
                                                              links, trace_state)
            return result

        def get_description(self) -> str:
            return f"InternalCallsUnsampled{{{configured.get_description()}}}"

    return InternalCallsUnsampled()


class _RateLimitedLogs(logging.Filter):
    """Lets a logger's WARNING and ERROR lines through once per ``interval_s``; the next line that
    passes says how many were held back. The OTLP exporter logs every failed try (a retry in 1 s, 2 s,
    ... and a failure per batch): with the collector down that is a line or two a second, forever."""

    def __init__(self, interval_s: float) -> None:
        super().__init__()
        self._interval_s = interval_s
        self._passed_at = float("-inf")
        self._held = 0
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        with self._lock:
            if record.created - self._passed_at < self._interval_s:
                self._held += 1
                return False
            self._passed_at, held, self._held = record.created, self._held, 0
        if held:
            record.msg = f"{record.msg} ({held} similar lines held back in the last {self._interval_s:.0f} s)"
        return True


#: The exporter's and the batch processor's loggers, each rate-limited on its own.
EXPORTER_LOGGERS = ("opentelemetry.exporter.otlp.proto.grpc.exporter", "opentelemetry.sdk.trace.export",
                    "opentelemetry.sdk._shared_internal")
EXPORTER_LOG_INTERVAL_S = 60.0


def _rate_limit_exporter_logs() -> None:
    for name in EXPORTER_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _RateLimitedLogs) for f in logger.filters):
            logger.addFilter(_RateLimitedLogs(EXPORTER_LOG_INTERVAL_S))


# -- in-process spans ------------------------------------------------------------------------------
def span(name: str, **attributes: AttributeValue) -> AbstractContextManager[Span | None]:
    """A span around a block, a child of the current one; a shared no-op context when tracing is off."""
    tracer = _tracer
    if tracer is None:
        return _NOOP
    return tracer.start_as_current_span(name, attributes=attributes)


def child_span(name: str, **attributes: AttributeValue) -> AbstractContextManager[Span | None]:
    """Like :func:`span`, but only under a span of this request: work that serves no single request
    (a batch of many producers' messages, a background thread) starts no trace of its own."""
    tracer, current_span = _tracer, _current_span
    if tracer is None or current_span is None:
        return _NOOP
    if not current_span().get_span_context().is_valid:
        return _NOOP
    return tracer.start_as_current_span(name, attributes=attributes)


def annotate(attributes: Mapping[str, AttributeValue]) -> None:
    """Add ``attributes`` to the current span (in a servicer: the RPC's SERVER span), e.g. the
    messaging attributes that let Jaeger find a message's trace by topic or message id. Nothing when
    tracing is off or no span is recording."""
    current_span = _current_span
    if current_span is None:
        return
    span = current_span()
    if span.is_recording():
        span.set_attributes(attributes)


def current_trace_id() -> str | None:
    """The current trace id as 32 hex digits, None without a recording span (or with tracing off)."""
    current_span = _current_span
    if current_span is None:
        return None
    context = current_span().get_span_context()
    return format(context.trace_id, "032x") if context.is_valid else None


def _install_log_correlation() -> None:
    """Log lines written inside a span carry its ``trace_id`` and ``span_id`` (the JSON formatter
    writes every extra attribute), so a trace in Jaeger leads to its log lines and back."""
    from opentelemetry import trace

    previous = logging.getLogRecordFactory()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        context = trace.get_current_span().get_span_context()
        if context.is_valid:
            record.trace_id = format(context.trace_id, "032x")
            record.span_id = format(context.span_id, "016x")
        return record

    logging.setLogRecordFactory(factory)


# -- gRPC interceptors -----------------------------------------------------------------------------
def _excluded_services() -> frozenset[str]:
    text = os.environ.get(EXCLUDED_SERVICES_ENV, "")
    return frozenset(s.strip() for s in text.split(",") if s.strip())


def _method_of(details: Any) -> str:
    """``/package.Service/Method`` from any of grpc's call details (aio may hand bytes)."""
    method = getattr(details, "method", None) or getattr(details, "full_method", "") or ""
    return method.decode() if isinstance(method, bytes) else str(method)


def traced_method(full_method: str, excluded_services: frozenset[str] = frozenset()) -> bool:
    """Whether calls of ``/package.Service/Method`` get spans."""
    service, _, method = full_method.lstrip("/").rpartition("/")
    return not (method in UNTRACED_METHODS or service.startswith(UNTRACED_SERVICE_PREFIXES)
                or service in excluded_services)


def _filter() -> Callable[[Any], bool]:
    excluded = _excluded_services()
    return lambda details: traced_method(_method_of(details), excluded)


def _instrumentation(module: str = "") -> Any:
    """opentelemetry-instrumentation-grpc (untyped), imported only once tracing is on."""
    return importlib.import_module("opentelemetry.instrumentation.grpc" + module)


def _rpc_provider(target: str | None = None) -> Any:
    """The provider the gRPC instrumentation gets: its spans carry the current attribute names
    (services/server/rpc_semconv.py), a client channel's also its ``server.address``."""
    from services.server.rpc_semconv import RpcTracerProvider

    assert _provider is not None
    return RpcTracerProvider(_provider, target)


def server_interceptors() -> list[grpc.ServerInterceptor[Any, Any]]:
    """Interceptors for a ``grpc.server``: a SERVER span per call, parented by the caller's
    ``traceparent``. Empty when tracing is off."""
    if not ENABLED:
        return []
    return [_instrumentation().server_interceptor(tracer_provider=_rpc_provider(), filter_=_filter())]


def aio_server_interceptors() -> list[grpc.aio.ServerInterceptor[Any, Any]]:
    """Interceptors for a ``grpc.aio.server``. Empty when tracing is off."""
    if not ENABLED:
        return []
    return [_aio_server_interceptor()]


def client_interceptors(target: str | None = None) -> list[Any]:
    """Interceptors for a blocking channel, to be applied with OpenTelemetry's own ``intercept_channel``
    (they are not ``grpc.*ClientInterceptor``s; :func:`services.server.channels.sync_channel` does it).
    A CLIENT span per call (``server.address``/``server.port``: ``target``) and the ``traceparent``
    header. Empty when tracing is off."""
    if not ENABLED:
        return []
    return [_instrumentation().client_interceptor(tracer_provider=_rpc_provider(target), filter_=_filter())]


def aio_client_interceptors(target: str | None = None) -> list[grpc.aio.ClientInterceptor]:
    """Interceptors for a ``grpc.aio`` channel to ``target``. Empty when tracing is off."""
    if not ENABLED:
        return []
    interceptors: list[grpc.aio.ClientInterceptor] = _instrumentation().aio_client_interceptors(
        tracer_provider=_rpc_provider(target), filter_=_filter())
    return interceptors


def intercept_sync_channel(channel: grpc.Channel, target: str | None = None) -> grpc.Channel:
    """``channel`` (to ``target``) with the blocking client interceptors, or ``channel`` itself when
    tracing is off."""
    interceptors = client_interceptors(target)
    if not interceptors:
        return channel
    intercepted: grpc.Channel = _instrumentation(".grpcext").intercept_channel(channel, *interceptors)
    return intercepted


def _aio_server_interceptor() -> grpc.aio.ServerInterceptor[Any, Any]:
    """OpenTelemetry's aio server interceptor, taught one more handler shape.

    Its streaming-response wrapper iterates the handler as an async generator; our streaming handlers
    (AppendStream, Tail) are coroutines that send with ``context.write``, which that wrapper would
    break. Those are awaited inside the span instead.
    """
    from opentelemetry import trace

    _aio_server = _instrumentation("._aio_server")
    base: Any = _aio_server.OpenTelemetryAioServerInterceptor

    class _Interceptor(base):  # type: ignore[misc]
        def _intercept_aio_server_stream(self, behavior: Any, handler_call_details: Any) -> Any:
            if inspect.isasyncgenfunction(behavior):
                return super()._intercept_aio_server_stream(behavior, handler_call_details)

            async def _write_interceptor(request_or_iterator: Any, context: Any) -> None:
                with self._set_remote_context(context), \
                        self._start_span(handler_call_details, context, set_status_on_exception=False) as span:
                    context = _aio_server._OpenTelemetryAioServicerContext(context, span)
                    try:
                        await behavior(request_or_iterator, context)
                    except Exception as error:
                        if type(error) is not Exception:  # a bare Exception is grpc's abort
                            span.record_exception(error)
                        raise

            return _write_interceptor

    tracer = trace.get_tracer("opentelemetry.instrumentation.grpc", tracer_provider=_rpc_provider())
    interceptor: grpc.aio.ServerInterceptor[Any, Any] = _Interceptor(tracer, filter_=_filter())
    return interceptor


__all__ = [
    "ENABLED",
    "MESSAGING_SYSTEM",
    "aio_client_interceptors",
    "annotate",
    "aio_server_interceptors",
    "child_span",
    "client_interceptors",
    "current_trace_id",
    "init_tracing",
    "intercept_sync_channel",
    "server_interceptors",
    "shutdown_tracing",
    "span",
    "traced_method",
    "tracing_requested",
]
