"""Waiting for what the indexer makes findable: it follows the commitlog by a few milliseconds, so a
lookup right after a send may answer NOT_FOUND once."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import grpc

T = TypeVar("T")


def eventually_found(attempt: Callable[[], T], timeout_s: float = 10.0, interval_s: float = 0.05) -> T:
    """``attempt()`` once it stops failing NOT_FOUND; any other error, or NOT_FOUND past the
    timeout, is raised."""
    return retried_while(grpc.StatusCode.NOT_FOUND, attempt, timeout_s, interval_s)


def retried_while(code: grpc.StatusCode, attempt: Callable[[], T], timeout_s: float = 10.0,
                  interval_s: float = 0.05) -> T:
    """``attempt()`` once it stops failing with ``code``; any other error, or ``code`` past the
    timeout, is raised."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return attempt()
        except grpc.RpcError as exc:
            if exc.code() != code or time.monotonic() > deadline:
                raise
        time.sleep(interval_s)
