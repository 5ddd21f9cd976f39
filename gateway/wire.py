"""The gateway's wire edge: request bytes to messages (undecodable ones included), domain errors to
gRPC status codes (the shared error path, services/server/status.py, with the gateway's own errors),
answers (or relayed bytes) to the wire. The service's registration, which needs
the servicer, is :mod:`gateway.registration`."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from gateway import metrics
from gateway.auth import AuthError, PermissionDeniedError
from gateway.queue_selector import NoWritableQueueError
from gateway.resilience import BackendError
from mqstore.v1 import common_pb2, gateway_pb2, query_pb2
from services.server.status import CallFailed, CallStatus, RpcEdge, status_code_of, store_status
from services.store.errors import InvalidArgumentError, StoreError
from services.store.rules.pull_request import DEFAULT_MAX_LONG_POLL_MS, PullQuery
from services.store.rules.subscription import parse_subscription
from services.store.rules.topics import TopicConfig

SERVICE_NAME = "mqstore.v1.MessagingService"
MIB = 1024 * 1024
#: The largest request the gateway takes. A larger one is INVALID_ARGUMENT naming this limit (not
#: RESOURCE_EXHAUSTED, which tells a client to back off and retry the same request forever): the
#: transport accepts up to TRANSPORT_MAX_REQUEST_BYTES so that the decoder sees such a request.
MAX_REQUEST_BYTES = 64 * MIB
TRANSPORT_MAX_REQUEST_BYTES = 4 * MAX_REQUEST_BYTES
Context = grpc.aio.ServicerContext[Any, Any]
Handler = Callable[[Any, Any, Context], Awaitable[Any]]


def status_of(exc: Exception) -> tuple[grpc.StatusCode, str] | None:
    if isinstance(exc, BackendError):
        return exc.code, exc.details
    if isinstance(exc, AuthError):
        code = grpc.StatusCode.PERMISSION_DENIED if isinstance(exc, PermissionDeniedError) else \
            grpc.StatusCode.UNAUTHENTICATED
        return code, str(exc)
    if isinstance(exc, NoWritableQueueError):
        return grpc.StatusCode.FAILED_PRECONDITION, str(exc)
    if isinstance(exc, StoreError):
        return status_code_of(exc), str(exc)
    return None


def call_status(exc: Exception) -> CallStatus | None:
    """:func:`status_of` for the shared error path (a StoreError keeps its refused message's detail)."""
    if isinstance(exc, (StoreError, CallFailed)):
        return store_status(exc)
    status = status_of(exc)
    return None if status is None else CallStatus(*status)


def _observe_call(method: str, code: grpc.StatusCode, elapsed_s: float) -> None:
    metrics.observe_call(method, code.name, elapsed_s)


_SERVICE = gateway_pb2.DESCRIPTOR.services_by_name["MessagingService"]
#: The streams' error path: they count their calls themselves (each stream's outcome is its own).
stream = RpcEdge(_SERVICE, status_of=call_status)
_unary = RpcEdge(_SERVICE, _observe_call, call_status)


def unary(method: Handler) -> Handler:
    """A unary handler on the shared error path, counted by outcome; an undecodable request is
    INVALID_ARGUMENT."""

    @functools.wraps(method)
    async def decoded(self: Any, request: Any, context: Context) -> Any:
        if type(request) is Undecodable:
            raise InvalidArgumentError(request.reason)
        return await method(self, request, context)

    return _unary(decoded)


class Undecodable:
    """A request whose bytes are not its message type: answered INVALID_ARGUMENT (gRPC's own answer to
    a deserializer that raises would be UNKNOWN)."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


def decoder(request_type: Any) -> Callable[[bytes], Any]:
    from_string = request_type.FromString
    name = request_type.DESCRIPTOR.full_name

    def decode(data: bytes) -> Any:
        if len(data) > MAX_REQUEST_BYTES:
            return Undecodable(f"the request is {len(data)} bytes, over the gateway's limit of {MAX_REQUEST_BYTES} "
                               f"bytes ({MAX_REQUEST_BYTES // MIB} MiB): send fewer or smaller messages per call")
        try:
            return from_string(data)
        except Exception as exc:  # noqa: BLE001 - DecodeError and friends: any failure means bad bytes
            return Undecodable(f"the request is not a valid {name} message ({exc}); check the client's proto files")

    return decode


def serialize(response: Any) -> bytes:
    return response if type(response) is bytes else response.SerializeToString()


def check_pull_request(request: query_pb2.PullMessageRequest) -> None:
    """Every bound of a pull (InvalidArgumentError), checked before any shard is asked. The long poll
    is bounded by the query services' default maximum."""
    PullQuery.checked(request.topic, request.queue_id, request.queue_offset, request.max_messages,
                      request.max_bytes, parse_subscription(request.subscription), request.long_poll_ms,
                      DEFAULT_MAX_LONG_POLL_MS)


def topic_config_from_proto(pb: common_pb2.TopicConfig) -> TopicConfig:
    return TopicConfig(topic=pb.topic, read_queue_nums=pb.read_queue_nums,
                       write_queue_nums=pb.write_queue_nums, perm=pb.perm)
