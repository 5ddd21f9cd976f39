"""Domain errors -> gRPC status codes: one table for every service; ending an aio call with one."""

from __future__ import annotations

from typing import Any

import grpc

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


def fail_call(context: grpc.aio.ServicerContext[Any, Any], code: grpc.StatusCode, details: str) -> None:
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
