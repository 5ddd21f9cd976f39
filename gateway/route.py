"""The route table: topic -> shards -> queues, read from each shard's topic configs.

A topic's route queues are numbered across shards in shard order: shard 0's queues first, then
shard 1's, and so on. A shard contributes max(read, write) queues; each is writable/readable as its
topic config says (RocketMQ's TopicConfig perm and queue counts).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from gateway.resilience import BackendError
from gateway.shard import ShardClient
from mqstore.v1 import common_pb2
from services.store.rules.topics import PERM_READ, PERM_WRITE

log = logging.getLogger(__name__)


@dataclass(slots=True, frozen=True)
class QueueRoute:
    queue_id: int
    shard: ShardClient
    shard_queue_id: int
    writable: bool
    readable: bool

    @property
    def base(self) -> int:
        """Route queue id minus shard queue id: what turns a shard's queue ids into route ids."""
        return self.queue_id - self.shard_queue_id


@dataclass(slots=True, frozen=True)
class TopicRoute:
    topic: str
    queues: tuple[QueueRoute, ...]
    writable: tuple[QueueRoute, ...]
    #: A route made up for a topic no shard has yet (auto-create): a send under it creates the topic.
    provisional: bool = False
    #: Each shard of the route and the route id of its queue 0, in shard order: worked out once per
    #: route, not on every read that turns a shard's queue ids into route ids.
    bases: dict[ShardClient, int] = field(default_factory=dict, compare=False)

    @classmethod
    def build(cls, topic: str, per_shard: Sequence[tuple[ShardClient, common_pb2.TopicConfig]],
              provisional: bool = False) -> TopicRoute:
        queues: list[QueueRoute] = []
        for shard, config in per_shard:
            for shard_queue_id in range(max(config.read_queue_nums, config.write_queue_nums)):
                queues.append(QueueRoute(
                    len(queues), shard, shard_queue_id,
                    writable=bool(config.perm & PERM_WRITE) and shard_queue_id < config.write_queue_nums,
                    readable=bool(config.perm & PERM_READ) and shard_queue_id < config.read_queue_nums))
        bases: dict[ShardClient, int] = {}
        for queue in queues:
            bases.setdefault(queue.shard, queue.base)
        return cls(topic, tuple(queues), tuple(q for q in queues if q.writable), provisional, bases)


class RouteTable:
    """Cached routes, refreshed from the shards every ``refresh_s`` and when a topic is missing (at most
    once per ``miss_refresh_s``, so a client asking for unknown topics cannot make every shard list all
    its topics again and again; a miss within it asks the shards for that topic alone).

    A refresh keeps only the shards' topic configs; a topic's route (a QueueRoute per queue) is built
    the first time a call needs it, so the cost of a refresh is the configs' and not every queue's of
    a store of 100,000 topics. A topic change this gateway made itself (create, update, delete) is put
    into the table as it is answered (:meth:`changed`), not by reading every shard's topics again."""

    def __init__(self, shards: Sequence[ShardClient], refresh_s: float, timeout_s: float,
                 miss_refresh_s: float = 0.5) -> None:
        self.shards = tuple(shards)
        self._refresh_s = refresh_s
        self._miss_refresh_s = miss_refresh_s
        self._timeout_s = timeout_s
        self._routes: dict[str, TopicRoute] = {}
        self._configs: dict[str, list[tuple[ShardClient, common_pb2.TopicConfig]]] = {}
        self._loaded_at = 0.0
        self._lock = asyncio.Lock()

    async def route(self, topic: str, fresh_on_miss: bool = False) -> TopicRoute | None:
        """The topic's route, or None when no shard has it. ``fresh_on_miss``: a miss asks the shards
        even within ``miss_refresh_s`` (a send that would otherwise create the topic on a provisional
        route: another gateway process may have created it a moment ago, with other queue counts)."""
        route = self._built(topic)
        now = time.monotonic()
        if route is not None and now - self._loaded_at < self._refresh_s:
            return route
        if route is None and now - self._loaded_at < self._miss_refresh_s and not fresh_on_miss:
            return await self._look_up(topic)
        await self.refresh()
        return self._built(topic)

    async def _look_up(self, topic: str) -> TopicRoute | None:
        """A topic missing from a table read a moment ago: every shard is asked for that one topic (another
        gateway process may have just created it), a small call rather than a read of every topic."""
        answers = await asyncio.gather(*(s.topics(self._timeout_s, topic) for s in self.shards),
                                       return_exceptions=True)
        pairs: list[tuple[ShardClient, common_pb2.TopicConfig]] = []
        for shard, answer in zip(self.shards, answers, strict=True):
            if isinstance(answer, BaseException):
                if not isinstance(answer, BackendError):
                    raise answer
                # A route without that shard's part would number the queues differently: read everything,
                # keeping that shard's last known topics.
                await self.refresh()
                return self._built(topic)
            pairs += [(shard, config) for config in answer]
        if not pairs:
            return None
        self.changed(topic, pairs)
        return self._built(topic)

    def _built(self, topic: str) -> TopicRoute | None:
        route = self._routes.get(topic)
        if route is None and (pairs := self._configs.get(topic)):
            route = self._routes[topic] = TopicRoute.build(topic, pairs)
        return route

    def configs(self) -> dict[str, list[tuple[ShardClient, common_pb2.TopicConfig]]]:
        return self._configs

    async def refresh(self) -> None:
        """Read every shard's topics. A shard that cannot be reached keeps its last known topics."""
        async with self._lock:
            started = time.monotonic()
            if started - self._loaded_at < 0.05:  # another caller just refreshed
                return
            answers = await asyncio.gather(*(s.topics(self._timeout_s) for s in self.shards), return_exceptions=True)
            per_topic: dict[str, list[tuple[ShardClient, common_pb2.TopicConfig]]] = {}
            for shard, answer in zip(self.shards, answers, strict=True):
                if isinstance(answer, BaseException):
                    if not isinstance(answer, BackendError):
                        raise answer
                    log.warning("route refresh: %s; keeping its last known topics", answer.details)
                    configs = [c for t, pairs in self._configs.items() for s, c in pairs if s is shard]
                else:
                    configs = answer
                for config in configs:
                    per_topic.setdefault(config.topic, []).append((shard, config))
            self._configs = per_topic
            self._routes = {}
            self._loaded_at = time.monotonic()

    def changed(self, topic: str, configs: Sequence[tuple[ShardClient, common_pb2.TopicConfig]]) -> None:
        """A topic change this gateway made and the shards answered: ``configs``, each shard's config of
        the topic now (empty: deleted everywhere). Other gateways learn it at their next refresh."""
        order = {shard: i for i, shard in enumerate(self.shards)}
        pairs = sorted(configs, key=lambda pair: order[pair[0]])
        self._routes.pop(topic, None)
        if pairs:
            self._configs[topic] = pairs
        else:
            self._configs.pop(topic, None)

    def invalidate(self) -> None:
        """After a topic change: the next call reads the shards again."""
        self._routes = {}
        self._loaded_at = 0.0
