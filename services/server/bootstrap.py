"""How every service process starts and ends, one recipe for all five (commitlog, indexer, query,
scheduler, gateway), each with its own settings (:class:`ServiceProcess`).

In order: JSON logging (first, so that even a settings error is one parseable line), then the process
settings every service reads from its environment (:func:`load_process_settings`: the metrics port and,
for an internal service, the service credential; an unusable one is a settings error told before
serving), then, only in a process that serves, the cyclic collector's threshold, the memory report (off
unless ``MQSTORE_MEMORY_REPORT_DIR`` asks) and tracing (off unless the OTLP environment asks), which
:meth:`Bootstrap.run` undoes when serving ends. A gateway supervisor reads its settings but serves
nothing itself, so it stops before :meth:`Bootstrap.run`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from services.server import tracing
from services.server.gc_tuning import GEN0_THRESHOLD, tune_gc
from services.server.logs import configure_logging
from services.server.memory_debug import start_memory_report
from services.server.metrics import metrics_port_from_env
from services.server.service_auth import load_service_token


@dataclass(frozen=True, slots=True)
class ServiceProcess:
    """One service's settings of the shared start-up."""

    #: The service's name: tracing's ``mqstore-<name>``, the memory report's ``<name>-<pid>.jsonl``.
    name: str
    #: The cyclic collector's gen-0 threshold (services/server/gc_tuning.py); None keeps CPython's.
    gc_gen0_threshold: int | None = GEN0_THRESHOLD
    #: An internal service takes the shared service credential (services/server/service_auth.py).
    internal: bool = True


@dataclass(frozen=True, slots=True)
class ProcessSettings:
    #: ``MQSTORE_METRICS_PORT`` (None: no /metrics endpoint).
    metrics_port: int | None
    #: The service credential of an internal service (None: none configured, or a public service).
    service_token: str | None


def load_process_settings(process: ServiceProcess) -> ProcessSettings:
    """What every service reads from its environment; ValueError (ServiceTokenError included) says what
    to fix, and the caller exits with its bad-settings code."""
    token = load_service_token() if process.internal else None
    return ProcessSettings(metrics_port_from_env(), token)


class Bootstrap:
    """A service process's start-up: logging at once; the rest around :meth:`run`."""

    def __init__(self, process: ServiceProcess) -> None:
        self.process = process
        configure_logging()

    def run(self, serve: Callable[[], int]) -> int:
        """GC tuning, the memory report and tracing, then ``serve`` (the service until it stops);
        returns its exit code once the report and the tracer are stopped."""
        process = self.process
        if process.gc_gen0_threshold is not None:
            tune_gc(process.gc_gen0_threshold)
        reporter = start_memory_report(process.name)
        tracing.init_tracing(process.name)
        try:
            return serve()
        finally:
            tracing.shutdown_tracing()
            if reporter is not None:
                reporter.stop()
