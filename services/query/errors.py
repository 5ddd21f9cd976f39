"""Errors only the query service raises, beyond the shared ones in :mod:`services.store.errors`."""

from __future__ import annotations

import grpc

from services.server.status import status_code_of
from services.store.errors import DataLossError, StoreError

# Raised here too when bytes read back are not the record their ConsumeQueue unit or message id
# promised; the commitlog answers it (DATA_LOSS) for a quarantined range.
__all__ = ["DataLossError", "FailedPreconditionError", "query_status_code"]


class FailedPreconditionError(StoreError):
    """The request is valid but cannot be served in the store's current shape."""


def query_status_code(exc: StoreError) -> grpc.StatusCode:
    """The shared table plus this service's own errors."""
    if isinstance(exc, DataLossError):
        return grpc.StatusCode.DATA_LOSS
    if isinstance(exc, FailedPreconditionError):
        return grpc.StatusCode.FAILED_PRECONDITION
    return status_code_of(exc)
