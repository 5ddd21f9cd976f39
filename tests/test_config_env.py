"""MQSTORE_* environment variables: a store setting is applied, a variable some mqstore process or the
client reads is left alone without a word (every process loads the store settings, most of them do not
own every variable), and only a name nothing reads is warned about."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

from services.store.config import ENV_PREFIX, is_known_env, load_config

ROOT = Path(__file__).resolve().parents[1]
#: Every source tree whose processes read MQSTORE_* variables.
SOURCES = ("gateway", "services", "pipeline", "mqstore")


def _warnings(caplog: pytest.LogCaptureFixture, environ: dict[str, str]) -> list[str]:
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="services.store.config"):
        load_config(environ=environ)
    return [r.getMessage() for r in caplog.records]


def test_variables_another_service_owns_are_not_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    owned = {"MQSTORE_TRANSACTION_CHECK_INTERVAL_MS": "5000", "MQSTORE_RMQ5_MAX_DELIVERY_ATTEMPTS": "3",
             "MQSTORE_GATEWAY_WORKERS": "2", "MQSTORE_GATEWAY": "127.0.0.1:9876", "MQSTORE_QUERY_READ_FROM": "grpc"}
    assert _warnings(caplog, owned) == []


def test_a_name_nothing_reads_is_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    (warning,) = _warnings(caplog, {"MQSTORE_FLUSH_INTERVAL": "5", "MQSTORE_FLUSH_DISK_TYPE": "SYNC_FLUSH"})
    assert "ignoring MQSTORE_FLUSH_INTERVAL" in warning


def test_every_variable_the_code_reads_is_known() -> None:
    """A new MQSTORE_* variable must be added to the known names, or every process warns about it."""
    pattern = re.compile(r"""["'](MQSTORE_[A-Z0-9_]+)["']""")
    read = {name for tree in SOURCES for path in (ROOT / tree).rglob("*.py")
            for name in pattern.findall(path.read_text(encoding="utf-8"))}
    assert len(read) > 20
    assert sorted(name for name in read if not is_known_env(name)) == []
    assert not is_known_env(ENV_PREFIX + "NO_SUCH_SETTING")
