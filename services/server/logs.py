"""Structured logging for every service: one JSON object per line on stderr.

Lines are machine-readable first (a log shipper parses them as they are) and still readable by eye:
``{"ts": "...", "level": "INFO", "logger": "...", "msg": "...", <extra fields>}``. Extra fields
come from ``log.info("...", extra={"offset": 42})``. The level comes from ``MQSTORE_LOG_LEVEL``.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from datetime import UTC, datetime
from typing import Any, TextIO

LOG_LEVEL_ENV = "MQSTORE_LOG_LEVEL"
DEFAULT_LEVEL = "INFO"

# Attributes every LogRecord has; anything else on a record came in through ``extra=``.
_STANDARD_ATTRS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON line; values JSON cannot hold are written with ``str()``."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD_ATTRS and key not in entry:
                entry[key] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


def configure_logging(level: str | None = None, stream: TextIO | None = None) -> None:
    """Send all logging to ``stream`` (stderr) as JSON lines. ``level`` overrides MQSTORE_LOG_LEVEL.

    Replaces the root handlers, so calling it twice does not duplicate lines.
    """
    name = (level or os.environ.get(LOG_LEVEL_ENV) or DEFAULT_LEVEL).strip().upper()
    known = logging.getLevelNamesMapping()
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(known.get(name, logging.INFO))
    if name not in known:
        logging.getLogger(__name__).warning(
            "%s=%r is not a log level: using INFO (use DEBUG, INFO, WARNING or ERROR)", LOG_LEVEL_ENV, name)
