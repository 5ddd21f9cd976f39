"""The service credential: how the internal services (commitlog, indexer, query) know their caller is
one of their own deployment's processes and not anyone who can reach the port.

Every process of one deployment is given the same secret, ``MQSTORE_SERVICE_TOKEN`` (or a file
holding it, ``MQSTORE_SERVICE_TOKEN_FILE``, the way a Kubernetes Secret is mounted). The client side
(:mod:`services.server.channels`, the only place internal channels are made) sends it as the
``mqstore-service-token`` metadata on every call; the internal servers refuse a call without it with
UNAUTHENTICATED. Health checks stay open, so probes and load balancers need no secret.

Without a token an internal service still runs on loopback (a laptop, ``mqstore up``, the tests),
but refuses to listen anywhere else: reaching it from the network would bypass the gateway's tokens.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc

TOKEN_ENV = "MQSTORE_SERVICE_TOKEN"
TOKEN_FILE_ENV = "MQSTORE_SERVICE_TOKEN_FILE"
METADATA_KEY = "mqstore-service-token"
#: Methods open to every caller: health checks (probes, load balancers, ``mqstore up``).
OPEN_METHOD_PREFIXES = ("/grpc.health.v1.Health/",)
Handler = Any  # grpc.RpcMethodHandler, whose stubs need type arguments that vary per method

# The stubs make grpc's interceptor bases generic; at run time they are plain classes.
if TYPE_CHECKING:
    _ServerInterceptor = grpc.ServerInterceptor[Any, Any]
    _AioServerInterceptor = grpc.aio.ServerInterceptor[Any, Any]
    _UnaryUnary = grpc.UnaryUnaryClientInterceptor[Any, Any]
    _UnaryStream = grpc.UnaryStreamClientInterceptor[Any, Any]
    _StreamUnary = grpc.StreamUnaryClientInterceptor[Any, Any]
    _StreamStream = grpc.StreamStreamClientInterceptor[Any, Any]
    _AioUnaryUnaryBase = grpc.aio.UnaryUnaryClientInterceptor[Any, Any]
    _AioUnaryStreamBase = grpc.aio.UnaryStreamClientInterceptor[Any, Any]
    _AioStreamUnaryBase = grpc.aio.StreamUnaryClientInterceptor[Any, Any]
    _AioStreamStreamBase = grpc.aio.StreamStreamClientInterceptor[Any, Any]
else:
    _ServerInterceptor = grpc.ServerInterceptor
    _AioServerInterceptor = grpc.aio.ServerInterceptor
    _UnaryUnary = grpc.UnaryUnaryClientInterceptor
    _UnaryStream = grpc.UnaryStreamClientInterceptor
    _StreamUnary = grpc.StreamUnaryClientInterceptor
    _StreamStream = grpc.StreamStreamClientInterceptor
    _AioUnaryUnaryBase = grpc.aio.UnaryUnaryClientInterceptor
    _AioUnaryStreamBase = grpc.aio.UnaryStreamClientInterceptor
    _AioStreamUnaryBase = grpc.aio.StreamUnaryClientInterceptor
    _AioStreamStreamBase = grpc.aio.StreamStreamClientInterceptor


class ServiceTokenError(ValueError):
    """The service credential is configured but unusable (empty, unreadable file)."""


def load_service_token(environ: Mapping[str, str] | None = None) -> str | None:
    """The deployment's service token from the environment, or None when none is configured."""
    env = os.environ if environ is None else environ
    path = env.get(TOKEN_FILE_ENV, "")
    if path:
        try:
            from_file = Path(path).read_text().strip()
        except OSError as exc:
            raise ServiceTokenError(
                f"{TOKEN_FILE_ENV}={path}: cannot read the service token ({exc.strerror})") from None
        if not from_file:
            raise ServiceTokenError(f"{TOKEN_FILE_ENV}={path}: the file is empty")
        return from_file
    token = env.get(TOKEN_ENV)
    if token is not None and (not token.strip() or token != token.strip()):
        raise ServiceTokenError(f"{TOKEN_ENV} must be a non-empty token without surrounding whitespace")
    return token


def _unauthenticated_detail(metadata: Any, token: str) -> str | None:
    """None if the call carries the right token, else why it is refused."""
    sent = next((value for key, value in metadata or () if key == METADATA_KEY), None)
    if sent is None:
        return (f"this internal mqstore service requires the deployment's service credential "
                f"({METADATA_KEY} metadata; set {TOKEN_ENV} on the caller): call the gateway instead")
    sent_bytes = sent if isinstance(sent, bytes) else sent.encode()
    if not hmac.compare_digest(sent_bytes, token.encode()):
        return f"the {METADATA_KEY} does not match this deployment's service credential"
    return None


def _is_open(method: str) -> bool:
    return method.startswith(OPEN_METHOD_PREFIXES)


def _denying_handler(handler: Handler, deny: Callable[..., Any]) -> Handler:
    """A handler of the same kind as ``handler`` (so requests still decode) whose behaviour is ``deny``."""
    kwargs = {"request_deserializer": handler.request_deserializer,
              "response_serializer": handler.response_serializer}
    if handler.unary_unary:
        return grpc.unary_unary_rpc_method_handler(deny, **kwargs)
    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(deny, **kwargs)
    if handler.stream_unary:
        return grpc.stream_unary_rpc_method_handler(deny, **kwargs)
    return grpc.stream_stream_rpc_method_handler(deny, **kwargs)


class ServiceTokenInterceptor(_ServerInterceptor):
    """The check on a thread-pool server (the indexer)."""

    def __init__(self, token: str) -> None:
        self._token = token

    def intercept_service(self, continuation: Callable[[Any], Handler | None],
                          details: grpc.HandlerCallDetails) -> Handler | None:
        handler = continuation(details)
        if handler is None or _is_open(details.method):
            return handler
        detail = _unauthenticated_detail(details.invocation_metadata, self._token)
        if detail is None:
            return handler

        def deny(request: Any, context: grpc.ServicerContext) -> Any:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, detail)

        return _denying_handler(handler, deny)


class AioServiceTokenInterceptor(_AioServerInterceptor):
    """The check on a ``grpc.aio`` server (commitlog and query services)."""

    def __init__(self, token: str) -> None:
        self._token = token

    async def intercept_service(self, continuation: Callable[[Any], Awaitable[Handler | None]],
                                details: grpc.HandlerCallDetails) -> Handler:
        handler = await continuation(details)
        if handler is None or _is_open(details.method):
            return handler
        detail = _unauthenticated_detail(details.invocation_metadata, self._token)
        if detail is None:
            return handler

        async def deny(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, detail)

        return _denying_handler(handler, deny)


def _with_token(details: Any, token: str) -> Any:
    """``details`` (a ``grpc.aio`` ClientCallDetails, a named tuple) with the token added."""
    return details._replace(metadata=[*(details.metadata or ()), (METADATA_KEY, token)])


class _SyncClientDetails(grpc.ClientCallDetails):
    def __init__(self, base: Any, token: str) -> None:
        self.method = base.method
        self.timeout = base.timeout
        self.metadata = [*(base.metadata or ()), (METADATA_KEY, token)]  # type: ignore[assignment]
        self.credentials = base.credentials
        self.wait_for_ready = getattr(base, "wait_for_ready", None)
        self.compression = getattr(base, "compression", None)


class SyncTokenClientInterceptor(_UnaryUnary,
                                 _UnaryStream,
                                 _StreamUnary,
                                 _StreamStream):
    """Adds the token to every call of a blocking channel; returns the call object unchanged (so
    ``cancel()`` of a Tail stream still works)."""

    def __init__(self, token: str) -> None:
        self._token = token

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(_SyncClientDetails(details, self._token), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(_SyncClientDetails(details, self._token), request)

    def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(_SyncClientDetails(details, self._token), requests)

    def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(_SyncClientDetails(details, self._token), requests)


class _AioToken:
    def __init__(self, token: str) -> None:
        self._token = token


class _AioUnaryUnary(_AioToken, _AioUnaryUnaryBase):
    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(_with_token(details, self._token), request)


class _AioUnaryStream(_AioToken, _AioUnaryStreamBase):
    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(_with_token(details, self._token), request)


class _AioStreamUnary(_AioToken, _AioStreamUnaryBase):
    async def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return await continuation(_with_token(details, self._token), requests)


class _AioStreamStream(_AioToken, _AioStreamStreamBase):
    async def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return await continuation(_with_token(details, self._token), requests)


def aio_client_interceptors(token: str | None) -> list[Any]:
    """The ``grpc.aio`` client interceptors that send ``token`` (none without one)."""
    if not token:
        return []
    return [_AioUnaryUnary(token), _AioUnaryStream(token), _AioStreamUnary(token), _AioStreamStream(token)]
