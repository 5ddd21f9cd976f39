"""Consumer lag and per-topic series, scraped from a running ``mqstore up`` under traffic: two groups on
one topic, one caught up and one lagging, and what the commitlog counts per topic.

- the query service exports, per group and queue, the committed offset, the lag in messages (max offset
  - committed offset: kafka_consumergroup_lag, rocketmq_group_diff) and the lag in seconds (the age of
  the oldest message the group has not consumed), refreshed periodically (every second here);
- per topic: the sum of the ConsumeQueues' max offsets (query service), messages and bytes put
  (commitlog);
- past MQSTORE_METRICS_MAX_SERIES the largest lags keep their own series and the rest are summed under
  "other" (an in-process LagMonitor over fakes).
"""

from __future__ import annotations

import asyncio
import threading
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from mqstore.client import Producer, PullConsumer
from services.query.backends import QueueEntries
from services.query.consumer_offsets import ConsumerOffsetTable
from services.query.lag import LagMonitor
from services.server.metrics import OTHER, BoundedLabel
from tests.observability.conftest import TracedUp

TOPIC = "LagOrders"
SENT = 20
SLOW_CONSUMED = 5

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _scrape(url: str) -> Samples:
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _queue(group: str, queue_id: int = 0) -> tuple[tuple[str, str], ...]:
    return (("group", group), ("queue_id", str(queue_id)), ("topic", TOPIC))


def _consume(address: str, group: str, count: int) -> None:
    with PullConsumer(group, TOPIC, address, rebalance=False, long_poll_ms=500) as consumer:
        got = 0
        deadline = time.monotonic() + 20
        while got < count and time.monotonic() < deadline:
            got += len(consumer.poll(max_messages=count - got, timeout=1))
        assert got == count
        consumer.commit()


def test_lag_series_of_a_caught_up_and_a_lagging_group(traced_up: TracedUp) -> None:
    address = traced_up.up.gateway
    with Producer(address) as producer:
        first_stored = time.time()
        for i in range(SENT):
            producer.send(TOPIC, f"order {i}".encode(), queue_id=0)
    _consume(address, "lag-fast", SENT)
    _consume(address, "lag-slow", SLOW_CONSUMED)

    stop = threading.Event()

    def traffic() -> None:  # the system is scraped under load: another topic keeps being written
        with Producer(address) as background:
            while not stop.is_set():
                background.send("LagBackground", b"noise")

    sender = threading.Thread(target=traffic, daemon=True)
    sender.start()
    try:
        deadline = time.monotonic() + 20
        while True:
            query = _scrape(traced_up.metrics_url("query"))
            slow_lag = query.get(("mqstore_query_group_lag_messages", _queue("lag-slow")))
            if slow_lag == SENT - SLOW_CONSUMED or time.monotonic() > deadline:
                break
            time.sleep(0.3)
        commitlog = _scrape(traced_up.metrics_url("commitlog"))
    finally:
        stop.set()
        sender.join(10)
    assert slow_lag == SENT - SLOW_CONSUMED, sorted(k for k in query if k[0].startswith("mqstore_query_group"))
    assert query[("mqstore_query_group_committed_offset", _queue("lag-slow"))] == SLOW_CONSUMED
    assert query[("mqstore_query_group_committed_offset", _queue("lag-fast"))] == SENT
    assert query[("mqstore_query_group_lag_messages", _queue("lag-fast"))] == 0
    assert query[("mqstore_query_group_lag_seconds", _queue("lag-fast"))] == 0
    # the oldest message lag-slow has not consumed is message 5, stored after first_stored
    age = query[("mqstore_query_group_lag_seconds", _queue("lag-slow"))]
    assert 0 < age <= time.time() - first_stored + 1, age
    assert query[("mqstore_query_topic_max_offset", (("topic", TOPIC),))] == SENT
    assert query[("mqstore_query_lag_refreshed_timestamp_seconds", ())] > first_stored
    assert commitlog[("mqstore_commitlog_topic_put_messages_total", (("topic", TOPIC),))] == SENT
    assert commitlog[("mqstore_commitlog_topic_put_bytes_total", (("topic", TOPIC),))] > SENT * len(b"order 0")
    assert commitlog[("mqstore_commitlog_topic_put_messages_total", (("topic", "LagBackground"),))] > 0


class _FakeIndexer:
    def __init__(self, queues: list[tuple[str, int, int, int]]) -> None:
        self._queues = queues

    async def queues(self) -> list[tuple[str, int, int, int]]:
        return self._queues

    async def queue_entries(self, topic: str, queue_id: int, from_offset: int, max_count: int) -> QueueEntries:
        return QueueEntries([], 0, 0, known=False)  # no store time: the age is left out


def test_series_past_the_cap_are_summed_under_other(tmp_path: Path) -> None:
    offsets = ConsumerOffsetTable(tmp_path)
    queues = [(f"T{i}", 0, 0, 100) for i in range(4)]
    for i, committed in enumerate((10, 90, 50, 100)):  # lags 90, 10, 50, 0
        offsets.commit("g", f"T{i}", 0, committed)
    monitor = LagMonitor(_FakeIndexer(queues), None, offsets, max_series=2)  # type: ignore[arg-type]
    snapshot = asyncio.run(monitor.refresh())
    assert [(q.topic, q.messages) for q in snapshot.queues] == [("T0", 90), ("T2", 50)]
    assert snapshot.other_messages == 10 + 0
    assert snapshot.topic_max_offsets == {"T0": 100, "T1": 100, OTHER: 200}
    monitor.snapshot = snapshot
    lag = next(f for f in monitor.collect() if f.name == "mqstore_query_group_lag_messages")
    assert len(lag.samples) == 3
    assert {"group": OTHER, "topic": OTHER, "queue_id": OTHER} in [s.labels for s in lag.samples]


def test_a_counters_label_keeps_the_first_values_and_sums_the_rest() -> None:
    label = BoundedLabel(2)
    assert [label(v) for v in ("a", "b", "c", "a", "d", "b")] == ["a", "b", OTHER, "a", OTHER, "b"]
