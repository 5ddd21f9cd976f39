"""The ``/metrics`` HTTP endpoint every service uses (off unless a port is configured), and the
Prometheus conventions every service's own metrics module follows.

Each service declares its series in its own ``metrics`` module (services/commitlog/metrics.py,
services/indexer/metrics.py, ..., gateway/metrics.py), imported only by that service's code, so a
process exports only its own series plus the client library's standard ``process_*`` and
``python_*`` ones. Those modules take :class:`Counter`, :class:`Gauge` and :class:`Histogram` from
here: importing this module first turns off the ``*_created`` series (one more series per counter
and histogram child, which Prometheus does not need: ``rate()`` handles restarts), and it must run
before any metric is made. A counter's name has no suffix here; the exposition adds ``_total``.

The HTTP server only runs when ``MQSTORE_METRICS_PORT`` (or an explicit port) is given, and only on
loopback by default.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from wsgiref.simple_server import WSGIServer

from prometheus_client import Counter, Gauge, Histogram, disable_created_metrics, start_http_server

# Before any service's metrics module makes its first metric (they all import from here).
disable_created_metrics()  # type: ignore[no-untyped-call]

log = logging.getLogger(__name__)

METRICS_PORT_ENV = "MQSTORE_METRICS_PORT"
METRICS_HOST_ENV = "MQSTORE_METRICS_HOST"


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


__all__ = [
    "METRICS_HOST_ENV",
    "METRICS_PORT_ENV",
    "Counter",
    "Gauge",
    "Histogram",
    "MetricsServer",
    "metrics_port_from_env",
    "start_metrics_server",
]
