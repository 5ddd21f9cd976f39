"""The current OpenTelemetry attribute names on the gRPC spans that opentelemetry-instrumentation-grpc makes.

That instrumentation still writes the deprecated ``net.peer.ip`` / ``net.peer.port`` / ``net.peer.name``
on SERVER spans and nothing about the callee on CLIENT spans. The semantic conventions now say:

* SERVER span: ``network.peer.address`` and ``network.peer.port`` (the caller's socket address);
* CLIENT span: ``server.address`` and ``server.port`` (the service called, as the channel names it).

The instrumentation takes its tracer from the provider it is given, so it is given
:class:`RpcTracerProvider`: its tracer renames the attributes as each span starts (nothing to rewrite
at export) and adds the channel's target to the CLIENT spans of that channel.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer, TracerProvider

#: Deprecated name -> current name (SERVER spans).
RENAMED = {"net.peer.ip": "network.peer.address", "net.peer.port": "network.peer.port"}
#: Deprecated names dropped without a successor here (``net.peer.name`` was "localhost" for loopback).
DROPPED = frozenset({"net.peer.name"})


def current_attributes(attributes: Mapping[str, Any] | None, extra: Mapping[str, Any]) -> dict[str, Any]:
    """``attributes`` under their current names, plus ``extra`` (e.g. ``server.address``)."""
    out: dict[str, Any] = {}
    for key, value in (attributes or {}).items():
        if key in DROPPED:
            continue
        name = RENAMED.get(key, key)
        if name == "network.peer.port" and isinstance(value, str) and value.isdigit():
            value = int(value)
        out[name] = value
    out.update(extra)
    return out


def server_attributes(target: str) -> dict[str, Any]:
    """``server.address`` and ``server.port`` of a channel target (``host:port``, ``[v6]:port``,
    ``dns:///host:port``)."""
    text = target.split("///", 1)[-1]
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        return {"server.address": text}
    return {"server.address": host.strip("[]"), "server.port": int(port)}


class RpcTracer:
    """A tracer that starts spans with the current attribute names (and ``extra`` ones)."""

    def __init__(self, tracer: Tracer, extra: Mapping[str, Any]) -> None:
        self._tracer = tracer
        self._extra = dict(extra)

    def start_span(self, name: str, context: Any = None, kind: Any = None,
                   attributes: Mapping[str, Any] | None = None, **kwargs: Any) -> Span:
        if kind is not None:
            kwargs["kind"] = kind
        return self._tracer.start_span(name, context, attributes=current_attributes(attributes, self._extra),
                                       **kwargs)

    @contextmanager
    def start_as_current_span(self, name: str, context: Any = None, kind: Any = None,
                              attributes: Mapping[str, Any] | None = None, **kwargs: Any) -> Iterator[Span]:
        if kind is not None:
            kwargs["kind"] = kind
        with self._tracer.start_as_current_span(
                name, context, attributes=current_attributes(attributes, self._extra), **kwargs) as span:
            yield span


class RpcTracerProvider:
    """What the gRPC instrumentation is given as its tracer provider: ``get_tracer`` returns an
    :class:`RpcTracer`; ``target`` (a client channel's) becomes ``server.address``/``server.port``."""

    def __init__(self, provider: TracerProvider, target: str | None = None) -> None:
        self._provider = provider
        self._extra = server_attributes(target) if target else {}

    def get_tracer(self, *args: Any, **kwargs: Any) -> RpcTracer:
        return RpcTracer(self._provider.get_tracer(*args, **kwargs), self._extra)
