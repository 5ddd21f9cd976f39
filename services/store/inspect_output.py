"""Terminal output shared by the ``mqstore inspect`` commands: UTF-8 bytes whatever the locale, a
quiet exit when the reader goes away (``| head``), and one-line usage errors."""

from __future__ import annotations

import contextlib
import os
import sys
from typing import BinaryIO

EXIT_USAGE = 2


def usage_error(prog: str, message: str) -> int:
    """Print ``prog: error: message`` on stderr; returns the usage exit code (2)."""
    print(f"{prog}: error: {message}", file=sys.stderr)
    return EXIT_USAGE


def stdout_bytes() -> BinaryIO:
    """Write UTF-8 whatever the locale: topics, tags and keys are often not ASCII."""
    sys.stdout.flush()
    return sys.stdout.buffer


def silence_stdout() -> None:
    """After EPIPE, point stdout at /dev/null so the interpreter's final flush does not fail again."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
