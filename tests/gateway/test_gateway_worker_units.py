"""Gateway workers, the parts without processes: each worker's round-robin start, the worker identity
and the worker count's sources (flag, environment, settings file)."""

from __future__ import annotations

import collections

from gateway.queue_selector import FaultTable, QueueSelector
from tests.gateway.test_gateway_units import route


def test_each_worker_starts_a_topics_rotation_at_its_share_of_the_queues() -> None:
    """Two workers that each see four sends to an 8-queue topic fill all eight queues, once each (before,
    both started at queue 0 and queues 4..7 got nothing)."""
    r = route(("a", 8, 8, 0))
    counts: collections.Counter[int] = collections.Counter()
    for index in range(2):
        selector = QueueSelector(latency_aware=False, faults=FaultTable(1, 60), worker=(index, 2))
        counts.update(selector.select(r).queue_id for _ in range(4))
    assert counts == collections.Counter(range(8))


def test_a_single_gateway_still_starts_at_queue_zero_and_stays_even() -> None:
    selector = QueueSelector(latency_aware=False, faults=FaultTable(1, 60))
    r = route(("a", 4, 4, 0), ("b", 4, 4, 0))
    picked = [selector.select(r).queue_id for _ in range(16)]
    assert picked[:8] == list(range(8)) and collections.Counter(picked) == collections.Counter(list(range(8)) * 2)
