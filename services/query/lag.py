"""Consumer lag per group and queue, and each topic's max offset, as Prometheus series: what
kafka-exporter's ``kafka_consumergroup_lag`` and rocketmq-exporter's ``rocketmq_group_diff`` give
operators, so a stuck consumer can be alerted on.

Computed by the query service because it owns the committed offsets and reads the ConsumeQueues: one
``ListQueues`` call gives every queue's offsets, and each lagging queue that is kept as a series costs
one read of its oldest unconsumed message's store time. That runs every
``MQSTORE_METRICS_LAG_INTERVAL_MS`` (10 s by default), never per scrape: a scrape reads the last result.
The calls start no trace (internal polling: services/server/tracing.py).

Cardinality is bounded by ``MQSTORE_METRICS_MAX_SERIES`` per metric: the (group, topic, queue) with
the largest lag keep their own series, the rest are summed under ``group``, ``topic`` and ``queue_id``
``"other"`` (their lag in messages; an offset or an age does not add up, so "other" has none); topics
past the cap are summed the same way.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from prometheus_client import Metric
from prometheus_client.core import GaugeMetricFamily

from services.query.backends import CommitLogClient, IndexerClient
from services.query.consumer_offsets import ConsumerOffsetTable
from services.query.queue_offset_lookup import QueueOffsets
from services.server.metrics import OTHER, max_series_from_env
from services.store.errors import StoreError
from services.store.formats.consumer_offsets_file import TOPIC_GROUP_SEPARATOR

log = logging.getLogger(__name__)

LAG_INTERVAL_ENV = "MQSTORE_METRICS_LAG_INTERVAL_MS"
DEFAULT_LAG_INTERVAL_MS = 10_000
_QUEUE_LABELS = ["group", "topic", "queue_id"]


def lag_settings_from_env() -> tuple[int, float]:
    """(series cap, refresh interval in seconds); ValueError naming the variable to fix."""
    text = os.environ.get(LAG_INTERVAL_ENV, "").strip()
    try:
        interval_ms = int(text) if text else DEFAULT_LAG_INTERVAL_MS
    except ValueError:
        raise ValueError(f"{LAG_INTERVAL_ENV}={text!r} is not a number of milliseconds") from None
    if interval_ms < 100:
        raise ValueError(f"{LAG_INTERVAL_ENV}={interval_ms} must be at least 100 (ms)")
    return max_series_from_env(), interval_ms / 1000


@dataclass(frozen=True, slots=True)
class QueueLag:
    group: str
    topic: str
    queue_id: int
    committed_offset: int
    #: max offset - committed offset (0 when caught up)
    messages: int
    #: age of the oldest unconsumed message; None when it could not be read
    seconds: float | None


@dataclass(frozen=True, slots=True)
class LagSnapshot:
    queues: list[QueueLag] = field(default_factory=list)
    #: lag in messages of the queues past the cap; None when none was left out
    other_messages: int | None = None
    #: topic -> sum of its queues' max offsets (OTHER: the topics past the cap)
    topic_max_offsets: dict[str, int] = field(default_factory=dict)
    computed_at: float = 0.0
    duration_s: float = 0.0


class LagMonitor:
    """Refreshes a :class:`LagSnapshot` periodically and exports the last one when scraped (a
    prometheus_client custom collector: register it once)."""

    def __init__(self, indexer: IndexerClient, commitlog: CommitLogClient, offsets: ConsumerOffsetTable,
                 max_series: int, clock: Callable[[], float] = time.time) -> None:
        self._indexer = indexer
        self._queue_offsets = QueueOffsets(indexer, commitlog)
        self._offsets = offsets
        self._max_series = max_series
        self._clock = clock
        self.snapshot = LagSnapshot()

    async def run(self, interval_s: float) -> None:
        """Refresh every ``interval_s`` until cancelled; a failed round is logged and the last figures kept."""
        while True:
            try:
                self.snapshot = await self.refresh()
            except StoreError as exc:
                log.warning("consumer lag not refreshed: %s (the last figures stay)", exc)
            await asyncio.sleep(interval_s)

    async def refresh(self) -> LagSnapshot:
        started = time.perf_counter()
        queues = await self._indexer.queues()
        bounds = {(topic, queue_id): (low, high) for topic, queue_id, low, high in queues}
        table = self._offsets.copy_table()
        lagging: list[tuple[int, str, str, int, int]] = []
        for key, committed_by_queue in table.items():
            topic, _, group = key.rpartition(TOPIC_GROUP_SEPARATOR)
            for queue_id, committed in committed_by_queue.items():
                bound = bounds.get((topic, queue_id))
                if bound is not None:  # a queue the indexer no longer has (a deleted topic) has no lag
                    lagging.append((max(0, bound[1] - committed), group, topic, queue_id, committed))
        lagging.sort(key=lambda q: (-q[0], q[1], q[2], q[3]))
        kept, rest = lagging[:self._max_series], lagging[self._max_series:]
        now_ms = self._clock() * 1000
        results = []
        for messages, group, topic, queue_id, committed in kept:
            seconds = 0.0 if messages == 0 else await self._age_s(topic, queue_id, committed, bounds, now_ms)
            results.append(QueueLag(group, topic, queue_id, committed, messages, seconds))
        return LagSnapshot(results, sum(q[0] for q in rest) if rest else None, self._topic_max_offsets(queues),
                           self._clock(), time.perf_counter() - started)

    async def _age_s(self, topic: str, queue_id: int, committed: int,
                     bounds: dict[tuple[str, int], tuple[int, int]], now_ms: float) -> float | None:
        """Seconds since the oldest unconsumed message was stored (at the committed offset, or the
        queue's min offset when that was deleted)."""
        oldest = max(committed, bounds[topic, queue_id][0])
        try:
            stored_ms = await self._queue_offsets.store_time_at(topic, queue_id, oldest)
        except StoreError as exc:
            log.debug("no store time for the lag of %s/%d at %d: %s", topic, queue_id, committed, exc)
            return None
        return None if stored_ms is None else max(0.0, (now_ms - stored_ms) / 1000)

    def _topic_max_offsets(self, queues: list[tuple[str, int, int, int]]) -> dict[str, int]:
        totals: dict[str, int] = {}
        for topic, _, _, high in queues:
            totals[topic] = totals.get(topic, 0) + high
        ranked = sorted(totals.items(), key=lambda t: (-t[1], t[0]))
        kept = dict(ranked[:self._max_series])
        if len(ranked) > self._max_series:
            kept[OTHER] = sum(total for _, total in ranked[self._max_series:])
        return kept

    # -- prometheus_client collector ---------------------------------------------------------------
    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        snapshot = self.snapshot
        committed = GaugeMetricFamily(
            "mqstore_query_group_committed_offset",
            "Consumer group's committed offset per queue (a queue offset: messages, not bytes)", labels=_QUEUE_LABELS)
        lag = GaugeMetricFamily(
            "mqstore_query_group_lag_messages",
            "Messages after the group's committed offset (max offset - committed offset; kafka_consumergroup_lag, "
            "rocketmq_group_diff); queues past MQSTORE_METRICS_MAX_SERIES summed under \"other\"",
            labels=_QUEUE_LABELS)
        age = GaugeMetricFamily(
            "mqstore_query_group_lag_seconds",
            "Age of the oldest message the group has not consumed (0 when it is caught up)", labels=_QUEUE_LABELS)
        for queue in snapshot.queues:
            labels = [queue.group, queue.topic, str(queue.queue_id)]
            committed.add_metric(labels, queue.committed_offset)
            lag.add_metric(labels, queue.messages)
            if queue.seconds is not None:
                age.add_metric(labels, queue.seconds)
        if snapshot.other_messages is not None:
            lag.add_metric([OTHER, OTHER, OTHER], snapshot.other_messages)
        topics = GaugeMetricFamily(
            "mqstore_query_topic_max_offset",
            "Sum of the max offsets of the topic's ConsumeQueues: messages stored in the topic on this shard "
            "(rocketmq_producer_offset); topics past MQSTORE_METRICS_MAX_SERIES summed under \"other\"",
            labels=["topic"])
        for topic, total in snapshot.topic_max_offsets.items():
            topics.add_metric([topic], total)
        refreshed = GaugeMetricFamily("mqstore_query_lag_refreshed_timestamp_seconds",
                                      "When the consumer lag series were last computed (Unix time; 0: not yet)")
        refreshed.add_metric([], snapshot.computed_at)
        took = GaugeMetricFamily("mqstore_query_lag_refresh_duration_seconds",
                                 "How long the last computation of the consumer lag series took")
        took.add_metric([], snapshot.duration_s)
        yield from (committed, lag, age, topics, refreshed, took)
