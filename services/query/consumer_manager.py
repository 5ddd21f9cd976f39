"""Consumer group members: RocketMQ's ConsumerManager, kept in memory by the query service.

Membership lives where the offsets live (the query service of each shard), not in the gateway: the
gateway is stateless and may run as several workers or replicas, each of which would see only the
heartbeats that happened to reach it. The gateway sends every heartbeat to every shard and unions
the answers, so a group's members are known as long as one shard's query service is up.

Nothing is persisted: a restarted query service learns the members again from their next heartbeat
(within one rebalance interval), as a restarted RocketMQ broker does. Each replica of a replicated shard
takes every heartbeat (the gateway sends them to all), so a new leader knows the members at once. A
member not heard from for its ``member_timeout`` is dropped (RocketMQ: 120 s channel expiry).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from services.store.errors import ResourceExhaustedError

#: Members over every group at once; a heartbeat of a new member past it is RESOURCE_EXHAUSTED.
MAX_MEMBERS = 100_000
#: Expired members of every group are swept at most this often (a group is also swept when read).
SWEEP_INTERVAL_S = 1.0


@dataclass(frozen=True, slots=True)
class Member:
    client_id: str
    topics: tuple[str, ...]
    #: (topic, route queue id) the member reports as its own.
    assigned: tuple[tuple[str, int], ...]
    strategy: str
    last_heartbeat_ms: int
    rebalance_interval_ms: int
    member_timeout_ms: int

    def expired(self, now_ms: int) -> bool:
        return now_ms - self.last_heartbeat_ms > self.member_timeout_ms


class GroupMembers:
    """group -> client id -> Member. Callers check names and timing (services.store.rules.group_membership)."""

    def __init__(self, clock: Callable[[], float] = time.time, max_members: int = MAX_MEMBERS) -> None:
        self._clock = clock
        self._max_members = max_members
        self._groups: dict[str, dict[str, Member]] = {}
        self._count = 0
        self._swept_at = float("-inf")

    @property
    def count(self) -> int:
        return self._count

    def now_ms(self) -> int:
        return int(self._clock() * 1000)

    def heartbeat(self, group: str, client_id: str, topics: tuple[str, ...], assigned: tuple[tuple[str, int], ...],
                  strategy: str, rebalance_interval_ms: int, member_timeout_ms: int) -> list[Member]:
        """Records the member; returns the group's live members sorted by client id."""
        self._sweep()
        members = self._groups.get(group)
        if members is None or client_id not in members:
            if self._count >= self._max_members:
                raise ResourceExhaustedError(f"the query service tracks {self._count} consumer group members, its "
                                             "limit: unregister idle consumers or retry later")
            members = self._groups.setdefault(group, {})
            self._count += 1
        members[client_id] = Member(client_id, topics, assigned, strategy, self.now_ms(), rebalance_interval_ms,
                                    member_timeout_ms)
        return self.live(group)

    def unregister(self, group: str, client_id: str) -> bool:
        members = self._groups.get(group)
        if members is None or members.pop(client_id, None) is None:
            return False
        self._count -= 1
        if not members:
            del self._groups[group]
        return True

    def live(self, group: str) -> list[Member]:
        """The group's members heard from within their timeout, sorted by client id."""
        members = self._groups.get(group)
        if not members:
            return []
        self._expire(group, members, self.now_ms())
        return sorted(members.values(), key=lambda m: m.client_id)

    def groups(self) -> list[str]:
        self._sweep()
        return sorted(self._groups)

    def _sweep(self) -> None:
        now = self._clock()
        if now - self._swept_at < SWEEP_INTERVAL_S:
            return
        self._swept_at = now
        now_ms = int(now * 1000)
        for group, members in list(self._groups.items()):
            self._expire(group, members, now_ms)

    def _expire(self, group: str, members: dict[str, Member], now_ms: int) -> None:
        gone = [client_id for client_id, m in members.items() if m.expired(now_ms)]
        for client_id in gone:
            del members[client_id]
        self._count -= len(gone)
        if not members:
            self._groups.pop(group, None)
