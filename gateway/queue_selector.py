"""Which queue a send goes to.

* An explicit queue id, or a sharding key (ordered delivery: the key's Java hashCode modulo the
  writable queues, RocketMQ's SelectMessageQueueByHash), always give the same queue.
* Otherwise round robin over the topic's writable queues (RocketMQ's default), or, with
  ``queue_selection: latency``, the latency-aware choice of RocketMQ's MQFaultStrategy: each send's
  latency puts its shard into a latency class; a slow class makes the shard unavailable for a while
  (the same table as RocketMQ: 550 ms -> 30 s, ... 15 s -> 10 min) and a failure does too, with a
  backoff that doubles per consecutive failure. The choice is round robin over the queues of the
  available shards (fast shards share the load evenly; preferring the single fastest would starve the
  others of the sends that measure them); when every shard is unavailable, over all queues.
Faults are kept per shard, as RocketMQ keeps them per broker: every queue of a shard shares its
commitlog, so a slow queue means a slow shard.
"""

from __future__ import annotations

import itertools
import logging
import time
from bisect import bisect_right
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from gateway.route import QueueRoute, TopicRoute
from services.store.formats.java_hash import java_string_hash

log = logging.getLogger(__name__)
# RocketMQ MQFaultStrategy: latencyMax (ms) and notAvailableDuration (ms).
LATENCY_MAX_MS = (50, 100, 550, 1000, 2000, 3000, 15000)
NOT_AVAILABLE_MS = (0, 0, 30000, 60000, 120000, 180000, 600000)
#: Round-robin positions are kept for at most this many topics; past it the table starts over (every
#: topic's rotation restarts at a queue: harmless). Unbounded, every topic name a client ever sent to,
#: refused sends to topics that never came to exist included, kept an entry for the process's life.
MAX_ROUND_ROBIN_TOPICS = 65_536


class NoWritableQueueError(Exception):
    pass


@dataclass(slots=True)
class ShardFault:
    latency_class: int = 0
    available_at: float = 0.0
    consecutive_failures: int = 0


class FaultTable:
    def __init__(self, initial_backoff_s: float, max_backoff_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._faults: dict[str, ShardFault] = {}
        self._initial_backoff_s = initial_backoff_s
        self._max_backoff_s = max_backoff_s
        self._clock = clock

    def record(self, shard: str, latency_s: float, failed: bool) -> None:
        fault = self._faults.setdefault(shard, ShardFault())
        now = self._clock()
        if failed:
            fault.consecutive_failures += 1
            backoff = min(self._max_backoff_s, self._initial_backoff_s * 2 ** (fault.consecutive_failures - 1))
            fault.available_at = now + backoff
            fault.latency_class = len(LATENCY_MAX_MS) - 1
            log.warning("a send to %s failed: sends avoid it for %.1fs", shard, backoff)
            return
        fault.consecutive_failures = 0
        # RocketMQ computeNotAvailableDuration: the largest latencyMax the latency reaches.
        latency_class = max(bisect_right(LATENCY_MAX_MS, latency_s * 1000) - 1, 0)
        fault.latency_class = latency_class
        if NOT_AVAILABLE_MS[latency_class]:
            fault.available_at = now + NOT_AVAILABLE_MS[latency_class] / 1000
            log.warning("a send to %s took %.0f ms: sends avoid it for %.0fs", shard, latency_s * 1000,
                        NOT_AVAILABLE_MS[latency_class] / 1000)
        else:
            fault.available_at = now

    def now(self) -> float:
        return self._clock()

    def available(self, shard: str, now: float) -> bool:
        fault = self._faults.get(shard)
        return fault is None or fault.available_at <= now

    def latency_class(self, shard: str) -> int:
        fault = self._faults.get(shard)
        return 0 if fault is None else fault.latency_class

    def snapshot(self) -> dict[str, ShardFault]:
        return dict(self._faults)


class QueueSelector:
    def __init__(self, latency_aware: bool, faults: FaultTable, max_topics: int = MAX_ROUND_ROBIN_TOPICS,
                 worker: tuple[int, int] = (0, 1)) -> None:
        """``worker``: (index, count) of this gateway worker (gateway/workers.py). Each worker keeps its
        own rotation; worker i starts a topic's at the queue i/count of the way round, so that workers
        that each see a few sends still spread them over different queues instead of all over queue 0."""
        self.latency_aware = latency_aware
        self.faults = faults
        self._max_topics = max_topics
        self._worker_index, self._worker_count = worker
        self._counters: dict[str, Iterator[int]] = {}

    @property
    def topics_tracked(self) -> int:
        """Topics with a round-robin position now (at most ``max_topics``)."""
        return len(self._counters)

    def _next(self, topic: str, queues: int) -> int:
        counter = self._counters.get(topic)
        if counter is None:
            if len(self._counters) >= self._max_topics:
                self._counters.clear()
            counter = self._counters[topic] = itertools.count(self._worker_index * queues // self._worker_count)
        return next(counter)

    def select(self, route: TopicRoute, sharding_key: str = "", queue_id: int | None = None,
               avoid_shard: str | None = None) -> QueueRoute:
        """``queue_id`` must already be checked against the route. ``avoid_shard``: the shard the
        previous attempt of this send failed on (a retry goes elsewhere when it can)."""
        if queue_id is not None:
            return route.queues[queue_id]
        writable = route.writable
        if not writable:
            raise NoWritableQueueError(f"topic {route.topic!r} has no writable queue "
                                       "(check its perm and write queue nums)")
        if sharding_key:
            return writable[abs(_java_rem(java_string_hash(sharding_key), len(writable)))]
        if not self.latency_aware and avoid_shard is None:
            return writable[self._next(route.topic, len(writable)) % len(writable)]
        now = self.faults.now()
        candidates = [q for q in writable if q.shard.name != avoid_shard
                      and (not self.latency_aware or self.faults.available(q.shard.name, now))]
        if not candidates:
            candidates = list(writable)
        return candidates[self._next(route.topic, len(writable)) % len(candidates)]


def _java_rem(value: int, modulus: int) -> int:
    """Java's ``%``: the remainder takes the dividend's sign."""
    rem = abs(value) % modulus
    return -rem if value < 0 else rem
