"""Domain errors -> gRPC status codes: one table for every service; ending an aio call with one.

An error about one message of a batch also travels as a structured detail of the status (a
``google.rpc.Status`` in the ``grpc-status-details-bin`` trailer, holding a ``google.rpc.ErrorInfo``
whose metadata name the message's position): the caller that batched messages of its own (the
gateway) maps the error back to its message from the detail, never from the text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc
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


def refused_message_of(exc: StoreError) -> RefusedMessage | None:
    if exc.batch_index is None:
        return None
    return RefusedMessage(exc.batch_index, exc.message_error)


def status_trailer(code: grpc.StatusCode, details: str,
                   refused: RefusedMessage | None) -> Sequence[tuple[str, str | bytes]]:
    """The trailing metadata carrying ``refused`` as the status's detail (nothing without one)."""
    if refused is None:
        return ()
    info = error_details_pb2.ErrorInfo(reason=REFUSED_MESSAGE_REASON, domain=ERROR_DOMAIN, metadata={
        _INDEX_KEY: str(refused.index), _MESSAGE_ERROR_KEY: refused.error})
    status = status_pb2.Status(code=code.value[0], message=details)
    status.details.add().Pack(info)
    return tuple(rpc_status.to_status(status).trailing_metadata)


def refused_message(call: grpc.aio.AioRpcError | grpc.RpcError) -> RefusedMessage | None:
    """The message of a batch a failed call's status detail names, if it names one."""
    try:
        # It reads only code(), details() and trailing_metadata(), which an AioRpcError has too.
        status = rpc_status.from_call(call)  # type: ignore[arg-type]
    except ValueError:  # a detail that disagrees with its status is none
        return None
    if status is None:
        return None
    info = error_details_pb2.ErrorInfo()
    for detail in status.details:
        if detail.Unpack(info) and info.domain == ERROR_DOMAIN and info.reason == REFUSED_MESSAGE_REASON:
            index = info.metadata.get(_INDEX_KEY, "")
            if index.isdigit():
                return RefusedMessage(int(index), info.metadata.get(_MESSAGE_ERROR_KEY, ""))
    return None


def fail_call(context: grpc.aio.ServicerContext[Any, Any], code: grpc.StatusCode, details: str,
              refused: RefusedMessage | None = None) -> None:
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
    if refused is not None:
        context.set_trailing_metadata(status_trailer(code, details, refused))
