"""Consumer groups on the client side: RocketMQ's RebalanceImpl, without a coordinator.

Every member heartbeats (``Heartbeat`` through the gateway) with the queues it holds; the answer is the
group's live members with their queues. From the sorted member list and the sorted queue list each
member computes its own share with the same :class:`AllocationStrategy` (RocketMQ's
AllocateMessageQueueAveragely by default), so members agree without talking to each other.

A queue changes hands without a gap and without a long overlap: a member that loses a queue commits
its offset and stops pulling it, then heartbeats at once; the member that gains it takes it only once
no live member reports it any more, starting from the committed offset. So no message is skipped; a
message delivered by the old owner after its last commit is delivered again by the new one
(at-least-once). A member that dies holds its queues until the group drops it (``member_timeout``).

:func:`plan` is the decision, free of I/O; :class:`GroupMembership` the calls.
"""

from __future__ import annotations

import os
import re
import secrets
import socket
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from mqstore.client.connection import Connection
from mqstore.v1 import groups_pb2

#: RocketMQ's rebalanceInterval.
DEFAULT_REBALANCE_INTERVAL_S = 20.0
#: While a queue it should own is still held by another member, a member heartbeats this much more often.
WAITING_SPEEDUP = 4


@runtime_checkable
class AllocationStrategy(Protocol):
    """Which of ``queues`` (sorted) ``client_id`` consumes among ``members`` (sorted, itself included).
    Every member of a group must use the same strategy, or queues go unconsumed or doubly consumed."""

    name: str

    def allocate(self, client_id: str, members: Sequence[str], queues: Sequence[int]) -> list[int]: ...


class AllocateAveragely:
    """RocketMQ's AllocateMessageQueueAveragely: contiguous runs, the first ``len(queues) % len(members)``
    members one queue more (8 queues, 3 members: 0-2, 3-5, 6-7)."""

    name = "average"

    def allocate(self, client_id: str, members: Sequence[str], queues: Sequence[int]) -> list[int]:
        if client_id not in members or not queues:
            return []
        index, n, m = members.index(client_id), len(members), len(queues)
        mod = m % n
        size = 1 if m <= n else (m // n + 1 if mod > 0 and index < mod else m // n)
        start = index * size if mod > 0 and index < mod else index * size + mod
        return [queues[(start + i) % m] for i in range(max(min(size, m - start), 0))]


class AllocateAveragelyByCircle:
    """RocketMQ's AllocateMessageQueueAveragelyByCircle: round robin (8 queues, 3 members: 0,3,6 / 1,4,7 / 2,5)."""

    name = "average_by_circle"

    def allocate(self, client_id: str, members: Sequence[str], queues: Sequence[int]) -> list[int]:
        if client_id not in members:
            return []
        return list(queues[members.index(client_id)::len(members)])


STRATEGIES: dict[str, AllocationStrategy] = {s.name: s for s in (AllocateAveragely(), AllocateAveragelyByCircle())}


def strategy_of(strategy: str | AllocationStrategy) -> AllocationStrategy:
    if not isinstance(strategy, str):
        return strategy
    try:
        return STRATEGIES[strategy]
    except KeyError:
        raise ValueError(f"allocation strategy {strategy!r} is unknown: use one of {sorted(STRATEGIES)} or pass an "
                         "AllocationStrategy") from None


def new_client_id() -> str:
    """Unique per consumer instance: host@pid@random (RocketMQ's ip@instanceName)."""
    host = re.sub(r"[^A-Za-z0-9_.\-]", "-", socket.gethostname())[:64] or "host"
    return f"{host}@{os.getpid()}@{secrets.token_hex(4)}"


@dataclass(frozen=True, slots=True)
class MemberView:
    client_id: str
    topics: frozenset[str]
    #: (topic, queue id) the member holds.
    assigned: frozenset[tuple[str, int]]

    @classmethod
    def from_proto(cls, member: Any) -> MemberView:
        return cls(member.client_id, frozenset(member.topics),
                   frozenset((q.topic, q.queue_id) for q in member.assigned_queues))


@dataclass(slots=True)
class Plan:
    """What one rebalance does, per topic."""

    release: dict[str, list[int]] = field(default_factory=dict)
    acquire: dict[str, list[int]] = field(default_factory=dict)
    #: Queues this member should own but another live member still holds (taken at a later round).
    waiting: dict[str, list[int]] = field(default_factory=dict)

    @property
    def waits(self) -> bool:
        return any(self.waiting.values())


def plan(client_id: str, members: Iterable[MemberView], queues: Mapping[str, Sequence[int]],
         held: Mapping[str, Iterable[int]], strategy: AllocationStrategy) -> Plan:
    """Per topic of ``queues`` (its readable queue ids): allocate among the members that consume the
    topic; release what is held but no longer ours, acquire what is ours and held by nobody else."""
    views = list(members)
    result = Plan()
    for topic, topic_queues in queues.items():
        consumers = sorted({m.client_id for m in views if topic in m.topics} | {client_id})
        target = set(strategy.allocate(client_id, consumers, sorted(topic_queues)))
        mine = set(held.get(topic, ()))
        others = {q for m in views if m.client_id != client_id for t, q in m.assigned if t == topic}
        result.release[topic] = sorted(mine - target)
        result.acquire[topic] = sorted(target - mine - others)
        result.waiting[topic] = sorted((target - mine) & others)
    return result


class GroupMembership:
    """One member's heartbeats: when the next is due, and the calls."""

    def __init__(self, connection: Connection, group: str, strategy: AllocationStrategy,
                 rebalance_interval_s: float = DEFAULT_REBALANCE_INTERVAL_S, member_timeout_s: float | None = None,
                 client_id: str | None = None, timeout: float | None = None) -> None:
        if rebalance_interval_s <= 0:
            raise ValueError("rebalance_interval_s must be positive")
        self.connection = connection
        self.group = group
        self.strategy = strategy
        self.client_id = client_id or new_client_id()
        self.rebalance_interval_s = rebalance_interval_s
        self.member_timeout_s = member_timeout_s
        self.timeout = timeout
        self.due_at = float("-inf")
        self.members: list[MemberView] = []

    def due_in(self) -> float:
        return max(self.due_at - time.monotonic(), 0.0)

    def schedule(self, waiting: bool, within: float | None = None) -> None:
        """The next round: one interval on, sooner while a queue waits for its previous owner (or
        ``within`` seconds, if sooner)."""
        interval = self.rebalance_interval_s / (WAITING_SPEEDUP if waiting else 1)
        if within is not None:
            interval = min(interval, within)
        self.due_at = time.monotonic() + interval

    def heartbeat(self, topics: Sequence[str], held: Mapping[str, Iterable[int]]) -> list[MemberView]:
        request = groups_pb2.HeartbeatRequest(
            group=self.group, client_id=self.client_id, topics=list(topics), allocation_strategy=self.strategy.name,
            rebalance_interval_ms=int(self.rebalance_interval_s * 1000),
            member_timeout_ms=int(self.member_timeout_s * 1000) if self.member_timeout_s else 0)
        for topic in topics:
            for q in sorted(held.get(topic, ())):
                request.assigned_queues.add(topic=topic, queue_id=q)
        response = self.connection.call("Heartbeat", request, self.timeout)
        self.members = [MemberView.from_proto(m) for m in response.members]
        return self.members

    def unregister(self) -> None:
        request = groups_pb2.UnregisterConsumerRequest(group=self.group, client_id=self.client_id)
        self.connection.call("UnregisterConsumer", request, self.timeout)
