"""What every service process does before it serves: its exit codes and its settings."""

from __future__ import annotations

import logging

from mqstore.services.server.metrics import metrics_port_from_env
from mqstore.services.server.service_auth import load_service_token
from mqstore.services.store.config import ConfigError, MessageStoreConfig, load_config

log = logging.getLogger(__name__)

EXIT_BAD_SETTINGS = 2
EXIT_STORE_LOCKED = 3


class BadSettings(Exception):
    """Settings a service cannot start with; already logged."""


def load_service_settings(config_file: str | None) -> tuple[MessageStoreConfig, int | None]:
    """The store settings (defaults < YAML < MQSTORE_* environment) and the metrics port, or
    BadSettings after one log line that says what to fix."""
    try:
        load_service_token()  # an unusable credential is a settings error, told before serving
        return load_config(config_file), metrics_port_from_env()
    except (ConfigError, ValueError) as exc:
        log.error("bad settings: %s", exc)
        raise BadSettings(str(exc)) from None
