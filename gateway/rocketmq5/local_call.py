"""Calling the gateway's mqstore.v1 handlers in process from the RocketMQ 5 servicer.

The handlers take a ``grpc.aio.ServicerContext`` and report failures by setting its code and details
(services.server.status.fail_call). :class:`LocalContext` is the small part of that context they use:
the caller's metadata (for auth), peer and deadline, and the status they set, which :func:`call` turns
into :class:`MqstoreCallError`. No loopback connection: TLS and tokens apply once, to the outer call.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import grpc


class MqstoreCallError(Exception):
    """An mqstore.v1 handler answered with a status other than OK."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details


class LocalContext:
    """What the mqstore.v1 handlers use of a servicer context."""

    def __init__(self, metadata: Sequence[tuple[str, Any]], peer: str, timeout_s: float | None,
                 authenticated: Any = None) -> None:
        self._metadata = tuple(metadata)
        self._peer = peer
        self._deadline = None if timeout_s is None else time.monotonic() + timeout_s
        self.code: grpc.StatusCode | None = None
        self.details = ""
        #: The caller's principal once the handlers have authenticated its metadata: a signed request
        #: (RocketMQ 5's) is verified once, so work done for it later (a transaction-check stream
        #: reopened an hour on) is not refused for its signature's age.
        self.authenticated = authenticated

    def renewed(self, timeout_s: float) -> LocalContext:
        """The same caller with a new deadline (for work done after its call ended)."""
        return LocalContext(self._metadata, self._peer, timeout_s, self.authenticated)

    def invocation_metadata(self) -> tuple[tuple[str, Any], ...]:
        return self._metadata

    def peer(self) -> str:
        return self._peer

    def time_remaining(self) -> float | None:
        return None if self._deadline is None else max(self._deadline - time.monotonic(), 0.0)

    def set_code(self, code: grpc.StatusCode) -> None:
        self.code = code

    def set_details(self, details: str) -> None:
        self.details = details


Handler = Callable[[Any, Any], Awaitable[Any]]


async def call(handler: Handler, request: Any, context: LocalContext, answer_type: Any = None) -> Any:
    """Run one mqstore.v1 handler; its answer (bytes a handler relays are parsed as ``answer_type``), or
    MqstoreCallError with the status it set."""
    context.code = None
    answer = await handler(request, context)
    if context.code is not None and context.code != grpc.StatusCode.OK:
        raise MqstoreCallError(context.code, context.details)
    if isinstance(answer, (bytes, bytearray, memoryview)) and answer_type is not None:
        return answer_type.FromString(bytes(answer))
    return answer
