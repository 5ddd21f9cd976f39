"""Fixtures of the observability tests: an in-process OTLP receiver, and the three services as real
processes with tracing on (the standard OTEL_* variables) and their metrics endpoints on free ports.

The commitlog runs SYNC_FLUSH, so an append waits for its flush and the flush-wait span and the
flush latency histogram have something to show.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.commitlog.commitlog_process import ServiceProcess, free_port, spawn_service, start_commitlog
from tests.gateway.system_process import UpProcess, start_up
from tests.indexer.indexer_process import start_indexer
from tests.observability.otlp_receiver import OtlpReceiver, tracing_env
from tests.query.query_process import System, start_query


class GatewayProcess(ServiceProcess):
    """``mqstore gateway`` in front of one shard (the public MessagingService)."""

    service_name = "mqstore.v1.MessagingService"


@dataclass
class Observed:
    """A running system whose spans go to ``receiver``; ``metrics_ports`` by service name."""

    system: System
    receiver: OtlpReceiver
    metrics_ports: dict[str, int]


@pytest.fixture(scope="package")
def observed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Observed]:
    receiver = OtlpReceiver().start()
    root: Path = tmp_path_factory.mktemp("observed")
    env = tracing_env(receiver)
    ports = {name: free_port() for name in ("commitlog", "indexer", "query")}
    started: list[ServiceProcess] = []
    try:
        commitlog = start_commitlog(root / "broker", {**env, "MQSTORE_FLUSH_DISK_TYPE": "SYNC_FLUSH",
                                                      "MQSTORE_METRICS_PORT": str(ports["commitlog"])})
        started.append(commitlog)
        indexer = start_indexer(root / "indexer", commitlog.address,
                                {**env, "MQSTORE_METRICS_PORT": str(ports["indexer"])})
        started.append(indexer)
        query = start_query(root / "query", commitlog.address, indexer.address,
                            {**env, "MQSTORE_METRICS_PORT": str(ports["query"])})
        started.append(query)
        system = System(commitlog, indexer, query, root, env)
        try:
            yield Observed(system, receiver, ports)
        finally:
            system.stop()
    finally:
        for handle in started:
            if handle.running:
                handle.kill9()
        receiver.stop()


@pytest.fixture(scope="package")
def gateway(observed: Observed) -> Iterator[GatewayProcess]:
    """The gateway in front of the observed system, tracing to the same receiver."""
    system = observed.system
    port = free_port()
    log_path = system.root / "gateway.log"
    args = ["gateway", "--listen", f"127.0.0.1:{port}", "--commitlog", system.commitlog.address,
            "--query", system.query.address]
    handle = GatewayProcess(system.root / "gateway", port, spawn_service(args, system.env, log_path), log_path)
    try:
        handle.wait_serving()
        yield handle
        assert handle.stop() == 0, handle.logs()
    finally:
        if handle.running:
            handle.kill9()


@dataclass
class TracedUp:
    """``mqstore up`` (every service a real process) with tracing on to ``receiver``, and the metrics
    endpoint of each process by service name."""

    up: UpProcess
    receiver: OtlpReceiver

    def metrics_url(self, service: str) -> str:
        # mqstore up: commitlog, indexer, query, gateway worker(s) at base + 1.., then the scheduler.
        offset = {"commitlog": 1, "indexer": 2, "query": 3, "gateway": 4, "scheduler": 5}[service]
        return f"http://127.0.0.1:{self.up.metrics_base_port + offset}/metrics"


@pytest.fixture(scope="package")
def traced_up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TracedUp]:
    receiver = OtlpReceiver().start()
    try:
        # The consumer lag series refresh every second here (10 s by default): test_lag_metrics.py.
        env = {**tracing_env(receiver), "MQSTORE_METRICS_LAG_INTERVAL_MS": "1000"}
        started = start_up(tmp_path_factory.mktemp("traced-up") / "store", env_overrides=env)
        try:
            yield TracedUp(started, receiver)
            assert started.stop() == 0, started.logs()[-5000:]
        finally:
            started.kill_all()
    finally:
        receiver.stop()
