"""The indexer's Prometheus metrics: dispatch lag and what the dispatch built, read live from the
reput service and the store when scraped; reads of queue units counted once per call."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import REGISTRY, Metric
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from services.indexer.indexer_store import IndexerStore
from services.indexer.reput import ReputService
from services.server.metrics import Counter, Gauge

BEHIND_BYTES = Gauge("mqstore_indexer_dispatch_behind_bytes", "Commitlog bytes not dispatched yet")
BEHIND_SECONDS = Gauge("mqstore_indexer_dispatch_behind_seconds",
                       "Age of the newest dispatched record while records are pending, else 0")
REPUT_OFFSET = Gauge("mqstore_indexer_reput_offset_bytes", "Next commitlog offset to dispatch (a byte offset)")
CONNECTED = Gauge("mqstore_indexer_commitlog_connected", "1 while the Tail stream is up")
CONSUME_QUEUES = Gauge("mqstore_indexer_consume_queues", "ConsumeQueues (topic, queue id) in this indexer")
INDEX_FILES = Gauge("mqstore_indexer_index_files", "IndexFiles on disk")
INDEX_ENTRIES = Gauge("mqstore_indexer_index_entries", "Key entries in the IndexFiles (UNIQ_KEY and KEYS)")
CHECKPOINT_OFFSET = Gauge("mqstore_indexer_dispatch_checkpoint_offset_bytes",
                          "Reput offset (bytes) of the last dispatch checkpoint: a crash restart re-dispatches from it")
RECOVERY_RESUME_OFFSET = Gauge("mqstore_indexer_recovery_resume_offset_bytes",
                               "Reput offset (bytes) the last start-up resumed dispatch from")
RECOVERY_REWOUND_ENTRIES = Gauge("mqstore_indexer_recovery_rewound_entries",
                                 "Index entries the last start-up removed to re-dispatch them")
RECOVERY_SECONDS = Gauge("mqstore_indexer_recovery_seconds",
                         "Time the last start-up took to recover the ConsumeQueues and rewind the index")
QUEUE_READS = Counter("mqstore_indexer_queue_entry_reads", "GetQueueEntries calls answered (one per pull)")
QUEUE_UNITS_SERVED = Counter("mqstore_indexer_queue_units_served", "ConsumeQueue units returned by GetQueueEntries")




class DispatchCounters(Collector):
    """What the reput counts as it goes (records dispatched, commitlog bytes taken by source), exposed
    as counters (``_total``: they only grow from the start of the process) and read when scraped, so
    the dispatch loop keeps its plain integer adds."""

    def __init__(self, dispatched: Callable[[], int], read_bytes: Callable[[], dict[str, int]]) -> None:
        self._dispatched = dispatched
        self._read_bytes = read_bytes

    def collect(self) -> Iterator[Metric]:
        yield CounterMetricFamily("mqstore_indexer_dispatched_records", "Records dispatched since start",
                                  value=self._dispatched())
        read = CounterMetricFamily(
            "mqstore_indexer_commitlog_read_bytes",
            "Commitlog bytes the reput took for dispatch since start, by source: read from the store's files "
            "(files) or sent by the commitlog's Tail (tail)", labels=["source"])
        by_source = self._read_bytes()
        for source in ("files", "tail"):
            read.add_metric([source], by_source.get(source, 0))
        yield read


_dispatch_counters: DispatchCounters | None = None


def observe_queue_read(units: int) -> None:
    """Record one answered GetQueueEntries call that returned ``units`` units."""
    QUEUE_READS.inc()
    QUEUE_UNITS_SERVED.inc(units)


def _index_entries(store: IndexerStore) -> int:
    # Slot 0 of an IndexFile is never used: a file with n entries has index_count n + 1.
    return sum(f.index_count - 1 for f in store.index.files) if store.index is not None else 0


def bind(store: IndexerStore, reput: ReputService) -> None:
    BEHIND_BYTES.set_function(lambda: reput.behind_bytes)
    BEHIND_SECONDS.set_function(lambda: reput.behind_ms / 1000)
    REPUT_OFFSET.set_function(lambda: store.reput_offset)
    global _dispatch_counters
    if _dispatch_counters is not None:
        REGISTRY.unregister(_dispatch_counters)
    _dispatch_counters = DispatchCounters(lambda: store.dispatched_records, lambda: dict(reput.read_bytes))
    REGISTRY.register(_dispatch_counters)
    CONNECTED.set_function(lambda: 1 if reput.lag.connected else 0)
    CONSUME_QUEUES.set_function(lambda: len(store.consume_queues.queues()))
    INDEX_FILES.set_function(lambda: len(store.index.files) if store.index is not None else 0)
    INDEX_ENTRIES.set_function(lambda: _index_entries(store))
    CHECKPOINT_OFFSET.set_function(lambda: store.dispatch_checkpoint.reput_offset if store.dispatch_checkpoint else -1)
    recovery = store.recovery
    if recovery is not None:
        RECOVERY_RESUME_OFFSET.set(recovery.resume_offset)
        RECOVERY_REWOUND_ENTRIES.set(recovery.rewound_entries)
        RECOVERY_SECONDS.set(recovery.seconds)
