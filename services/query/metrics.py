"""The query service's Prometheus metrics: pulls by status, what they returned, lookups, long polls.

One update per call, never per message (a pull's messages and bytes are summed first); label children
are bound at import. Gauges of the long polls are read from the arrival watcher only when scraped.
"""

from __future__ import annotations

from collections.abc import Callable

from services.query.pull import GetMessageStatus, PullResult
from services.server.metrics import Counter, Gauge, Histogram

PULLS = Counter("mqstore_query_pulls", "PullMessage calls answered, by GetMessageStatus (or the gRPC code of a "
                "failed one)", ["status"])
PULLED_MESSAGES = Counter("mqstore_query_pulled_messages", "Messages returned by PullMessage")
PULLED_BYTES = Counter("mqstore_query_pulled_bytes", "Record bytes (store size) returned by PullMessage")
PULL_LATENCY = Histogram(
    "mqstore_query_pull_latency_seconds", "Duration of one PullMessage call, long poll included",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 15, 30, 60),
)
LOOKUPS = Counter("mqstore_query_lookups", "ViewMessage (by message id) and QueryMessage (by key) calls answered",
                  ["method"])
LOOKUP_MESSAGES = Counter("mqstore_query_lookup_messages", "Messages returned by ViewMessage and QueryMessage")
LOST_INDEX_HITS = Counter("mqstore_query_lost_index_hits", "Index hits of lookups by key skipped: their records lie "
                          "in quarantined commitlog ranges")
OFFSET_COMMITS = Counter("mqstore_query_offset_commits", "Consumer offsets committed (UpdateConsumerOffset)")
RPC_ERRORS = Counter("mqstore_query_rpc_errors", "RPCs ended with an error status", ["method", "code"])
LONG_POLLS_WAITING = Gauge("mqstore_query_long_polls_waiting", "Pulls suspended until a message arrives")
ARRIVALS_CONNECTED = Gauge("mqstore_query_arrivals_connected", "1 while the indexer's WatchArrivals stream is up")

# Bound children: a labels() lookup per call is the expensive part of a prometheus update.
_PULLS_BY_STATUS = {status: PULLS.labels(status=status.name) for status in GetMessageStatus}
VIEW_LOOKUPS = LOOKUPS.labels(method="ViewMessage")
KEY_LOOKUPS = LOOKUPS.labels(method="QueryMessage")


def observe_pull(result: PullResult, elapsed_s: float) -> None:
    """Record one answered pull."""
    PULL_LATENCY.observe(elapsed_s)
    _PULLS_BY_STATUS[result.status].inc()
    messages = result.messages
    if messages:
        PULLED_MESSAGES.inc(len(messages))
        PULLED_BYTES.inc(sum([m.store_size for m in messages]))
    elif result.record_count:
        PULLED_MESSAGES.inc(result.record_count)
        PULLED_BYTES.inc(len(result.records))


def observe_error(method: str, code: str) -> None:
    """Record a call that failed with gRPC status ``code`` (a failed pull also counts as a pull)."""
    RPC_ERRORS.labels(method=method, code=code).inc()
    if method == "PullMessage":
        PULLS.labels(status=code).inc()


def bind(waiting: Callable[[], int], connected: Callable[[], bool]) -> None:
    """Read the long-poll gauges from the arrival watcher at every scrape."""
    LONG_POLLS_WAITING.set_function(lambda: waiting())
    ARRIVALS_CONNECTED.set_function(lambda: 1 if connected() else 0)
