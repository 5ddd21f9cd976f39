"""What the CLI prints: aligned tables for people, one JSON object per line for programs.

Cells are made safe for a terminal (control characters escaped, long text cut) because bodies,
tags and keys are arbitrary user data.
"""

from __future__ import annotations

import json
import sys
import unicodedata
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any, TextIO

#: Text columns longer than this are cut with an ellipsis.
MAX_CELL = 60


def cell(value: Any, max_width: int = MAX_CELL) -> str:
    """One table cell: control characters escaped, at most ``max_width`` characters."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="replace")
    text = str(value)
    if any(unicodedata.category(c) == "Cc" for c in text):
        text = "".join(c if unicodedata.category(c) != "Cc" else repr(c)[1:-1] for c in text)
    if max_width and len(text) > max_width:
        text = text[:max_width - 1] + "…"
    return text


def timestamp(ms: int) -> str:
    """A store/born timestamp as local time to the millisecond; 0 is shown as ``-``."""
    if ms <= 0:
        return "-"
    moment = datetime.fromtimestamp(ms / 1000).astimezone()
    return moment.strftime("%Y-%m-%d %H:%M:%S.") + f"{ms % 1000:03d}"


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], max_width: int = MAX_CELL) -> list[str]:
    """Lines of a table: a header, then rows; numeric columns are right-aligned."""
    texts = [[cell(v, max_width) for v in row] for row in rows]
    numeric = [bool(rows) and all(_is_number(r[i]) or r[i] is None for r in rows) for i in range(len(headers))]
    widths = [max([len(h), *(len(t[i]) for t in texts)]) for i, h in enumerate(headers)]

    def line(values: Sequence[str]) -> str:
        parts = [v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric, strict=True)]
        return "  ".join(parts).rstrip()

    return [line([h.upper() for h in headers]), *(line(t) for t in texts)]


def format_record(pairs: Sequence[tuple[str, Any]], max_width: int = 0) -> list[str]:
    """``name: value`` lines with the values aligned (one object, e.g. a message)."""
    width = max((len(name) for name, _ in pairs), default=0)
    return [f"{name + ':':<{width + 1}} {cell(value, max_width)}" for name, value in pairs]


class Printer:
    """Writes to stdout in the user's chosen form; ``json_mode`` turns every result into JSON lines."""

    def __init__(self, json_mode: bool = False, stream: TextIO | None = None) -> None:
        self.json_mode = json_mode
        self.stream = stream if stream is not None else sys.stdout

    def json(self, value: Any) -> None:
        self.stream.write(json.dumps(value, ensure_ascii=False, separators=(",", ":")) + "\n")

    def lines(self, lines: Iterable[str]) -> None:
        for text in lines:
            self.stream.write(text + "\n")

    def table(self, headers: Sequence[str], rows: list[Sequence[Any]], empty: str | None = None) -> None:
        if not rows and empty is not None:
            self.note(empty)
            return
        self.lines(format_table(headers, rows))

    def record(self, pairs: Sequence[tuple[str, Any]]) -> None:
        self.lines(format_record(pairs))

    def note(self, message: str) -> None:
        """Human-only commentary (summaries, "nothing found"): on stderr, so stdout stays data."""
        sys.stderr.write(message + "\n")

    def flush(self) -> None:
        self.stream.flush()
