"""Client channels between mqstore processes. Every internal hop is made here, so cross-cutting
concerns of the client side (trace context propagation) are added in one place.

With tracing on (see :mod:`services.server.tracing`) each channel carries OpenTelemetry's client
interceptors: a CLIENT span per call and the W3C ``traceparent`` header, so the server's span joins
the caller's trace. With tracing off the channels are plain grpc channels, without any interceptor.
With a service credential configured (:mod:`services.server.service_auth`) every call carries it.
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc

from services.server import service_auth, tracing

ChannelOptions = Sequence[tuple[str, int | str]]


def aio_channel(address: str, options: ChannelOptions = ()) -> grpc.aio.Channel:
    """A ``grpc.aio`` channel to another mqstore service."""
    interceptors = [*tracing.aio_client_interceptors(address),
                    *service_auth.aio_client_interceptors(service_auth.load_service_token())]
    return grpc.aio.insecure_channel(address, options=list(options), interceptors=interceptors or None)


def sync_channel(address: str, options: ChannelOptions = ()) -> grpc.Channel:
    """A blocking channel to another mqstore service. With tracing on, a server-streaming call that
    is traced returns a plain iterator (no ``cancel()``); the untraced long-lived streams (Tail,
    WatchArrivals) keep their call object."""
    channel = grpc.insecure_channel(address, options=list(options))
    token = service_auth.load_service_token()
    if token:
        channel = grpc.intercept_channel(channel, service_auth.SyncTokenClientInterceptor(token))
    return tracing.intercept_sync_channel(channel, address)
