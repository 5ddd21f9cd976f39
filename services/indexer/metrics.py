"""The indexer's Prometheus metrics: dispatch lag, read live from the reput service when scraped."""

from __future__ import annotations

from prometheus_client import Gauge

from services.indexer.indexer_store import IndexerStore
from services.indexer.reput import ReputService

BEHIND_BYTES = Gauge("mqstore_indexer_dispatch_behind_bytes", "Commitlog bytes not dispatched yet")
BEHIND_SECONDS = Gauge("mqstore_indexer_dispatch_behind_seconds",
                       "Age of the newest dispatched record while records are pending, else 0")
REPUT_OFFSET = Gauge("mqstore_indexer_reput_offset", "Next commitlog offset to dispatch")
DISPATCHED = Gauge("mqstore_indexer_dispatched_records", "Records dispatched since start")
CONNECTED = Gauge("mqstore_indexer_commitlog_connected", "1 while the Tail stream is up")


def bind(store: IndexerStore, reput: ReputService) -> None:
    BEHIND_BYTES.set_function(lambda: reput.behind_bytes)
    BEHIND_SECONDS.set_function(lambda: reput.behind_ms / 1000)
    REPUT_OFFSET.set_function(lambda: store.reput_offset)
    DISPATCHED.set_function(lambda: store.dispatched_records)
    CONNECTED.set_function(lambda: 1 if reput.lag.connected else 0)
