"""Invariant assertions of the storage engine, always on (TigerBeetle's TIGER_STYLE: assert the
contracts where they live, in production too).

A broken invariant is a bug in this code, never bad input: the check raises :class:`InvariantError`
(an internal error at every gRPC edge) naming the invariant and the values that broke it, before the
broken state reaches a file. The checks are a comparison or two per record or per chunk, so they stay
on the hot paths.
"""

from __future__ import annotations

from typing import NoReturn

from services.store.errors import StoreError


class InvariantError(StoreError):
    """An engine invariant does not hold: ``invariant`` names it; the message adds the values seen.
    No status code is mapped to it, so every edge answers INTERNAL."""

    def __init__(self, invariant: str, detail: str) -> None:
        super().__init__(f"invariant broken: {invariant}: {detail}")
        self.invariant = invariant


def broken(invariant: str, detail: str) -> NoReturn:
    """Raise :class:`InvariantError`; called when a check fails (the check itself stays inline)."""
    raise InvariantError(invariant, detail)
