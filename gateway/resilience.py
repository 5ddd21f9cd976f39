"""Backend failures as the gateway's client sees them, and when a call may be tried again.

The retry rule:
  * Reads (pull, lookups, offsets, topic listing, consumer offsets) are idempotent: retried on
    UNAVAILABLE and RESOURCE_EXHAUSTED, with exponential backoff and jitter, within the call's deadline.
    Committing a consumer offset sets a value, so it is retried too.
  * A send is retried only when the failure proves nothing was written: the connection to the
    commitlog could not be made (the request never left the gateway), the commitlog answered "not
    writable" (checked under the put lock, before any byte is appended), or it refused the call as busy
    or its disk as full (RESOURCE_EXHAUSTED is decided before the append; a full disk is told as such,
    not as "busy", and the retry goes to another shard when there is one). A send that timed out or lost its connection
    mid-call may have been stored, so it is never retried: the client gets DEADLINE_EXCEEDED or
    UNAVAILABLE and decides (the message keeps its UNIQ_KEY, so a duplicate can be recognised).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import grpc
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential_jitter

from services.server.status import ErrorReason, RefusedMessage, error_reason, refused_message

T = TypeVar("T")

_NOT_SENT_MARKERS = ("failed to connect to all addresses", "commitlog is not writable")
#: How every refusal of a store whose disk is full begins (services/store/disk_space.py, disk_guard.py).
DISK_FULL_MARKER = "disk full: "


@dataclass(slots=True)
class BackendError(Exception):
    """A backend call that failed, already phrased for the gateway's caller."""

    code: grpc.StatusCode
    details: str
    # True when the failure proves the request was not carried out (safe to send again).
    not_applied: bool = False
    # The message of the batch sent that the backend refused, from the status's detail (None: no one message).
    refused: RefusedMessage | None = None
    # The backend's machine-readable reason from the status's detail (a follower's NOT_LEADER refusal).
    reason: ErrorReason | None = None

    def __str__(self) -> str:
        return f"{self.code.name}: {self.details}"


def backend_error(what: str, exc: grpc.aio.AioRpcError) -> BackendError:
    """``what`` names the backend, e.g. "the commitlog of shard-0 (127.0.0.1:9901)"."""
    code, details = exc.code(), exc.details() or ""
    not_applied = code == grpc.StatusCode.RESOURCE_EXHAUSTED or (
        code == grpc.StatusCode.UNAVAILABLE and any(m in details for m in _NOT_SENT_MARKERS))
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.UNKNOWN):
        return BackendError(grpc.StatusCode.UNAVAILABLE, f"{what} is unavailable ({details}); retry later",
                            not_applied)
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return BackendError(code, f"{what} did not answer in time ({details})")
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        if DISK_FULL_MARKER in details:
            # Not "busy": backing off does not help, space on that disk (or consumers, see the details) does.
            return BackendError(code, f"{what} refused the write because its disk is full ({details})", not_applied)
        return BackendError(code, f"{what} is busy ({details}); back off and retry", not_applied)
    return BackendError(code, details, refused=refused_message(exc), reason=error_reason(exc))


def _retryable_read(exc: BaseException) -> bool:
    return isinstance(exc, BackendError) and exc.code in (grpc.StatusCode.UNAVAILABLE,
                                                          grpc.StatusCode.RESOURCE_EXHAUSTED)


def _retryable_send(exc: BaseException) -> bool:
    return isinstance(exc, BackendError) and exc.not_applied


@dataclass(slots=True, frozen=True)
class RetryPolicy:
    attempts: int = 3
    initial_backoff_s: float = 0.05
    max_backoff_s: float = 1.0

    async def read(self, call: Callable[[], Awaitable[T]]) -> T:
        return await self._run(call, _retryable_read)

    async def send(self, call: Callable[[], Awaitable[T]]) -> T:
        return await self._run(call, _retryable_send)

    async def _run(self, call: Callable[[], Awaitable[T]], retryable: Callable[[BaseException], bool]) -> T:
        # The first attempt runs bare: tenacity's machinery costs tens of microseconds, paid only once
        # a call has failed.
        try:
            return await call()
        except BackendError as exc:
            if self.attempts <= 1 or not retryable(exc):
                raise
        await asyncio.sleep(self.initial_backoff_s * random.uniform(0.5, 1.5))
        retrying = AsyncRetrying(stop=stop_after_attempt(self.attempts - 1),
                                 wait=wait_exponential_jitter(multiplier=self.initial_backoff_s, max=self.max_backoff_s,
                                                             jitter=self.initial_backoff_s),
                                 retry=retry_if_exception(retryable), reraise=True)
        async for attempt in retrying:
            with attempt:
                return await call()
        raise AssertionError("unreachable: tenacity reraises the last error")
