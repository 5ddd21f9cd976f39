"""Domain errors shared by the services. Each maps to one gRPC status code at the servicer edge."""

from __future__ import annotations

import re


class StoreError(Exception):
    """Base: the message says what the caller should fix."""


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


#: How a batch error names its message ("message #i: "), for callers that map it back to their own.
BATCH_POSITION = re.compile(r"message #(\d+): ")
