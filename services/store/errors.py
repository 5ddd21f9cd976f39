"""Domain errors shared by the services. Each maps to one gRPC status code at the servicer edge."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Self


def batch_position(index: int) -> str:
    """How an error's text names the message of a batch it is about (0-based)."""
    return f"message #{index}: "


class StoreError(Exception):
    """Base: the message says what the caller should fix.

    An error about one message of a batch also knows that message's position (``batch_index``) and what
    it says of the message alone (``message_error``): a caller that numbers the messages its own way (a
    smaller batch, a stream) renumbers the error from these, never from its text. The services send
    them along as a structured status detail (services/server/status.py).
    """

    #: The 0-based position in its batch of the message the error is about (None: no one message).
    batch_index: int | None = None
    #: The error's text without the message's position (set with ``batch_index``).
    message_error: str = ""
    #: What kind of refusal this is, for a caller to decide by (google.rpc.ErrorInfo's ``reason``; ""
    #: for none), and its facts by name (ErrorInfo's ``metadata``), never parsed out of the text.
    reason: str = ""
    reason_metadata: Mapping[str, str] = MappingProxyType({})

    @classmethod
    def of_message(cls, index: int | None, detail: str) -> Self:
        """The error ``detail`` about message ``index`` of a batch, or about a message sent alone (None)."""
        if index is None:
            return cls(detail)
        return cls(batch_position(index) + detail).at_position(index, detail)

    def because(self, reason: str, metadata: Mapping[str, str]) -> Self:
        """Gives this error a machine-readable ``reason`` with its ``metadata`` (sent as a status detail)."""
        self.reason, self.reason_metadata = reason, MappingProxyType(dict(metadata))
        return self

    def at_position(self, index: int | None, message_error: str) -> Self:
        """Marks this error as being about message ``index`` of a batch (nothing if None)."""
        if index is not None:
            self.batch_index, self.message_error = index, message_error
        return self


class InvalidArgumentError(StoreError):
    pass


class NotFoundError(StoreError):
    pass


class OutOfRangeError(StoreError):
    pass


class UnavailableError(StoreError):
    pass


class ResourceExhaustedError(StoreError):
    pass


class AlreadyExistsError(StoreError):
    pass


class FailedPreconditionError(StoreError):
    """The call is valid but this process is in no state to serve it (a replica that takes no writes)."""


class DataLossError(StoreError):
    """The bytes asked for were found damaged by recovery and quarantined (services/store/formats/quarantine.py):
    the record there is lost, the records around it are not. Retrying does not help."""


class DiskFullError(ResourceExhaustedError):
    """The store's disk is too full to take a write (RocketMQ's "disk full" refusal). Nothing of the
    refused write is on disk, so the caller may send again once space is freed."""
