"""Consumer groups at the gateway: heartbeats fanned out to every shard, descriptions merged.

Members are kept by each shard's query service (services/query/consumer_manager.py), next to the
offsets, because the gateway is stateless and may run as several workers or replicas. A heartbeat
goes to every shard at once; the answer is the union of the shards that answered, so the group keeps
rebalancing while one shard is down (a shard that comes back learns the members from their next
heartbeat). On a replicated shard a heartbeat goes to every replica, so a failover keeps the members.
DescribeGroups adds what only the routes know: route queue ids, max offsets, lag.

Tokens name topics, not groups, so a group is reached through its topics (its members' and those it
committed offsets on). A token sees a group only if it may consume one of those topics, and then only
that part: each member with the topics and queues the token may consume (a member with none is left
out), the queues of those topics. It may replace (heartbeat as) or remove a member only if it may
consume every topic of that member, which is what registering it required. An unknown group (no
topics) is anyone's: group names are not owned, so no tenant can squat on one.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

from gateway.auth import Action, PermissionDeniedError, Principal, TokenTable
from gateway.resilience import BackendError, RetryPolicy
from gateway.route import RouteTable, TopicRoute
from gateway.shard import ShardClient
from mqstore.v1 import groups_pb2, query_pb2
from services.store.rules.group_membership import check_heartbeat, check_member
from services.store.rules.names import check_group

#: Calls that change membership: made on every replica of a replicated shard, so that each replica's query
#: service knows the members when it comes to lead.
MEMBERSHIP_CHANGES = frozenset({"Heartbeat", "UnregisterConsumer"})


class GroupDirectory:
    def __init__(self, shards: Sequence[ShardClient], routes: RouteTable, retry: RetryPolicy,
                 tokens: TokenTable) -> None:
        self.shards = tuple(shards)
        self.routes = routes
        self.retry = retry
        self.tokens = tokens

    async def _everywhere(self, method: str, request: Any, timeout: float) -> list[Any]:
        """Each shard's answer, or its BackendError."""

        async def ask(shard: ShardClient) -> Any:
            if method in MEMBERSHIP_CHANGES:
                return await self.retry.read(functools.partial(shard.on_every_replica, method, request, timeout))
            call: Callable[..., Awaitable[Any]] = getattr(shard.query, method)
            return await self.retry.read(functools.partial(shard.on_query, call, request, timeout))

        return list(await asyncio.gather(*(ask(s) for s in self.shards), return_exceptions=True))

    @staticmethod
    def _answered(answers: list[Any]) -> list[Any]:
        """The answers, once at least one shard answered; else the first shard's error."""
        for answer in answers:
            if isinstance(answer, BaseException) and not isinstance(answer, BackendError):
                raise answer  # a bug, not a shard that is down
        good = [a for a in answers if not isinstance(a, BackendError)]
        if not good:
            raise answers[0]
        return good

    async def heartbeat(self, principal: Principal, request: groups_pb2.HeartbeatRequest,
                        timeout: float) -> groups_pb2.HeartbeatResponse:
        check_heartbeat(request.group, request.client_id, list(request.topics),
                        [(q.topic, q.queue_id) for q in request.assigned_queues], request.allocation_strategy,
                        request.rebalance_interval_ms, request.member_timeout_ms)
        for topic in request.topics:
            self.tokens.authorize(principal, Action.CONSUME, topic)
        if not principal.admin:
            members = _union(d.members for d in await self._parts(request.group, timeout))
            _check_may_replace(principal, request.group, request.client_id, members)
        answers = self._answered(await self._everywhere("Heartbeat", request, timeout))
        members = _visible_members(principal, _union(a.members for a in answers))
        response = groups_pb2.HeartbeatResponse(member_ids=[m.client_id for m in members],
                                                rebalance_interval_ms=answers[0].rebalance_interval_ms,
                                                member_timeout_ms=answers[0].member_timeout_ms)
        response.members.extend(members)
        return response

    async def unregister(self, principal: Principal, request: groups_pb2.UnregisterConsumerRequest,
                         timeout: float) -> groups_pb2.UnregisterConsumerResponse:
        """Every shard that answers forgets the member; one that does not drops it at its timeout."""
        check_member(request.group, request.client_id)
        if not principal.admin:
            parts = await self._parts(request.group, timeout)
            _check_may_see(principal, request.group, parts)
            _check_may_replace(principal, request.group, request.client_id, _union(d.members for d in parts))
        self._answered(await self._everywhere("UnregisterConsumer", request, timeout))
        return groups_pb2.UnregisterConsumerResponse()

    async def authorize_group(self, principal: Principal, group: str, timeout: float) -> None:
        """PERMISSION_DENIED for a group the token may not reach (see the module docstring): before a
        call writes into the group's retry or dead-letter topic."""
        if not principal.admin:
            _check_may_see(principal, group, await self._parts(group, timeout))

    async def _parts(self, group: str, timeout: float) -> list[groups_pb2.GroupDescription]:
        """The group as the shards that answer know it (members and committed offsets)."""
        request = groups_pb2.DescribeGroupsRequest(group=group)
        answers = self._answered(await self._everywhere("DescribeGroups", request, timeout))
        return [d for a in answers for d in a.groups if d.group == group]

    async def describe(self, principal: Principal, request: groups_pb2.DescribeGroupsRequest,
                       timeout: float) -> groups_pb2.DescribeGroupsResponse:
        if request.group:
            check_group(request.group)
        answers = await self._everywhere("DescribeGroups", request, timeout)
        for answer in answers:
            if isinstance(answer, BaseException):
                raise answer  # lag from some shards only would mislead: all or an error
        per_group: dict[str, list[tuple[ShardClient, groups_pb2.GroupDescription]]] = {}
        for shard, answer in zip(self.shards, answers, strict=True):
            for description in answer.groups:
                per_group.setdefault(description.group, []).append((shard, description))
        if request.group and request.group not in per_group:
            per_group[request.group] = []
        if not principal.admin:
            if request.group:
                _check_may_see(principal, request.group, [d for _, d in per_group[request.group]])
            per_group = {name: parts for name, parts in per_group.items()
                         if _may_see(principal, [d for _, d in parts])}
        # The groups at once: one after another, G groups cost G rounds of offset calls.
        described = await asyncio.gather(*(self._describe_group(principal, name, per_group[name], timeout)
                                           for name in sorted(per_group)))
        return groups_pb2.DescribeGroupsResponse(groups=described)

    async def _describe_group(self, principal: Principal, name: str,
                              parts: list[tuple[ShardClient, groups_pb2.GroupDescription]],
                              timeout: float) -> groups_pb2.GroupDescription:
        members = _visible_members(principal, _union(d.members for _, d in parts))
        owners = {(q.topic, q.queue_id): m.client_id for m in members for q in m.assigned_queues}
        committed: dict[tuple[str, ShardClient, int], int] = {}
        topics: set[str] = {t for m in members for t in m.topics}
        for shard, description in parts:
            for q in description.queues:
                committed[(q.topic, shard, q.queue_id)] = q.committed_offset
                topics.add(q.topic)
        described = groups_pb2.GroupDescription(group=name)
        described.members.extend(members)
        visible = [t for t in sorted(topics) if principal.may(Action.CONSUME, t)]
        routes = [r for r in await asyncio.gather(*(self.routes.route(t) for t in visible)) if r is not None]
        ranges = await self._offset_ranges(routes, timeout)
        for route in routes:
            for queue in route.queues:
                if not queue.readable:
                    continue
                min_offset, max_offset = ranges[(route.topic, queue.queue_id)]
                offset = committed.get((route.topic, queue.shard, queue.shard_queue_id), -1)
                lag = max(max_offset - (offset if offset >= 0 else min_offset), 0)
                described.queues.add(topic=route.topic, queue_id=queue.queue_id, max_offset=max_offset,
                                     committed_offset=offset, lag=lag,
                                     owner_client_id=owners.get((route.topic, queue.queue_id), ""),
                                     shard=queue.shard.name)
                described.total_lag += lag
        return described

    async def _offset_ranges(self, routes: Iterable[TopicRoute],
                             timeout: float) -> dict[tuple[str, int], tuple[int, int]]:
        """(topic, route queue id) -> (min offset, max offset) of every readable queue, asked at once."""
        keys: list[tuple[str, int]] = []
        calls = []
        for route in routes:
            for queue in route.queues:
                if not queue.readable:
                    continue
                shard = queue.shard
                request = query_pb2.GetQueueOffsetRangeRequest(topic=route.topic, queue_id=queue.shard_queue_id)
                keys.append((route.topic, queue.queue_id))
                calls.append(self.retry.read(functools.partial(shard.on_query, shard.query.GetQueueOffsetRange,
                                                               request, timeout)))
        answers = await asyncio.gather(*calls)
        return {key: (a.min_offset, a.max_offset) for key, a in zip(keys, answers, strict=True)}


def _group_topics(parts: Iterable[groups_pb2.GroupDescription]) -> set[str]:
    """The topics a group is reached through: its members' and those it committed offsets on."""
    return {t for d in parts for t in [*(t for m in d.members for t in m.topics), *(q.topic for q in d.queues)]}


def _may_see(principal: Principal, parts: Sequence[groups_pb2.GroupDescription]) -> bool:
    topics = _group_topics(parts)
    return not topics or any(principal.may(Action.CONSUME, t) for t in topics)


def _check_may_see(principal: Principal, group: str, parts: Sequence[groups_pb2.GroupDescription]) -> None:
    if not _may_see(principal, parts):
        raise PermissionDeniedError(f"token {principal.name!r} may not reach consumer group {group!r}: it may "
                                    "consume none of the group's topics (its consume list)")


def _check_may_replace(principal: Principal, group: str, client_id: str,
                       members: Iterable[groups_pb2.GroupMember]) -> None:
    """Only a token that may consume every topic of a member may heartbeat as it or remove it."""
    for member in members:
        if member.client_id == client_id and not all(principal.may(Action.CONSUME, t) for t in member.topics):
            raise PermissionDeniedError(f"token {principal.name!r} may not act as member {client_id!r} of consumer "
                                        f"group {group!r}: the member consumes topics outside the token's consume "
                                        "list")


def _visible_members(principal: Principal, members: list[groups_pb2.GroupMember]) -> list[groups_pb2.GroupMember]:
    """Each member with only the topics and queues the token may consume; one with none is left out."""
    if principal.admin:
        return members
    visible = []
    for member in members:
        topics = [t for t in member.topics if principal.may(Action.CONSUME, t)]
        if not topics:
            continue
        if len(topics) < len(member.topics):
            shown = groups_pb2.GroupMember(client_id=member.client_id, topics=topics,
                                           last_heartbeat_ms=member.last_heartbeat_ms,
                                           allocation_strategy=member.allocation_strategy)
            shown.assigned_queues.extend(q for q in member.assigned_queues if q.topic in topics)
            member = shown
        visible.append(member)
    return visible


def _union(member_lists: Iterable[Iterable[groups_pb2.GroupMember]]) -> list[groups_pb2.GroupMember]:
    """Members by client id over the shards' answers, the latest heartbeat of each, sorted."""
    latest: dict[str, groups_pb2.GroupMember] = {}
    for members in member_lists:
        for member in members:
            seen = latest.get(member.client_id)
            if seen is None or member.last_heartbeat_ms > seen.last_heartbeat_ms:
                latest[member.client_id] = member
    return [latest[c] for c in sorted(latest)]
