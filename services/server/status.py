"""Domain errors -> gRPC status codes: one table for every service."""

from __future__ import annotations

import grpc

from services.store.errors import (
    AlreadyExistsError,
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
)


def status_code_of(exc: StoreError) -> grpc.StatusCode:
    """The one gRPC code of a domain error (INTERNAL for a StoreError subclass nobody mapped)."""
    for kind, code in _ERROR_CODES:
        if isinstance(exc, kind):
            return code
    return grpc.StatusCode.INTERNAL
