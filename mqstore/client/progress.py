"""A progress bar for long client operations (sending a file, benchmarks), on stderr.

It only draws when stderr is a terminal and the user did not ask for ``--quiet``: piped or captured
output (scripts, CI, tests) never gets carriage returns or escape codes mixed in. The counters work
either way, so callers can print a summary from them.

    with Progress(total=len(lines), desc="send", unit="msg", quiet=args.quiet) as bar:
        for receipts in chunks:
            bar.update(len(receipts))
    print(f"{bar.count} messages, {bar.rate:.0f} msg/s")
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable, Iterator
from types import TracebackType
from typing import Any, Self, TextIO, TypeVar

T = TypeVar("T")
#: Set to 1 to draw even when stderr is not a terminal (e.g. under a pty-less recorder), 0 never to draw.
ENV_PROGRESS = "MQSTORE_PROGRESS"


def _is_tty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def progress_enabled(stream: TextIO, quiet: bool = False) -> bool:
    """Whether a bar should be drawn on ``stream``."""
    if quiet:
        return False
    forced = os.environ.get(ENV_PROGRESS, "").strip()
    if forced in ("0", "1"):
        return forced == "1"
    return _is_tty(stream)


class Progress:
    """A tqdm bar that is a no-op when disabled; counts and times either way."""

    def __init__(self, total: int | None = None, *, desc: str = "", unit: str = "msg", quiet: bool = False,
                 stream: TextIO | None = None, unit_scale: bool = False, **tqdm_options: Any) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = progress_enabled(self.stream, quiet)
        self.total = total
        self.count = 0
        self.started = time.monotonic()
        self._finished: float | None = None
        self._bar: Any = None
        if self.enabled:
            # Imported only when a bar is drawn: every ``mqstore`` command loads this module.
            from tqdm import tqdm  # type: ignore[import-untyped]  # tqdm ships no type information

            self._bar = tqdm(total=total, desc=desc or None, unit=unit, unit_scale=unit_scale, file=self.stream,
                             dynamic_ncols=True, mininterval=0.2, leave=True, **tqdm_options)

    def update(self, n: int = 1) -> None:
        self.count += n
        if self._bar is not None:
            self._bar.update(n)

    def set_postfix(self, **values: Any) -> None:
        """Extra figures after the bar (e.g. ``errors=2``)."""
        if self._bar is not None:
            self._bar.set_postfix(values, refresh=False)

    def set_total(self, total: int | None) -> None:
        self.total = total
        if self._bar is not None:
            self._bar.total = total
            self._bar.refresh()

    def write(self, message: str) -> None:
        """A line on the bar's stream that does not break the bar."""
        if self._bar is not None:
            self._bar.write(message, file=self.stream)
        else:
            print(message, file=self.stream, flush=True)

    @property
    def elapsed(self) -> float:
        end = self._finished if self._finished is not None else time.monotonic()
        return end - self.started

    @property
    def rate(self) -> float:
        """Units per second so far (0 before any time passed)."""
        elapsed = self.elapsed
        return self.count / elapsed if elapsed > 0 else 0.0

    def close(self) -> None:
        if self._finished is None:
            self._finished = time.monotonic()
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def track(items: Iterable[T], total: int | None = None, **options: Any) -> Iterator[T]:
    """Yields ``items``, advancing a :class:`Progress` by one per item (options as for Progress)."""
    with Progress(total=total, **options) as bar:
        for item in items:
            yield item
            bar.update()
