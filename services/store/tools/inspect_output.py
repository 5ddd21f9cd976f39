"""Terminal output shared by the ``mqstore inspect`` commands: UTF-8 bytes whatever the locale, a
quiet exit when the reader goes away (``| head``), one-line usage errors, and the ``--json`` field names.

``--json`` names fields in snake_case, as every other ``mqstore`` command does (``queue_offset``,
``commit_log_offset``); ``--json-names rocketmq`` gives the names of RocketMQ's reference dumps
(``queueOffset``, ``commitLogOffset``), for comparing with them. Message property names are data and
keep their own spelling either way."""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
from typing import Any, BinaryIO

EXIT_USAGE = 2
SNAKE_CASE, ROCKETMQ_NAMES = "snake_case", "rocketmq"
JSON_NAMES = (SNAKE_CASE, ROCKETMQ_NAMES)
_WORD_START = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
#: Values that are data, not fields: their keys are never renamed.
_DATA_KEYS = frozenset({"properties"})


def snake_case(name: str) -> str:
    """``commitLogOffset`` -> ``commit_log_offset``, ``bodyCRC`` -> ``body_crc``."""
    return _WORD_START.sub("_", name).lower()


def json_line(row: dict[str, Any], names: str = SNAKE_CASE) -> str:
    """One compact JSON line (non-ASCII kept as is, like the dumps) with the field names asked for."""
    return json.dumps(row if names == ROCKETMQ_NAMES else _snake_keys(row), ensure_ascii=False,
                      separators=(",", ":"))


def _snake_keys(row: dict[str, Any]) -> dict[str, Any]:
    return {snake_case(k): _snake_keys(v) if isinstance(v, dict) and k not in _DATA_KEYS else v
            for k, v in row.items()}


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
