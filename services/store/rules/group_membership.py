"""Consumer group membership rules every edge checks the same way (gateway and query service).

RocketMQ's broker keeps a group's consumers from their heartbeats (ConsumerManager) and drops a
channel not heard from for 120 s; its clients rebalance every ``rebalanceInterval`` (20 s). Here each
member says how often it heartbeats, and is dropped after ``member_timeout`` (3 x its interval by
default) so that a test or an impatient deployment can use short values without a server setting.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from services.store.errors import InvalidArgumentError
from services.store.rules.names import check_group, check_topic_name

#: RocketMQ's default rebalanceInterval.
DEFAULT_REBALANCE_INTERVAL_MS = 20_000
MIN_REBALANCE_INTERVAL_MS = 100
MAX_REBALANCE_INTERVAL_MS = 600_000
#: A member is dropped after this many of its intervals without a heartbeat, unless it says otherwise.
DEFAULT_TIMEOUT_INTERVALS = 3
MAX_MEMBER_TIMEOUT_MS = 3_600_000
MAX_CLIENT_ID_LENGTH = 255
#: Topics one member may name (its retry topic included), and queues it may report.
MAX_MEMBER_TOPICS = 64
MAX_MEMBER_QUEUES = 4096
#: RocketMQ's clientId is ip@instance[@unitName]; '@', ':' and '#' are allowed besides name characters.
_LEGAL_CLIENT_ID = re.compile(r"^[A-Za-z0-9_.:@#%|\-]+$")
MAX_STRATEGY_LENGTH = 64
#: Route queue ids number the queues of every shard one after another (1024 per shard at most).
MAX_ROUTE_QUEUE_ID = 1 << 20


@dataclass(frozen=True, slots=True)
class MemberTiming:
    rebalance_interval_ms: int
    member_timeout_ms: int


def check_client_id(client_id: str) -> None:
    if not client_id:
        raise InvalidArgumentError("client_id is empty: give a unique id per consumer instance (e.g. ip@pid)")
    if len(client_id) > MAX_CLIENT_ID_LENGTH:
        raise InvalidArgumentError(f"client_id {client_id[:40]!r}... is longer than {MAX_CLIENT_ID_LENGTH} characters")
    if not _LEGAL_CLIENT_ID.fullmatch(client_id):  # match's $ would let a trailing newline through
        raise InvalidArgumentError(f"client_id {client_id[:60]!r} has illegal characters: use letters, digits and "
                                   "_.:@#%|-")


def member_timing(rebalance_interval_ms: int, member_timeout_ms: int) -> MemberTiming:
    """A heartbeat's timing with defaults applied (0 = default); InvalidArgumentError out of bounds."""
    interval = rebalance_interval_ms or DEFAULT_REBALANCE_INTERVAL_MS
    if not MIN_REBALANCE_INTERVAL_MS <= interval <= MAX_REBALANCE_INTERVAL_MS:
        raise InvalidArgumentError(f"rebalance_interval_ms {rebalance_interval_ms} must be within "
                                   f"{MIN_REBALANCE_INTERVAL_MS}..{MAX_REBALANCE_INTERVAL_MS} (0 = "
                                   f"{DEFAULT_REBALANCE_INTERVAL_MS})")
    timeout = member_timeout_ms or DEFAULT_TIMEOUT_INTERVALS * interval
    if not interval <= timeout <= MAX_MEMBER_TIMEOUT_MS:
        raise InvalidArgumentError(f"member_timeout_ms {member_timeout_ms} must be within the rebalance interval "
                                   f"({interval}) and {MAX_MEMBER_TIMEOUT_MS} (0 = {DEFAULT_TIMEOUT_INTERVALS} x the "
                                   "interval)")
    return MemberTiming(interval, timeout)


def check_heartbeat(group: str, client_id: str, topics: list[str], assigned: list[tuple[str, int]],
                    strategy: str, rebalance_interval_ms: int, member_timeout_ms: int) -> MemberTiming:
    """Every field of a heartbeat; its timing with defaults applied."""
    check_group(group)
    check_client_id(client_id)
    if len(topics) > MAX_MEMBER_TOPICS:
        raise InvalidArgumentError(f"the heartbeat names {len(topics)} topics, more than {MAX_MEMBER_TOPICS}")
    for topic in topics:
        check_topic_name(topic)
    if len(assigned) > MAX_MEMBER_QUEUES:
        raise InvalidArgumentError(f"the heartbeat reports {len(assigned)} queues, more than {MAX_MEMBER_QUEUES}")
    named = set(topics)
    for topic, queue_id in assigned:
        if not 0 <= queue_id < MAX_ROUTE_QUEUE_ID:
            raise InvalidArgumentError(f"assigned queue {topic}/{queue_id}: a route queue id is within "
                                       f"0..{MAX_ROUTE_QUEUE_ID - 1}")
        if topic not in named:
            raise InvalidArgumentError(f"assigned queue {topic}/{queue_id} is of a topic the heartbeat does not name "
                                       "in topics: add the topic")
    if len(strategy) > MAX_STRATEGY_LENGTH:
        raise InvalidArgumentError(f"allocation_strategy is longer than {MAX_STRATEGY_LENGTH} characters")
    return member_timing(rebalance_interval_ms, member_timeout_ms)


def check_member(group: str, client_id: str) -> None:
    check_group(group)
    check_client_id(client_id)
