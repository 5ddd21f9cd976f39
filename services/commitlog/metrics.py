"""The commitlog service's Prometheus metrics: puts, reads, the Tail, flushes, recovery, early deletion,
and the store's state (offsets, files, disk).

Only the commitlog process imports this module, so only it exports ``mqstore_commitlog_*`` (other
processes used to export all these series at 0, because they lived in the shared server layer).

The counters are process-wide and always updated: an update is a lock and an add, and the put path
records once per append call (a batch or a stream batch), never per byte; reads once per call, flushes
once per fdatasync round. Gauges of the store's state (offsets, files, disk) are read from the engine
only when scraped.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

from prometheus_client import REGISTRY, Metric
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from services.server.metrics import OTHER, BoundedLabel, Counter, Gauge, Histogram, max_series_from_env

PUTS = Counter("mqstore_commitlog_puts", "Messages put into the commitlog, by PutMessageStatus or rejection",
               ["status"])
PUT_LATENCY = Histogram(
    "mqstore_commitlog_put_latency_seconds",
    "Duration of one engine append call (one message, a batch or a stream batch), flush wait included",
    buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
APPENDED_BYTES = Counter("mqstore_commitlog_appended_bytes", "Record bytes appended to the commitlog")
# Per topic, as stored (a delayed message under SCHEDULE_TOPIC_XXXX until it is due, a transaction's half
# under RMQ_SYS_TRANS_HALF_TOPIC): rocketmq-exporter's rocketmq_producer_tps / _message_size.
TOPIC_PUT_MESSAGES = Counter("mqstore_commitlog_topic_put_messages", "Messages put, per topic (topics past "
                             "MQSTORE_METRICS_MAX_SERIES are summed under topic=\"other\")", ["topic"])
TOPIC_PUT_BYTES = Counter("mqstore_commitlog_topic_put_bytes", "Record bytes put, per topic (topics past "
                          "MQSTORE_METRICS_MAX_SERIES are summed under topic=\"other\")", ["topic"])
_topic_label = BoundedLabel(max_series_from_env())
TAIL_CHUNKS = Counter("mqstore_commitlog_tail_chunks", "Tail chunks sent, data or empty heartbeat", ["kind"])
RPC_ERRORS = Counter("mqstore_commitlog_rpc_errors", "RPCs ended with an error status", ["method", "code"])
FLUSH_LATENCY = Histogram(
    "mqstore_commitlog_flush_latency_seconds",
    "Duration of one flush round that made data durable (fdatasync; group commit or flush service)",
    buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
READS = Counter("mqstore_commitlog_reads", "Read and ReadBatch calls answered", ["method"])
READ_BYTES = Counter("mqstore_commitlog_read_bytes", "Record bytes sent by Read, ReadBatch and Tail", ["method"])

# What the last start-up's recovery found (set once per start; see services/commitlog/recovery.py).
COMMITLOG_QUARANTINED_BYTES = Gauge(
    "mqstore_commitlog_quarantined_bytes",
    "Commitlog bytes in quarantined ranges: damaged records recovery stepped over (reads answer DATA_LOSS)")
RECOVERY_SECONDS = Gauge("mqstore_commitlog_recovery_seconds", "Duration of the last start-up's recovery walk")
RECOVERY_SCANNED_BYTES = Gauge("mqstore_commitlog_recovery_scanned_bytes",
                               "Commitlog bytes the last start-up's recovery walked")
RECOVERY_DROPPED_BYTES = Gauge(
    "mqstore_commitlog_recovery_dropped_bytes",
    "Bytes the last recovery cut off at a torn or damaged record (to the end of the data found after it); "
    "0 for a clean end of the log")
RECOVERY_MISSING_BYTES = Gauge(
    "mqstore_commitlog_recovery_missing_bytes",
    "Log the store's records say existed but the last start-up's recovery did not find, by evidence: "
    "durable (the queue-offset snapshot: flushed data lost) or dispatched (the indexer's dispatch checkpoint: "
    "under ASYNC_FLUSH, the flush window's loss)", ["evidence"])
RECOVERY_MISSING_MS = Gauge(
    "mqstore_commitlog_recovery_missing_ms",
    "Store time of records the checkpoint says were flushed but the last start-up's recovery did not find")
RECOVERY_FLUSH_LOSS_BYTES = Gauge(
    "mqstore_commitlog_recovery_flush_loss_bytes",
    "Under ASYNC_FLUSH, after an unclean stop: log bytes past the recovered end that a durable witness (the "
    "indexer's dispatch checkpoint) saw, lost with the unflushed page cache (0: none seen)")
RECOVERY_FLUSH_LOSS_MS = Gauge(
    "mqstore_commitlog_recovery_flush_loss_ms",
    "Under ASYNC_FLUSH, after an unclean stop: store time past the newest record found that a durable witness "
    "(the checkpoint, the dispatch checkpoint's index) saw, lost with the unflushed page cache")
RECOVERY_FLUSH_LOSS_MESSAGES = Gauge(
    "mqstore_commitlog_recovery_flush_loss_messages",
    "Under ASYNC_FLUSH, after an unclean stop: messages consumer groups had consumed past the recovered end of "
    "their queues (consumer offsets beyond the log)")
RECOVERY_UNCLEAN_ASYNC = Counter(
    "mqstore_commitlog_recovery_unclean_async",
    "Recoveries after an unclean stop under ASYNC_FLUSH: each may have lost the appends of the last "
    "flushIntervalCommitLog (stored after mqstore_commitlog_recovery_end_store_timestamp_ms)")
RECOVERY_END_STORE_TIMESTAMP = Gauge(
    "mqstore_commitlog_recovery_end_store_timestamp_ms",
    "Store time (ms since the epoch) of the newest record the last start-up's recovery found, 0 for none")
RECOVERY_DROPPED_RECORDS = Gauge(
    "mqstore_commitlog_recovery_dropped_records",
    "Intact records the last recovery found after a damaged record and dropped with it (0: none, or a torn tail)")

# Commitlog files deleted before fileReservedTime because the disk was past diskSpaceCleanForciblyRatio
# (services/commitlog/clean_commitlog.py); each deletion is also a WARNING naming the file and the
# consumer groups whose unconsumed messages it held.
EARLY_DELETED_FILES = Counter("mqstore_commitlog_early_deleted_files",
                              "Commitlog files deleted before fileReservedTime because the disk was too full")
EARLY_DELETED_BYTES = Counter("mqstore_commitlog_early_deleted_bytes",
                              "Bytes of commitlog files deleted before fileReservedTime because the disk was too full")

# Bound children: a labels() lookup per call is the expensive part of a prometheus update.
_PUT_OK = PUTS.labels(status="PUT_OK")
TAIL_DATA_CHUNKS = TAIL_CHUNKS.labels(kind="data")
TAIL_HEARTBEATS = TAIL_CHUNKS.labels(kind="heartbeat")
TAIL_POSITION_CHUNKS = TAIL_CHUNKS.labels(kind="position")  # Tail positions_only
READ_CALLS = READS.labels(method="Read")
READ_BATCH_CALLS = READS.labels(method="ReadBatch")
READ_BYTES_READ = READ_BYTES.labels(method="Read")
READ_BYTES_READ_BATCH = READ_BYTES.labels(method="ReadBatch")
READ_BYTES_TAIL = READ_BYTES.labels(method="Tail")


class _Put(Protocol):
    @property
    def status(self) -> enum.Enum: ...

    @property
    def wrote_bytes(self) -> int: ...

    @property
    def topic(self) -> str: ...


def observe_append(results: Sequence[_Put], elapsed_s: float) -> None:
    """Record one engine append call that returned ``results`` (one update per topic of the call)."""
    PUT_LATENCY.observe(elapsed_s)
    ok = written = 0
    by_topic: dict[str, list[int]] = {}
    for result in results:
        written += result.wrote_bytes
        if result.status.name == "PUT_OK":
            ok += 1
            counts = by_topic.get(result.topic)
            if counts is None:
                counts = by_topic[result.topic] = [0, 0]
            counts[0] += 1
            counts[1] += result.wrote_bytes
        else:
            PUTS.labels(status=result.status.name).inc()
    _PUT_OK.inc(ok)
    APPENDED_BYTES.inc(written)
    for topic, (messages, size) in by_topic.items():
        _observe_topic(topic, messages, size)


_topic_children: dict[str, tuple[Counter, Counter]] = {}


def _observe_topic(topic: str, messages: int, size: int) -> None:
    children = _topic_children.get(topic)
    if children is None:
        label = _topic_label(topic)
        children = (TOPIC_PUT_MESSAGES.labels(topic=label), TOPIC_PUT_BYTES.labels(topic=label))
        if label != OTHER:  # the topics past the cap are not remembered one by one either
            _topic_children[topic] = children
    children[0].inc(messages)
    children[1].inc(size)


class _Damage(Protocol):
    @property
    def dropped_bytes(self) -> int: ...

    @property
    def intact_records(self) -> int: ...


class _Recovery(Protocol):
    @property
    def scanned_bytes(self) -> int: ...

    @property
    def damage(self) -> _Damage | None: ...

    @property
    def last_timestamp(self) -> int: ...


def observe_recovery(result: _Recovery, elapsed_s: float) -> None:
    """Record what a start-up's recovery walked and what it cut off."""
    RECOVERY_SECONDS.set(elapsed_s)
    RECOVERY_SCANNED_BYTES.set(result.scanned_bytes)
    RECOVERY_END_STORE_TIMESTAMP.set(result.last_timestamp)
    damage = result.damage
    RECOVERY_DROPPED_BYTES.set(damage.dropped_bytes if damage is not None else 0)
    RECOVERY_DROPPED_RECORDS.set(damage.intact_records if damage is not None else 0)


class _MissingLog(Protocol):
    @property
    def durable_missing_bytes(self) -> int: ...

    @property
    def dispatched_missing_bytes(self) -> int: ...

    @property
    def missing_ms(self) -> int: ...


def observe_missing_log(missing: _MissingLog | None) -> None:
    """Record what a start-up found missing of the log (all 0: nothing)."""
    RECOVERY_MISSING_BYTES.labels("durable").set(missing.durable_missing_bytes if missing else 0)
    RECOVERY_MISSING_BYTES.labels("dispatched").set(missing.dispatched_missing_bytes if missing else 0)
    RECOVERY_MISSING_MS.set(missing.missing_ms if missing else 0)


class _FlushLoss(Protocol):
    @property
    def lost_bytes(self) -> int: ...

    @property
    def lost_ms(self) -> int: ...

    @property
    def lost_messages(self) -> int: ...


def observe_flush_loss(loss: _FlushLoss | None) -> None:
    """Record an unclean stop under ASYNC_FLUSH and what its witnesses show the flush policy lost (all 0:
    nothing)."""
    RECOVERY_UNCLEAN_ASYNC.inc()
    RECOVERY_FLUSH_LOSS_BYTES.set(loss.lost_bytes if loss else 0)
    RECOVERY_FLUSH_LOSS_MS.set(loss.lost_ms if loss else 0)
    RECOVERY_FLUSH_LOSS_MESSAGES.set(loss.lost_messages if loss else 0)


def observe_early_deletion(file_bytes: int) -> None:
    """Record one commitlog file of ``file_bytes`` deleted before its reserved time."""
    EARLY_DELETED_FILES.inc()
    EARLY_DELETED_BYTES.inc(file_bytes)


def observe_read(calls: Counter, read_bytes: Counter, size: int) -> None:
    """Record one answered read call of ``size`` bytes (bound children of READS and READ_BYTES)."""
    calls.inc()
    read_bytes.inc(size)


class _Stats(Protocol):
    """What the store gauges read of the engine's StoreStats."""

    @property
    def min_offset(self) -> int: ...

    @property
    def max_offset(self) -> int: ...

    @property
    def flushed_offset(self) -> int: ...

    @property
    def mapped_file_count(self) -> int: ...

    @property
    def disk_total_bytes(self) -> int: ...

    @property
    def disk_used_bytes(self) -> int: ...


class StoreCollector(Collector):
    """The commitlog's state, read from the engine when scraped (one ``stats()`` call, one statvfs):
    nothing on the put path."""

    def __init__(self, stats: Callable[[], _Stats], file_size: int, disk_full: Callable[[], bool]) -> None:
        self._stats = stats
        self._file_size = file_size
        self._disk_full = disk_full

    def collect(self) -> Iterator[Metric]:
        st = self._stats()
        ratio = st.disk_used_bytes / st.disk_total_bytes if st.disk_total_bytes else 0.0
        for name, doc, value in (
            ("min_offset_bytes", "First commitlog offset still on disk (a byte offset)", st.min_offset),
            ("max_offset_bytes", "Commitlog offset the next record is written at (a byte offset)", st.max_offset),
            ("flushed_offset_bytes", "Commitlog offset made durable so far (a byte offset)", st.flushed_offset),
            ("files", "Commitlog files on disk", st.mapped_file_count),
            ("files_bytes", "Disk space the commitlog files take (files x file size)",
             st.mapped_file_count * self._file_size),
            ("disk_used_ratio", "Used fraction of the store's filesystem (writes stop above "
             "diskSpaceWarningLevelRatio)", ratio),
            ("disk_used_bytes", "Used bytes of the store's filesystem", st.disk_used_bytes),
            ("disk_total_bytes", "Size of the store's filesystem", st.disk_total_bytes),
            ("disk_full", "1 while writes are refused because the disk is too full", int(self._disk_full())),
        ):
            yield GaugeMetricFamily(f"mqstore_commitlog_{name}", doc, value=value)


_store_collector: StoreCollector | None = None


def bind_commitlog(stats: Callable[[], _Stats], file_size: int, disk_full: Callable[[], bool]) -> None:
    """Expose the store gauges of one engine (replacing those of an earlier one in this process)."""
    global _store_collector
    if _store_collector is not None:
        REGISTRY.unregister(_store_collector)
    _store_collector = StoreCollector(stats, file_size, disk_full)
    REGISTRY.register(_store_collector)


def observe_rejected(status: str, count: int = 1) -> None:
    """Record messages refused before anything was written (``status`` names why)."""
    PUTS.labels(status=status).inc(count)
