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
import socket
import threading
from dataclasses import dataclass
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import Counter, Gauge, Histogram, disable_created_metrics, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

# Before any service's metrics module makes its first metric (they all import from here).
disable_created_metrics()  # type: ignore[no-untyped-call]

log = logging.getLogger(__name__)

METRICS_PORT_ENV = "MQSTORE_METRICS_PORT"
METRICS_HOST_ENV = "MQSTORE_METRICS_HOST"
#: The most label values (topics; groups and queues) one per-topic or per-group metric gets; the rest are
#: summed under :data:`OTHER`, so a store with thousands of topics or groups cannot flood Prometheus.
METRICS_MAX_SERIES_ENV = "MQSTORE_METRICS_MAX_SERIES"
DEFAULT_MAX_SERIES = 500
#: The label value of the series past the cap.
OTHER = "other"
#: How often the endpoint's accept loop looks for a stop: a stop waits up to this long (the client
#: library's own server polls every 0.5 s, which made every service's clean stop 0.25 s slower).
STOP_POLL_S = 0.02


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


def max_series_from_env() -> int:
    """MQSTORE_METRICS_MAX_SERIES, else DEFAULT_MAX_SERIES; ValueError for what is no positive number."""
    text = os.environ.get(METRICS_MAX_SERIES_ENV, "").strip()
    if not text:
        return DEFAULT_MAX_SERIES
    try:
        limit = int(text)
    except ValueError:
        raise ValueError(f"{METRICS_MAX_SERIES_ENV}={text!r} is not a number") from None
    if limit < 1:
        raise ValueError(f"{METRICS_MAX_SERIES_ENV}={limit} must be at least 1")
    return limit


class BoundedLabel:
    """A label's values for a counter: the first ``limit`` distinct values are their own, every later
    one is :data:`OTHER` (a counter's series cannot move once it exists, so it is first come, first
    kept). Thread-safe: the dict is only added to under the GIL's atomic setdefault."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._kept: dict[str, str] = {}

    def __call__(self, value: str) -> str:
        kept = self._kept.get(value)
        if kept is not None:
            return kept
        if len(self._kept) >= self._limit:
            return OTHER
        return self._kept.setdefault(value, value)


class _QuietHandler(WSGIRequestHandler):
    """A scrape is not worth a log line on stderr."""

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass


def start_metrics_server(port: int | None, host: str | None = None) -> MetricsServer | None:
    """Serve ``/metrics`` on ``host:port`` in a daemon thread; None (and nothing started) without a port.
    The host defaults to ``MQSTORE_METRICS_HOST``, else loopback (a pod sets its own IP or 0.0.0.0)."""
    if port is None:
        return None
    host = host or os.environ.get(METRICS_HOST_ENV, "").strip() or "127.0.0.1"
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    server_class = type("MetricsHTTPServer", (ThreadingWSGIServer,), {"address_family": family})
    server: WSGIServer = make_server(host, port, make_wsgi_app(), server_class, handler_class=_QuietHandler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": STOP_POLL_S},
                              name="metrics-http", daemon=True)
    thread.start()
    bound = server.server_address[1]
    address = f"{host}:{bound}"
    log.info("metrics on http://%s/metrics", address, extra={"metrics_address": address})
    return MetricsServer(server, thread, address)


__all__ = [
    "DEFAULT_MAX_SERIES",
    "METRICS_HOST_ENV",
    "METRICS_MAX_SERIES_ENV",
    "METRICS_PORT_ENV",
    "OTHER",
    "BoundedLabel",
    "Counter",
    "Gauge",
    "Histogram",
    "MetricsServer",
    "max_series_from_env",
    "metrics_port_from_env",
    "start_metrics_server",
]
