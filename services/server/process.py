"""What every service process does before it serves: its exit codes and its settings; and what a
supervisor (``mqstore up``) does when one dies: its exit described, a restart after a backoff."""

from __future__ import annotations

import logging
import signal
from collections import deque
from dataclasses import dataclass, field

from services.server.bootstrap import ProcessSettings, ServiceProcess, load_process_settings
from services.store.config import ConfigError, MessageStoreConfig, load_config

log = logging.getLogger(__name__)

EXIT_BAD_SETTINGS = 2
EXIT_STORE_LOCKED = 3


class BadSettings(Exception):
    """Settings a service cannot start with; already logged."""


def load_service_settings(config_file: str | None,
                          process: ServiceProcess) -> tuple[MessageStoreConfig, ProcessSettings]:
    """The store settings (defaults < YAML < MQSTORE_* environment) and the process's own
    (:func:`~services.server.bootstrap.load_process_settings`), or BadSettings after one log line that
    says what to fix."""
    try:
        return load_config(config_file), load_process_settings(process)
    except (ConfigError, ValueError) as exc:
        log.error("bad settings: %s", exc)
        raise BadSettings(str(exc)) from None


def exit_reason(code: int) -> str:
    """A child's exit status in words: ``code 1``, ``signal SIGKILL``."""
    if code >= 0:
        return f"code {code}"
    try:
        return f"signal {signal.Signals(-code).name}"
    except ValueError:
        return f"signal {-code}"


@dataclass(slots=True)
class RestartPolicy:
    """When to restart a child that died: after a backoff that doubles with each death within the
    window (a crash loop does not spin), and never again once it died more than ``max_restarts``
    times within it (something is wrong that restarts do not fix)."""

    max_restarts: int = 5
    window_s: float = 60.0
    first_backoff_s: float = 0.5
    max_backoff_s: float = 8.0
    deaths: deque[float] = field(default_factory=deque)

    def died(self, now: float) -> float | None:
        """Count a death at ``now`` (monotonic seconds): the backoff before the restart, or None to give up."""
        self.deaths.append(now)
        while self.deaths and self.deaths[0] < now - self.window_s:
            self.deaths.popleft()
        if len(self.deaths) > self.max_restarts:
            return None
        return min(self.first_backoff_s * 2.0 ** (len(self.deaths) - 1), self.max_backoff_s)
