"""Registering apache.rocketmq.v2.MessagingService on the gateway's server (beside mqstore.v1), on unless
MQSTORE_RMQ5=0 (or false/off) is set for the gateway. MQSTORE_RMQ5_MAX_DELIVERY_ATTEMPTS (default 16,
RocketMQ's) is how often a message is delivered to a consumer group before it goes to %DLQ%<group>;
MQSTORE_RMQ5_DEFAULT_INVISIBLE_MS (default 30000) is the invisible duration of a receive that gives none
(push consumers'; RocketMQ's defaultInvisibleTimeMills); MQSTORE_RMQ5_RENEW_MAX_MS (default 3 h,
RocketMQ's renewMaxTimeMillis) is how long a push consumer's receipt is renewed at most."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

import grpc

from apache.rocketmq.v2 import definition_pb2, service_pb2
from gateway.rocketmq5 import status as st
from gateway.rocketmq5.inflight import DEFAULT_MAX_DELIVERY_ATTEMPTS, DEFAULT_RENEW_MAX_S
from gateway.rocketmq5.servicer import DEFAULT_INVISIBLE_S, MAX_INVISIBLE_S, MIN_INVISIBLE_S, RocketMQ5Servicer
from gateway.wire import Undecodable, decoder

if TYPE_CHECKING:
    from gateway.servicer import MessagingServicer

SERVICE_NAME = "apache.rocketmq.v2.MessagingService"
ENV_FLAG = "MQSTORE_RMQ5"
ENV_MAX_DELIVERY_ATTEMPTS = "MQSTORE_RMQ5_MAX_DELIVERY_ATTEMPTS"
ENV_DEFAULT_INVISIBLE_MS = "MQSTORE_RMQ5_DEFAULT_INVISIBLE_MS"
ENV_RENEW_MAX_MS = "MQSTORE_RMQ5_RENEW_MAX_MS"


def enabled() -> bool:
    return os.environ.get(ENV_FLAG, "1").strip().lower() not in ("0", "false", "off", "no")


def max_delivery_attempts() -> int:
    """MQSTORE_RMQ5_MAX_DELIVERY_ATTEMPTS, or RocketMQ's 16; ValueError naming the variable when it is
    not a whole number of at least 1."""
    attempts = os.environ.get(ENV_MAX_DELIVERY_ATTEMPTS, "").strip()
    if not attempts:
        return DEFAULT_MAX_DELIVERY_ATTEMPTS
    if not (attempts.isdigit() and int(attempts) >= 1):
        raise ValueError(f"{ENV_MAX_DELIVERY_ATTEMPTS}={attempts!r}: give a whole number of at least 1")
    return int(attempts)


def _milliseconds(name: str, default_s: float, low_s: float, high_s: float) -> float:
    """An environment variable in ms, as seconds; ValueError naming it when out of bounds."""
    value = os.environ.get(name, "").strip()
    if not value:
        return default_s
    if not (value.isdigit() and low_s <= int(value) / 1000 <= high_s):
        raise ValueError(f"{name}={value!r}: give whole milliseconds within {low_s * 1000:.0f}..{high_s * 1000:.0f}")
    return int(value) / 1000


def default_invisible_s() -> float:
    return _milliseconds(ENV_DEFAULT_INVISIBLE_MS, DEFAULT_INVISIBLE_S, MIN_INVISIBLE_S, MAX_INVISIBLE_S)


def renew_max_s() -> float:
    return _milliseconds(ENV_RENEW_MAX_MS, DEFAULT_RENEW_MAX_S, 0, 7 * 24 * 3600)


def check_settings() -> None:
    """Every MQSTORE_RMQ5_* setting read once: ValueError for the first bad one (the gateway exits 2)."""
    max_delivery_attempts()
    default_invisible_s()
    renew_max_s()


def add_to_server(mq: MessagingServicer, server: grpc.aio.Server) -> RocketMQ5Servicer | None:
    """Serve RocketMQ 5's protocol over ``mq`` on ``server`` (when enabled) and start its background
    work on the running loop; the servicer, or None."""
    if not enabled():
        return None
    servicer = RocketMQ5Servicer(mq, max_delivery_attempts=max_delivery_attempts(),
                                 default_invisible_s=default_invisible_s(), renew_max_s=renew_max_s())
    servicer.start()
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers(servicer)),))
    return servicer


def handlers(servicer: RocketMQ5Servicer) -> dict[str, grpc.RpcMethodHandler[Any, Any]]:
    """Every RPC of the service descriptor, decoded at the edge: a request whose bytes are not its message
    (invalid UTF-8 in a string field, a truncated field) is answered in the protocol's own way, a response
    whose status is BAD_REQUEST saying what was wrong (gRPC's answer to a deserializer that raises would
    be UNKNOWN, which the clients retry). In a stream of commands (Telemetry) the servicer answers each
    undecodable one."""
    out: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}
    for method in service_pb2.DESCRIPTOR.services_by_name["MessagingService"].methods:
        request_type = _message_class(method.input_type.name)
        response_type = _message_class(method.output_type.name)
        handler = getattr(servicer, method.name)
        decode, encode = decoder(request_type), response_type.SerializeToString
        if method.client_streaming:
            out[method.name] = grpc.stream_stream_rpc_method_handler(
                handler, request_deserializer=decode, response_serializer=encode)
        elif method.server_streaming:
            out[method.name] = grpc.unary_stream_rpc_method_handler(
                _refusing_stream(handler, response_type), request_deserializer=decode, response_serializer=encode)
        else:
            out[method.name] = grpc.unary_unary_rpc_method_handler(
                _refusing_unary(handler, response_type), request_deserializer=decode, response_serializer=encode)
    return out


def _message_class(name: str) -> Any:
    return getattr(service_pb2, name, None) or getattr(definition_pb2, name)


def bad_request(response_type: Any, request: Undecodable) -> Any:
    return response_type(status=st.status(st.Code.BAD_REQUEST, request.reason))


def _refusing_unary(handler: Callable[..., Any], response_type: Any) -> Callable[..., Any]:
    async def handle(request: Any, context: Any) -> Any:
        if isinstance(request, Undecodable):
            return bad_request(response_type, request)
        return await handler(request, context)

    return handle


def _refusing_stream(handler: Callable[..., Any], response_type: Any) -> Callable[..., Any]:
    async def handle(request: Any, context: Any) -> AsyncIterator[Any]:
        if isinstance(request, Undecodable):
            yield bad_request(response_type, request)
            return
        async for answer in handler(request, context):
            yield answer

    return handle
