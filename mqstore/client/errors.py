"""One exception type for everything the gateway refuses, so callers never handle raw gRPC errors.

The gateway's details already say what to fix; they are kept as the message. The subclasses let a
caller catch one outcome (``except NotFoundError``) without comparing codes.
"""

from __future__ import annotations

from typing import Any

import grpc


class MqstoreError(Exception):
    """A failed call: ``code`` is the gRPC status name (``NOT_FOUND``), ``message`` what to fix."""

    #: The status this class stands for (the base class takes any).
    status: grpc.StatusCode | None = None

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        #: For batch and stream sends: receipts of the messages stored before the failure.
        self.receipts: list[Any] = []

    @property
    def retryable(self) -> bool:
        """True when the same call may succeed later (the gateway or store is busy or restarting)."""
        if self.code == "RESOURCE_EXHAUSTED" and self.message.startswith(TOO_LARGE_PREFIXES):
            return False  # the transport's size limit: the same request would be refused again
        return self.code in ("UNAVAILABLE", "RESOURCE_EXHAUSTED")


#: How gRPC words a message over a size limit (either side's): RESOURCE_EXHAUSTED, but not retryable.
TOO_LARGE_PREFIXES = ("Received message larger than max", "Sent message larger than max")


class InvalidArgumentError(MqstoreError):
    status = grpc.StatusCode.INVALID_ARGUMENT


class NotFoundError(MqstoreError):
    status = grpc.StatusCode.NOT_FOUND


class AlreadyExistsError(MqstoreError):
    status = grpc.StatusCode.ALREADY_EXISTS


class OutOfRangeError(MqstoreError):
    status = grpc.StatusCode.OUT_OF_RANGE


class UnauthenticatedError(MqstoreError):
    status = grpc.StatusCode.UNAUTHENTICATED


class PermissionDeniedError(MqstoreError):
    status = grpc.StatusCode.PERMISSION_DENIED


class FailedPreconditionError(MqstoreError):
    status = grpc.StatusCode.FAILED_PRECONDITION


class ResourceExhaustedError(MqstoreError):
    status = grpc.StatusCode.RESOURCE_EXHAUSTED


class UnavailableError(MqstoreError):
    status = grpc.StatusCode.UNAVAILABLE


class DeadlineExceededError(MqstoreError):
    status = grpc.StatusCode.DEADLINE_EXCEEDED


class DataLossError(MqstoreError):
    """Stored data that cannot be read back as written: the store's answer, or raw records that are
    not whole records or fail their body CRC in the client."""

    status = grpc.StatusCode.DATA_LOSS


_BY_STATUS: dict[grpc.StatusCode, type[MqstoreError]] = {
    cls.status: cls for cls in (
        InvalidArgumentError, NotFoundError, AlreadyExistsError, OutOfRangeError, UnauthenticatedError,
        PermissionDeniedError, FailedPreconditionError, ResourceExhaustedError, UnavailableError,
        DeadlineExceededError, DataLossError)
    if cls.status is not None
}


def error_for(code: grpc.StatusCode, details: str, address: str | None = None,
              timeout_s: float | None = None) -> MqstoreError:
    """The exception for a status; connection failures and timeouts get a message naming the gateway,
    since gRPC's own ("failed to connect to all addresses") does not say what to do."""
    message = details or code.name.lower().replace("_", " ")
    where = f"the gateway at {address}" if address else "the gateway"
    if code == grpc.StatusCode.UNAVAILABLE and ("failed to connect" in details or "Connection refused" in details
                                                or "DNS resolution failed" in details):
        message = (f"cannot reach {where}: is `mqstore up` running there? (set --gateway or MQSTORE_GATEWAY) "
                   f"[{details}]")
    elif code == grpc.StatusCode.DEADLINE_EXCEEDED and details in ("", "Deadline Exceeded"):
        within = f" within {timeout_s:g} s" if timeout_s is not None else ""
        message = f"{where} did not answer{within}"
    cls = _BY_STATUS.get(code, MqstoreError)
    return cls(code.name, message)


def from_rpc_error(exc: grpc.RpcError, address: str | None = None, timeout_s: float | None = None) -> MqstoreError:
    """Translate an error raised by a grpc stub (sync or asyncio)."""
    code_fn = getattr(exc, "code", None)
    details_fn = getattr(exc, "details", None)
    code = code_fn() if callable(code_fn) else grpc.StatusCode.UNKNOWN
    details = details_fn() if callable(details_fn) else str(exc)
    return error_for(code or grpc.StatusCode.UNKNOWN, details or "", address, timeout_s)
