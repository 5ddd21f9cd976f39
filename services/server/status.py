"""Domain errors -> gRPC status codes: one table for every service, and one error path for every
servicer (:class:`RpcEdge`): a handler raises a domain error (or :class:`CallFailed`), the edge ends the
call with its status, never with ``context.abort()`` (see :func:`fail_call`).

An error about one message of a batch also travels as a structured detail of the status (a
``google.rpc.Status`` in the ``grpc-status-details-bin`` trailer, holding a ``google.rpc.ErrorInfo``
whose metadata name the message's position): the caller that batched messages of its own (the
gateway) maps the error back to its message from the detail, never from the text. So does an error
with a machine-readable reason (``StoreError.because``: a follower's NOT_LEADER refusal), whose detail is
an ErrorInfo with that reason and the error's facts as metadata.
"""

from __future__ import annotations

import functools
import inspect
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import grpc
from google.protobuf import message_factory
from google.protobuf.descriptor import ServiceDescriptor
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from services.store.errors import (
    AlreadyExistsError,
    DataLossError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    OutOfRangeError,
    ResourceExhaustedError,
    StoreError,
    UnavailableError,
)

_ERROR_CODES: tuple[tuple[type[StoreError], grpc.StatusCode], ...] = (
    (InvalidArgumentError, grpc.StatusCode.INVALID_ARGUMENT),  # PutMessageError included
    (NotFoundError, grpc.StatusCode.NOT_FOUND),
    (OutOfRangeError, grpc.StatusCode.OUT_OF_RANGE),
    (UnavailableError, grpc.StatusCode.UNAVAILABLE),
    (ResourceExhaustedError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (AlreadyExistsError, grpc.StatusCode.ALREADY_EXISTS),
    (DataLossError, grpc.StatusCode.DATA_LOSS),
    (FailedPreconditionError, grpc.StatusCode.FAILED_PRECONDITION),
)


def status_code_of(exc: StoreError) -> grpc.StatusCode:
    """The one gRPC code of a domain error (INTERNAL for a StoreError subclass nobody mapped)."""
    for kind, code in _ERROR_CODES:
        if isinstance(exc, kind):
            return code
    return grpc.StatusCode.INTERNAL


#: ErrorInfo.domain and .reason of the detail of an error about one message of a batch.
ERROR_DOMAIN = "mqstore.v1"
REFUSED_MESSAGE_REASON = "BATCH_MESSAGE_REFUSED"
_INDEX_KEY = "batch_index"
_MESSAGE_ERROR_KEY = "message_error"


@dataclass(frozen=True, slots=True)
class RefusedMessage:
    """The message of a batch a failed call names: its 0-based position in the batch, and what the
    error says of it alone (the error's text without the position)."""

    index: int
    error: str


@dataclass(frozen=True, slots=True)
class ErrorReason:
    """A failed call's machine-readable reason (an ErrorInfo of ERROR_DOMAIN) and its metadata."""

    reason: str
    metadata: Mapping[str, str]


def refused_message_of(exc: StoreError) -> RefusedMessage | None:
    if exc.batch_index is None:
        return None
    return RefusedMessage(exc.batch_index, exc.message_error)


def error_reason_of(exc: StoreError) -> ErrorReason | None:
    return ErrorReason(exc.reason, exc.reason_metadata) if exc.reason else None


def status_trailer(code: grpc.StatusCode, details: str, refused: RefusedMessage | None,
                   reason: ErrorReason | None = None) -> Sequence[tuple[str, str | bytes]]:
    """The trailing metadata carrying ``refused`` and ``reason`` as the status's details (nothing
    without either)."""
    infos = []
    if refused is not None:
        infos.append(error_details_pb2.ErrorInfo(reason=REFUSED_MESSAGE_REASON, domain=ERROR_DOMAIN, metadata={
            _INDEX_KEY: str(refused.index), _MESSAGE_ERROR_KEY: refused.error}))
    if reason is not None:
        infos.append(error_details_pb2.ErrorInfo(reason=reason.reason, domain=ERROR_DOMAIN,
                                                 metadata=dict(reason.metadata)))
    if not infos:
        return ()
    status = status_pb2.Status(code=code.value[0], message=details)
    for info in infos:
        status.details.add().Pack(info)
    return tuple(rpc_status.to_status(status).trailing_metadata)


def _error_infos(call: grpc.aio.AioRpcError | grpc.RpcError) -> Iterator[error_details_pb2.ErrorInfo]:
    """The ErrorInfo details of ERROR_DOMAIN a failed call's status carries."""
    try:
        # It reads only code(), details() and trailing_metadata(), which an AioRpcError has too.
        status = rpc_status.from_call(call)  # type: ignore[arg-type]
    except ValueError:  # a detail that disagrees with its status is none
        return
    if status is None:
        return
    for detail in status.details:
        info = error_details_pb2.ErrorInfo()
        if detail.Unpack(info) and info.domain == ERROR_DOMAIN:
            yield info


def refused_message(call: grpc.aio.AioRpcError | grpc.RpcError) -> RefusedMessage | None:
    """The message of a batch a failed call's status detail names, if it names one."""
    for info in _error_infos(call):
        index = info.metadata.get(_INDEX_KEY, "")
        if info.reason == REFUSED_MESSAGE_REASON and index.isdigit():
            return RefusedMessage(int(index), info.metadata.get(_MESSAGE_ERROR_KEY, ""))
    return None


def error_reason(call: grpc.aio.AioRpcError | grpc.RpcError) -> ErrorReason | None:
    """The machine-readable reason a failed call's status detail gives, if any (not a batch's refused
    message, which :func:`refused_message` reads)."""
    for info in _error_infos(call):
        if info.reason != REFUSED_MESSAGE_REASON:
            return ErrorReason(info.reason, dict(info.metadata))
    return None


def fail_call(context: grpc.aio.ServicerContext[Any, Any], code: grpc.StatusCode, details: str,
              refused: RefusedMessage | None = None, reason: ErrorReason | None = None) -> None:
    """End a ``grpc.aio`` call with ``code`` and ``details`` when its handler returns (a unary
    handler's answer is then discarded, a streaming one ends after what it already sent).

    Not ``context.abort()``: grpc.aio keeps the AbortError that abort raises on the call's state, and
    that error's traceback holds the handler's frames, with the request and the context among their
    locals: every failed call became a reference cycle that only the cyclic collector frees, so a
    service answering many NOT_FOUNDs (or refusing large batches) piled up requests between
    collections. Setting the status leaves nothing behind once the call ends.
    """
    context.set_code(code)
    context.set_details(details)
    if refused is not None or reason is not None:
        context.set_trailing_metadata(status_trailer(code, details, refused, reason))


@dataclass(frozen=True, slots=True)
class CallStatus:
    """How a failed call ends: its code, its details, the refused message of a batch and the error's
    machine-readable reason if any."""

    code: grpc.StatusCode
    details: str
    refused: RefusedMessage | None = None
    reason: ErrorReason | None = None


class CallFailed(Exception):
    """Raised in a handler to end its call with a status the edge phrases itself: a code no domain error
    has (DEADLINE_EXCEEDED for a flush that did not finish), or words of its own (a stream's position)."""

    def __init__(self, code: grpc.StatusCode, details: str, refused: RefusedMessage | None = None) -> None:
        super().__init__(details)
        self.status = CallStatus(code, details, refused)


def store_status(exc: Exception, code_of: Callable[[StoreError], grpc.StatusCode] = status_code_of
                 ) -> CallStatus | None:
    """The status of a domain error or a CallFailed (None: any other exception, which stays a bug)."""
    if isinstance(exc, CallFailed):
        return exc.status
    if isinstance(exc, StoreError):
        return CallStatus(code_of(exc), str(exc), refused_message_of(exc), error_reason_of(exc))
    return None


#: Told of every call that ends (the method's name, its code, OK included, and its duration).
Observe = Callable[[str, grpc.StatusCode, float], None]
StatusOf = Callable[[Exception], "CallStatus | None"]
Handler = TypeVar("Handler", bound=Callable[..., Any])
_OK = grpc.StatusCode.OK


class RpcEdge:
    """The error path of one service's servicer, as a decorator of its RPC methods (unary and
    streaming, ``grpc.aio`` coroutines and async generators, and a sync server's functions and
    generators): the domain errors a handler raises (``status_of``: services.store.errors kinds by the
    shared table, the refused message of a batch as the status's detail, and :class:`CallFailed`) end
    the call with their status through :func:`fail_call`, so no failed call leaves a reference cycle
    behind; any other exception propagates (grpc answers UNKNOWN and logs it: a bug). ``observe`` is
    told of every call's end. A failed unary call answers nothing (aio) or its empty response (a sync
    server must return one), which grpc does not send to the client as an answer.
    """

    def __init__(self, service: ServiceDescriptor, observe: Observe | None = None,
                 status_of: StatusOf = store_status) -> None:
        self._service = service
        self._observe = observe
        self._status_of = status_of

    def __call__(self, method: Handler) -> Handler:
        name = method.__name__
        if inspect.isasyncgenfunction(method):
            return cast(Handler, self._async_stream(method, name))
        if inspect.iscoroutinefunction(method):
            return cast(Handler, self._async_call(method, name))
        if inspect.isgeneratorfunction(method):
            return cast(Handler, self._stream(method, name))
        return cast(Handler, self._call(method, name))

    def _failed(self, exc: Exception, context: Any, name: str, started: float) -> bool:
        """Ends the call with ``exc``'s status; False for an exception that is no domain error."""
        status = self._status_of(exc)
        if status is None:
            return False
        if self._observe is not None:
            self._observe(name, status.code, time.perf_counter() - started)
        fail_call(context, status.code, status.details, status.refused, status.reason)
        return True

    def _ended(self, name: str, started: float) -> None:
        if self._observe is not None:
            self._observe(name, _OK, time.perf_counter() - started)

    def _async_call(self, method: Callable[..., Any], name: str) -> Callable[..., Any]:
        @functools.wraps(method)
        async def handler(servicer: Any, request: Any, context: Any) -> Any:
            started = time.perf_counter()
            try:
                response = await method(servicer, request, context)
            except Exception as exc:
                if self._failed(exc, context, name, started):
                    return None
                raise
            self._ended(name, started)
            return response

        return handler

    def _async_stream(self, method: Callable[..., Any], name: str) -> Callable[..., Any]:
        @functools.wraps(method)
        async def handler(servicer: Any, request: Any, context: Any) -> AsyncIterator[Any]:
            started = time.perf_counter()
            try:
                async for response in method(servicer, request, context):
                    yield response
            except Exception as exc:
                if self._failed(exc, context, name, started):
                    return
                raise
            self._ended(name, started)

        return handler

    def _call(self, method: Callable[..., Any], name: str) -> Callable[..., Any]:
        empty = message_factory.GetMessageClass(self._service.methods_by_name[name].output_type)

        @functools.wraps(method)
        def handler(servicer: Any, request: Any, context: Any) -> Any:
            started = time.perf_counter()
            try:
                response = method(servicer, request, context)
            except Exception as exc:
                if self._failed(exc, context, name, started):
                    return empty()
                raise
            self._ended(name, started)
            return response

        return handler

    def _stream(self, method: Callable[..., Any], name: str) -> Callable[..., Any]:
        @functools.wraps(method)
        def handler(servicer: Any, request: Any, context: Any) -> Iterator[Any]:
            started = time.perf_counter()
            try:
                yield from method(servicer, request, context)
            except Exception as exc:
                if self._failed(exc, context, name, started):
                    return
                raise
            self._ended(name, started)

        return handler
