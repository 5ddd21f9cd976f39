"""Prometheus metrics and their HTTP endpoint (off unless a port is configured).

The counters are process-wide and always updated: an update is a lock and an add, and the put path
records once per append call (a batch or a stream batch), never per byte. The HTTP server that
exposes them only runs when ``MQSTORE_METRICS_PORT`` (or an explicit port) is given, and only on
loopback by default.
"""

from __future__ import annotations

import enum
import logging
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol
from wsgiref.simple_server import WSGIServer

from prometheus_client import Counter, Histogram, start_http_server

log = logging.getLogger(__name__)

METRICS_PORT_ENV = "MQSTORE_METRICS_PORT"
METRICS_HOST_ENV = "MQSTORE_METRICS_HOST"

PUTS = Counter("mqstore_commitlog_puts", "Messages put into the commitlog, by PutMessageStatus or rejection",
               ["status"])
PUT_LATENCY = Histogram(
    "mqstore_commitlog_put_latency_seconds",
    "Duration of one engine append call (one message, a batch or a stream batch), flush wait included",
    buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
APPENDED_BYTES = Counter("mqstore_commitlog_appended_bytes", "Record bytes appended to the commitlog")
TAIL_CHUNKS = Counter("mqstore_commitlog_tail_chunks", "Tail chunks sent, data or empty heartbeat", ["kind"])
RPC_ERRORS = Counter("mqstore_commitlog_rpc_errors", "RPCs ended with an error status", ["method", "code"])

# Bound children: a labels() lookup per call is the expensive part of a prometheus update.
_PUT_OK = PUTS.labels(status="PUT_OK")
TAIL_DATA_CHUNKS = TAIL_CHUNKS.labels(kind="data")
TAIL_HEARTBEATS = TAIL_CHUNKS.labels(kind="heartbeat")


class _Put(Protocol):
    @property
    def status(self) -> enum.Enum: ...

    @property
    def wrote_bytes(self) -> int: ...


def observe_append(results: Sequence[_Put], elapsed_s: float) -> None:
    """Record one engine append call that returned ``results``."""
    PUT_LATENCY.observe(elapsed_s)
    ok = written = 0
    for result in results:
        written += result.wrote_bytes
        if result.status.name == "PUT_OK":
            ok += 1
        else:
            PUTS.labels(status=result.status.name).inc()
    _PUT_OK.inc(ok)
    APPENDED_BYTES.inc(written)


def observe_rejected(status: str, count: int = 1) -> None:
    """Record messages refused before anything was written (``status`` names why)."""
    PUTS.labels(status=status).inc(count)


@dataclass(slots=True)
class MetricsServer:
    server: WSGIServer
    thread: threading.Thread
    address: str

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def metrics_port_from_env() -> int | None:
    """The port from MQSTORE_METRICS_PORT, None when unset or empty (metrics HTTP off)."""
    text = os.environ.get(METRICS_PORT_ENV, "").strip()
    if not text:
        return None
    try:
        port = int(text)
    except ValueError:
        raise ValueError(f"{METRICS_PORT_ENV}={text!r} is not a port number") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"{METRICS_PORT_ENV}={port} must be within 0..65535")
    return port


def start_metrics_server(port: int | None, host: str | None = None) -> MetricsServer | None:
    """Serve ``/metrics`` on ``host:port`` in a daemon thread; None (and nothing started) without a port.
    The host defaults to ``MQSTORE_METRICS_HOST``, else loopback (a pod sets its own IP or 0.0.0.0)."""
    if port is None:
        return None
    host = host or os.environ.get(METRICS_HOST_ENV, "").strip() or "127.0.0.1"
    server, thread = start_http_server(port, addr=host)
    bound = server.server_address[1]
    address = f"{host}:{bound}"
    log.info("metrics on http://%s/metrics", address, extra={"metrics_address": address})
    return MetricsServer(server, thread, address)
