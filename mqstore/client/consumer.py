"""Consuming with pulls: where each queue is, what was handed out, what to commit, and long polling.

:class:`OffsetTracker` is the bookkeeping, free of I/O so the sync and asyncio consumers share it.
Two positions per queue: the next offset to *fetch* and the offset after the last message *delivered*
to the caller. Only the second is committed, so a crash re-delivers at most what was fetched but not
yet processed (at-least-once, as in RocketMQ).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import queue
import re
import time
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc

from mqstore.client import tracing
from mqstore.client.connection import Connection, Endpoint, Tls
from mqstore.client.errors import InvalidArgumentError, MqstoreError, NotFoundError, PermissionDeniedError
from mqstore.client.limits import MAX_PULL_MESSAGES
from mqstore.client.models import Message, TopicRoute
from mqstore.client.offsets import start_offsets
from mqstore.client.rebalance import (
    DEFAULT_REBALANCE_INTERVAL_S,
    AllocationStrategy,
    GroupMembership,
    plan,
    strategy_of,
)
from mqstore.client.records import decode_records
from mqstore.client.retry import RETRY_ROUTE_RECHECK_S, SendBackReceipt, as_original, retry_topic, send_back_request
from mqstore.v1 import gateway_pb2, query_pb2

#: How long one pull waits for messages by default; the query service allows up to 15 s.
DEFAULT_LONG_POLL_MS = 10_000
DEFAULT_BATCH = 32
DEFAULT_COMMIT_INTERVAL_S = 5.0
#: Deadline of a pull beyond its long poll (the gateway's own backend timeout is 5 s).
PULL_MARGIN_S = 10.0
_MAX_LONG_POLL = re.compile(r"long poll \d+ ms must be within 0\.\.(\d+)")

#: GetMessageStatus FOUND: the only status whose answer carries messages.
FOUND = 1
#: A topic that does not exist yet is looked for again after this long, doubled each time up to the max.
MISSING_TOPIC_FIRST_WAIT_S = 0.2
MISSING_TOPIC_MAX_WAIT_S = 5.0

log = logging.getLogger(__name__)


class MissingTopics:
    """The wait for topics that do not exist yet (a consumer started before its producer sent, as
    Kafka's and RocketMQ's consumers allow): when to look again, with a bounded backoff, and one log
    line when a topic is first missed and when it appears."""

    def __init__(self, announce: bool = True) -> None:
        #: False for the group's retry topic, which exists only once a message was sent back.
        self.announce = announce
        self.waiting: set[str] = set()
        self.delay_s = MISSING_TOPIC_FIRST_WAIT_S
        self.next_at = float("-inf")

    def missing(self, topic: str, error: NotFoundError) -> None:
        if topic not in self.waiting and self.announce:
            log.warning("topic %r does not exist yet (%s): waiting for it, looking again every %.1f s at most",
                        topic, error.message, MISSING_TOPIC_MAX_WAIT_S)
            self.waiting.add(topic)
        self.next_at = time.monotonic() + self.delay_s
        self.delay_s = min(self.delay_s * 2, MISSING_TOPIC_MAX_WAIT_S)

    def found(self, topic: str) -> None:
        if topic in self.waiting and self.announce:
            log.info("topic %r exists now: consuming it", topic)
            self.waiting.discard(topic)
        if not self.waiting:
            self.delay_s = MISSING_TOPIC_FIRST_WAIT_S


@dataclass(slots=True)
class QueueState:
    queue_id: int
    #: Where the next pull of this queue starts.
    fetch_offset: int
    #: The offset after the last message handed to the caller: what a commit stores.
    consumed_offset: int
    #: The offset last committed (or read from the group) for this queue; None = never.
    committed_offset: int | None
    buffered: deque[Message] = field(default_factory=deque)
    #: The queue's max offset as of the last pull (for lag).
    max_offset: int = 0


class OffsetTracker:
    """Per-queue fetch / consume / commit positions and the messages fetched but not yet delivered."""

    def __init__(self, starts: Mapping[int, tuple[int, int | None]]) -> None:
        """``starts``: queue id -> (start offset, committed offset or None)."""
        self.queues: dict[int, QueueState] = {
            q: QueueState(q, start, start, committed) for q, (start, committed) in starts.items()}
        #: Delivery order, rotated after every take so that no queue is always served first.
        self._order = list(self.queues)

    @property
    def buffered(self) -> int:
        return sum(len(s.buffered) for s in self.queues.values())

    def fetchable(self) -> list[int]:
        """Queues with nothing buffered: only those are pulled, so a queue's messages stay in order."""
        return [q for q in self._order if not self.queues[q].buffered]

    def absorb(self, queue_id: int, fetch_offset: int, response: Any) -> int:
        """Takes a pull answer for ``fetch_offset``; returns how many messages it buffered. Every status
        moves the fetch offset to next_begin_offset (past filtered messages, or back into range after
        OFFSET_TOO_SMALL / OVERFLOW). An answer for an offset the queue is no longer at (a seek
        happened) is dropped."""
        state = self.queues[queue_id]
        if state.fetch_offset != fetch_offset or state.buffered:
            return 0
        state.max_offset = response.max_offset
        messages = pulled_messages(response, queue_id) if response.status == FOUND else []
        state.fetch_offset = response.next_begin_offset
        if messages:
            state.buffered.extend(messages)
        else:
            state.consumed_offset = state.fetch_offset
        return len(messages)

    def take(self, max_messages: int) -> list[Message]:
        """Up to ``max_messages`` buffered messages, queue after queue; marks them consumed."""
        taken: list[Message] = []
        for q in self._order:
            state = self.queues[q]
            while state.buffered and len(taken) < max_messages:
                message = state.buffered.popleft()
                taken.append(message)
                state.consumed_offset = message.queue_offset + 1
            if not state.buffered:
                # Filtered messages after the last delivered one are consumed too.
                state.consumed_offset = state.fetch_offset
            if len(taken) >= max_messages:
                break
        if taken:
            # The next take starts after the queue served last.
            last = taken[-1].queue_id
            if last in self.queues:
                i = self._order.index(last)
                self._order = self._order[i + 1:] + self._order[:i + 1]
        return taken

    def add(self, queue_id: int, start: int, committed: int | None) -> None:
        """A queue this consumer was given (a rebalance)."""
        self.queues[queue_id] = QueueState(queue_id, start, start, committed)
        self._order.append(queue_id)

    def remove(self, queue_id: int) -> QueueState:
        """A queue this consumer gave up (a rebalance): what was fetched of it and not taken is dropped."""
        self._order.remove(queue_id)
        return self.queues.pop(queue_id)

    def seek(self, queue_id: int, offset: int) -> None:
        state = self.queues[queue_id]
        state.buffered.clear()
        state.fetch_offset = state.consumed_offset = offset

    def to_commit(self) -> list[tuple[int, int]]:
        return [(q, s.consumed_offset) for q, s in self.queues.items() if s.consumed_offset != s.committed_offset]

    def committed(self, queue_id: int, offset: int) -> None:
        self.queues[queue_id].committed_offset = offset

    def positions(self) -> dict[int, int]:
        return {q: s.consumed_offset for q, s in self.queues.items()}

    def lag(self) -> dict[int, int]:
        """Messages behind each queue's max offset as of its last pull (filtered ones included)."""
        return {q: max(s.max_offset - s.consumed_offset, 0) for q, s in self.queues.items()}


def pull_request(topic: str, queue_id: int, offset: int, batch: int, subscription: str, long_poll_ms: int,
                 max_bytes: int, raw_records: bool = True) -> Any:
    return query_pb2.PullMessageRequest(topic=topic, queue_id=queue_id, queue_offset=offset, max_messages=batch,
                                        max_bytes=max_bytes, subscription=subscription, long_poll_ms=long_poll_ms,
                                        raw_records=raw_records)


def pulled_messages(response: Any, queue_id: int) -> list[Message]:
    """A pull answer's messages, in either form: raw records (decoded here; they carry the shard's queue
    id, so the route queue id asked for replaces it) or decoded messages (a gateway or store that
    predates raw records answers so whatever was asked)."""
    if response.record_count:
        return decode_records(response.records, queue_id)
    return [Message.from_proto(m) for m in response.messages]


def max_long_poll_of(error: MqstoreError) -> int | None:
    """The server's long-poll limit, when a pull was refused for asking longer."""
    match = _MAX_LONG_POLL.search(error.message) if isinstance(error, InvalidArgumentError) else None
    return int(match.group(1)) if match else None


class PullOptions:
    """What a pull consumer was asked for, checked once: shared by PullConsumer and AsyncPullConsumer."""

    group: str | None
    topic: str
    subscription: str
    long_poll_ms: int
    batch_size: int
    max_bytes: int
    auto_commit: bool
    commit_interval_s: float
    from_latest: bool
    timeout: float | None
    raw_records: bool
    _queue_ids: list[int] | None
    _explicit: dict[int, int]
    _tracker: OffsetTracker | None
    _last_commit: float
    _closed: bool

    def _configure(self, group: str | None, topic: str, queue_ids: Sequence[int] | None, subscription: str,
                   long_poll_ms: int, batch_size: int, max_bytes: int, auto_commit: bool, commit_interval_s: float,
                   from_latest: bool, start_offsets: Mapping[int, int] | None, timeout: float | None,
                   raw_records: bool = True) -> None:
        if not 1 <= batch_size <= MAX_PULL_MESSAGES:
            raise ValueError(f"batch_size must be within 1..{MAX_PULL_MESSAGES}")
        if long_poll_ms < 0:
            raise ValueError("long_poll_ms must not be negative")
        self.group = group
        self.topic = topic
        self.subscription = subscription or "*"
        self.long_poll_ms = long_poll_ms
        self.batch_size = batch_size
        self.max_bytes = max_bytes
        self.auto_commit = auto_commit and group is not None
        self.commit_interval_s = commit_interval_s
        self.from_latest = from_latest
        self.timeout = timeout
        self.raw_records = raw_records
        self._queue_ids = list(queue_ids) if queue_ids is not None else None
        self._explicit = dict(start_offsets or {})
        self._tracker: OffsetTracker | None = None
        self._last_commit = time.monotonic()
        self._closed = False

    def _commit_requests(self, pending: Sequence[tuple[int, int]]) -> list[query_pb2.UpdateConsumerOffsetRequest]:
        return [query_pb2.UpdateConsumerOffsetRequest(consumer_group=self.group, topic=self.topic, queue_id=q,
                                                      offset=offset) for q, offset in pending]

    def _committed(self, pending: Sequence[tuple[int, int]], answers: Sequence[Any]) -> dict[int, int]:
        """Records the commits that were stored; raises the first failure after recording the others."""
        self._last_commit = time.monotonic()
        committed: dict[int, int] = {}
        failure: MqstoreError | None = None
        for (q, offset), answer in zip(pending, answers, strict=True):
            if isinstance(answer, MqstoreError):
                failure = failure or answer
            elif self._tracker is not None:
                self._tracker.committed(q, offset)
                committed[q] = offset
        if failure is not None:
            raise failure
        return committed

    def _request(self, tracker: OffsetTracker, queue_id: int, long_poll_ms: int) -> tuple[int, Any]:
        offset = tracker.queues[queue_id].fetch_offset
        return offset, pull_request(self.topic, queue_id, offset, self.batch_size, self.subscription, long_poll_ms,
                                    self.max_bytes, self.raw_records)


class PullConsumer(PullOptions, Endpoint):
    """Pulls a topic's queues for a consumer group, tracking and committing offsets.

    ``poll()`` returns what is buffered, else pulls every queue at once, else long polls them all
    until one has messages or ``timeout`` passes. A queue without a committed offset starts at its
    min offset (``from_latest``: its max). With ``auto_commit`` the consumed offsets are committed
    every ``commit_interval_s`` (checked in poll) and at close: a message counts as consumed once
    the next poll is made. ``group=None`` reads without committing. Not thread-safe: one consumer
    per thread.

    ``topic`` may be a list of topics: they are pulled and long polled together and served in turns
    (``queue_ids``, ``start_offsets``, ``positions()``, ``lag()`` and ``seek()`` are then about the first).

    A consumer with a group and no ``queue_ids`` joins the group (``docs/consumer-groups.md``): it
    heartbeats every ``rebalance_interval_s`` from ``poll()`` and consumes the share of the topic's
    queues (and of ``%RETRY%<group>``'s) that ``allocation`` gives it among the live members; a member
    not heard from for ``member_timeout_s`` (default 3 intervals) loses its queues, so call ``poll()``
    at least that often. ``rebalance=False`` (or explicit ``queue_ids``) reads every queue (or those)
    without joining.

    Pulls ask for the stored record bytes (``raw_records``, RocketMQ's zero-copy pull) and decode them
    here, which spares the store a protobuf message per record; ``raw_records=False`` asks the store to
    decode (the messages are equal either way).
    """

    def __init__(self, group: str | None, topic: str | Sequence[str], address: str | None = None,
                 token: str | None = None, *,
                 connection: Connection | None = None, queue_ids: Sequence[int] | None = None,
                 subscription: str = "*", long_poll_ms: int = DEFAULT_LONG_POLL_MS, batch_size: int = DEFAULT_BATCH,
                 max_bytes: int = 0, auto_commit: bool = True, commit_interval_s: float = DEFAULT_COMMIT_INTERVAL_S,
                 from_latest: bool = False, start_offsets: Mapping[int, int] | None = None,
                 timeout: float | None = None, raw_records: bool = True, retry: bool = True,
                 tls: Tls | bool | None = None, rebalance: bool = True,
                 allocation: str | AllocationStrategy = "average",
                 rebalance_interval_s: float = DEFAULT_REBALANCE_INTERVAL_S, member_timeout_s: float | None = None,
                 client_id: str | None = None) -> None:
        topics = [topic] if isinstance(topic, str) else list(topic)
        if not topics or len(set(topics)) != len(topics):
            raise ValueError(f"give one or more distinct topics, not {topics!r}")
        if len(topics) > 1 and (queue_ids is not None or start_offsets):
            raise ValueError("queue_ids and start_offsets name queues of one topic: give a single topic with them")
        super().__init__(address, token, connection=connection, tls=tls)
        self._configure(group, topics[0], queue_ids, subscription, long_poll_ms, batch_size, max_bytes, auto_commit,
                        commit_interval_s, from_latest, start_offsets, timeout, raw_records)
        #: Group mode (see the class docstring): set up in start().
        self._membership: GroupMembership | None = None
        if group is not None and queue_ids is None and rebalance:
            self._membership = GroupMembership(self.connection, group, strategy_of(allocation), rebalance_interval_s,
                                               member_timeout_s, client_id, timeout)
        self._missing = MissingTopics()
        #: The topics after the first, each read by a consumer of its own on this one's channel, polled
        #: together with this one (in a group their queues are allocated too).
        self._feeds = {t: self._feed(t, [] if self._membership is not None else None) for t in topics[1:]}
        #: With a group: also consume %RETRY%<group> (see :mod:`mqstore.client.retry`).
        self._retry_wanted = retry and group is not None and not topics[0].startswith(("%RETRY%", "%DLQ%"))
        self._retry_feed: PullConsumer | None = None
        self._retry_checked_at = float("-inf")
        #: Which topic's consumer is served first by the next poll (turns, so no topic starves).
        self._turn = 0

    def _feed(self, topic: str, queue_ids: list[int] | None) -> PullConsumer:
        """A consumer of another topic (or the retry topic) for this one to poll along; a topic of its
        that does not exist yet is this one's wait too."""
        feed = PullConsumer(self.group, topic, connection=self.connection, queue_ids=queue_ids,
                            subscription=self.subscription, batch_size=self.batch_size, max_bytes=self.max_bytes,
                            auto_commit=self.auto_commit, commit_interval_s=self.commit_interval_s,
                            from_latest=self.from_latest, timeout=self.timeout, raw_records=self.raw_records,
                            retry=False, rebalance=False)
        feed._missing = self._missing
        return feed

    @property
    def topics(self) -> list[str]:
        """The topics this consumer was given (its retry topic not included)."""
        return [self.topic, *self._feeds]

    # -- set-up ------------------------------------------------------------------------------------

    def start(self) -> None:
        """Reads the route and the starting offsets; poll() calls it on first use."""
        if self._tracker is not None:
            return
        if self._membership is not None:
            self._tracker = OffsetTracker({})
            try:
                self._rebalance()
            except BaseException:
                self._tracker = None  # the next start() tries again
                raise
            return
        if self._queue_ids is None:
            self._queue_ids = self._route(self.topic).readable_queue_ids
        starts = start_offsets(self.connection, self.group, self.topic, self._queue_ids, self._explicit,
                               self.from_latest, self.timeout)
        for feed in self._feeds.values():
            feed.start()
        self._tracker = OffsetTracker(starts)

    @property
    def tracker(self) -> OffsetTracker:
        self.start()
        assert self._tracker is not None
        return self._tracker

    @property
    def queue_ids(self) -> list[int]:
        """The queues of the first topic this consumer reads now, in order (all topics': :meth:`assignment`)."""
        return sorted(self.tracker.queues)

    def positions(self) -> dict[int, int]:
        """Queue id -> the next offset to consume (what commit() stores)."""
        return self.tracker.positions()

    def lag(self) -> dict[int, int]:
        return self.tracker.lag()

    def seek(self, queue_id: int, offset: int) -> None:
        """Consume ``queue_id`` from ``offset`` on (dropping what was fetched of it)."""
        self.tracker.seek(queue_id, offset)

    # -- consuming ---------------------------------------------------------------------------------

    def poll(self, max_messages: int = DEFAULT_BATCH, timeout: float | None = None) -> list[Message]:
        """Up to ``max_messages`` messages; waits up to ``timeout`` seconds (default: the long poll)
        when none is available, and returns [] if none came."""
        if self._closed:
            raise RuntimeError("the consumer is closed")
        started_ns = time.time_ns()
        if not self._started_or_waited(timeout):
            return []
        membership = self._membership
        if membership is not None and membership.due_in() <= 0:
            self._rebalance()
        if self.auto_commit and time.monotonic() - self._last_commit >= self.commit_interval_s:
            self.commit()
        self._retries()
        consumers = list(self._consumers().values())
        if not any(c.tracker.buffered for c in consumers):
            wait_s = self.long_poll_ms / 1000 if timeout is None else max(timeout, 0.0)
            if membership is not None:
                wait_s = min(wait_s, membership.due_in())
            self._fetch(consumers, wait_s)
        # Topics take turns being served first; the retry topic's messages go out under their own topic.
        turn = self._turn % len(consumers)
        self._turn += 1
        wanted = max(max_messages, 1)
        messages: list[Message] = []
        for consumer in consumers[turn:] + consumers[:turn]:
            if len(messages) >= wanted:
                break
            taken = consumer.tracker.take(wanted - len(messages))
            messages += [as_original(m) for m in taken] if consumer is self._retry_feed else taken
        tracing.received(self.group, self.connection.address, started_ns, messages)
        return messages

    def _route(self, topic: str) -> TopicRoute:
        """The topic's route; NotFoundError while it does not exist (its wait noted in ``_missing``)."""
        try:
            route = TopicRoute.from_proto(self.connection.call("GetRoute", gateway_pb2.GetRouteRequest(topic=topic),
                                                               self.timeout))
        except NotFoundError as exc:
            self._missing.missing(topic, exc)
            raise
        self._missing.found(topic)
        return route

    def _started_or_waited(self, timeout: float | None) -> bool:
        """start(), or, while one of the topics does not exist yet, look for it again (bounded backoff)
        until the poll's wait is over: False then (the poll answers nothing). A group member never
        waits here: it consumes the topics that exist and its rebalancing looks for the others."""
        wait_s = self.long_poll_ms / 1000 if timeout is None else max(timeout, 0.0)
        deadline = time.monotonic() + wait_s
        while True:
            if time.monotonic() >= self._missing.next_at:
                try:
                    self.start()
                    return True
                except NotFoundError:
                    if not self._missing.waiting:  # not a missing route: the error is the caller's
                        raise
            pause = min(self._missing.next_at, deadline) - time.monotonic()
            if pause <= 0 and time.monotonic() >= deadline:
                return False
            time.sleep(max(pause, 0.0))

    def _retry_consumer(self, queue_ids: list[int] | None) -> PullConsumer:
        """The retry topic's consumer: every message, whatever this one's subscription (RocketMQ's
        retry subscription is "*"), from its oldest."""
        assert self.group is not None
        consumer = PullConsumer(self.group, retry_topic(self.group), connection=self.connection, queue_ids=queue_ids,
                                batch_size=self.batch_size, auto_commit=self.auto_commit,
                                commit_interval_s=self.commit_interval_s, timeout=self.timeout,
                                raw_records=self.raw_records, retry=False, rebalance=False)
        consumer._missing = MissingTopics(announce=False)
        return consumer

    def _retries(self) -> PullConsumer | None:
        """The group's retry topic's consumer, once the topic exists (the first send back creates it)."""
        if self._retry_feed is not None or not self._retry_wanted or self._membership is not None:
            return self._retry_feed
        if time.monotonic() - self._retry_checked_at < RETRY_ROUTE_RECHECK_S:
            return None
        self._retry_checked_at = time.monotonic()
        feed = self._retry_consumer(None)
        try:
            feed.start()
        except NotFoundError:
            return None
        except PermissionDeniedError:
            # A token that may not consume %RETRY%<group> reads its topic alone, as before retries.
            self._retry_wanted = False
            return None
        self._retry_feed = feed
        return feed

    # -- the group ---------------------------------------------------------------------------------

    @property
    def client_id(self) -> str | None:
        """This member's id in its group (None when it reads without joining)."""
        return self._membership.client_id if self._membership is not None else None

    def assignment(self) -> dict[str, list[int]]:
        """Topic -> the queues this consumer reads now (its retry topic's included)."""
        self.start()
        return {topic: sorted(c._tracker.queues) for topic, c in self._consumers().items() if c._tracker is not None}

    def _group_topics(self) -> dict[str, list[int]]:
        """Topic -> readable queue ids, for the topic and (once it exists) the group's retry topic."""
        topics: dict[str, list[int]] = {}
        for name in self.topics:
            try:
                topics[name] = self._route(name).readable_queue_ids
            except NotFoundError:
                topics[name] = []  # not yet: looked for again at the next rebalance, soon (see _rebalance)
        if self._retry_wanted:
            assert self.group is not None
            name = retry_topic(self.group)
            try:
                retry_route = self.connection.call("GetRoute", gateway_pb2.GetRouteRequest(topic=name), self.timeout)
            except NotFoundError:
                return topics
            except PermissionDeniedError:
                self._retry_wanted = False
                return topics
            if self._retry_feed is None:
                self._retry_feed = self._retry_consumer([])
                self._retry_feed.start()
            topics[name] = TopicRoute.from_proto(retry_route).readable_queue_ids
        return topics

    def _consumers(self) -> dict[str, PullConsumer]:
        """Topic -> its consumer: this one, those of the other topics, the retry topic's once it exists."""
        consumers: dict[str, PullConsumer] = {self.topic: self, **self._feeds}
        if self._retry_feed is not None:
            consumers[self._retry_feed.topic] = self._retry_feed
        return consumers

    def _rebalance(self) -> None:
        """One round: heartbeat, release what is no longer ours (commit first, then heartbeat again so the
        next owner sees it free), take what is ours and free. A failed heartbeat keeps the queues held
        and tries again a quarter interval later; a gateway without groups (UNIMPLEMENTED) makes this
        consumer read every queue, as before groups."""
        membership = self._membership
        assert membership is not None and self._tracker is not None
        try:
            topics = self._group_topics()
            members = membership.heartbeat(list(topics), self.assignment())
            step = plan(membership.client_id, members, topics, self.assignment(), membership.strategy)
            if any(step.release.values()):
                for topic, queue_ids in step.release.items():
                    self._consumers()[topic]._release(queue_ids)
                members = membership.heartbeat(list(topics), self.assignment())
                step = plan(membership.client_id, members, topics, self.assignment(), membership.strategy)
            for topic, queue_ids in step.acquire.items():
                if queue_ids:
                    self._consumers()[topic]._acquire(queue_ids)
            if any(step.acquire.values()):
                membership.heartbeat(list(topics), self.assignment())
        except MqstoreError as exc:
            if exc.code == "UNIMPLEMENTED":
                self._membership = None
                self._tracker = None
                self._feeds = {t: self._feed(t, None) for t in self._feeds}
                if self._retry_feed is not None:  # made for the group's share (no queues): _retries makes it anew
                    self._retry_feed.close()
                    self._retry_feed = None
                self.start()
                return
            if not exc.retryable:
                raise
            membership.schedule(waiting=True)
            return
        # Until the retry topic exists (the first consume_later creates it), look for it as often as before
        # groups (RETRY_ROUTE_RECHECK_S), not only once an interval.
        soon = self._retry_wanted and self._retry_feed is None
        within = RETRY_ROUTE_RECHECK_S if soon else None
        if self._missing.waiting:  # a topic that does not exist yet: its backoff, not a whole interval
            within = min(within or float("inf"), self._missing.next_at - time.monotonic())
        membership.schedule(waiting=step.waits, within=within)

    def _release(self, queue_ids: Sequence[int]) -> None:
        """Gives queues up: their consumed offsets committed (with auto_commit) before anything else."""
        tracker = self.tracker
        if self.auto_commit:
            pending = [(q, tracker.queues[q].consumed_offset) for q in queue_ids
                       if tracker.queues[q].consumed_offset != tracker.queues[q].committed_offset]
            if pending:
                answers = self.connection.call_many("CommitOffset", self._commit_requests(pending), self.timeout)
                self._committed(pending, answers)
        for q in queue_ids:
            tracker.remove(q)

    def _acquire(self, queue_ids: Sequence[int]) -> None:
        tracker = self.tracker
        starts = start_offsets(self.connection, self.group, self.topic, queue_ids, self._explicit, self.from_latest,
                               self.timeout)
        for q, (start, committed) in starts.items():
            tracker.add(q, start, committed)

    def consume_later(self, message: Message | str, delay_level: int = 0, *,
                      max_reconsume_times: int | None = None) -> SendBackReceipt:
        """Hands a consumed message back (RocketMQ's RECONSUME_LATER): it comes again from the group's
        retry topic after its delay level (0: 3 + reconsume times), or goes to ``%DLQ%<group>`` once
        it was retried ``max_reconsume_times`` (16) times, or at once with ``delay_level=-1``."""
        request = send_back_request(self.group, message, delay_level, max_reconsume_times)
        receipt = SendBackReceipt.from_proto(self.connection.call("ConsumerSendBack", request, self.timeout))
        if self._membership is not None and self._retry_feed is None and self._retry_wanted:
            self._membership.due_at = float("-inf")  # the retry topic may exist now: its queues at the next poll
        return receipt

    def __iter__(self) -> Iterator[Message]:
        """Every message, waiting for new ones forever (stop with break or close())."""
        while not self._closed:
            yield from self.poll(self.batch_size)

    def _fetch(self, consumers: Sequence[PullConsumer], wait_s: float) -> int:
        """Pulls every queue (of every topic's consumer) with nothing buffered at once; if none has
        messages, long polls them all (one call per queue) until one answers with messages or
        ``wait_s`` passes."""
        connection = self.connection
        pulls = [(c, q, *c._request(c.tracker, q, 0)) for c in consumers for q in c.tracker.fetchable()]
        futures = [connection.future("Pull", request, PULL_MARGIN_S) for _, _, _, request in pulls]
        got = 0
        for (c, q, offset, _), future in zip(pulls, futures, strict=True):
            got += c.tracker.absorb(q, offset, connection.result(future, PULL_MARGIN_S))
        if got or wait_s <= 0:
            return got
        return self._long_poll(consumers, time.monotonic() + wait_s)

    def _long_poll(self, consumers: Sequence[PullConsumer], deadline: float) -> int:
        connection = self.connection
        #: (consumer, queue id) by key: what each in-flight call is for.
        keys = [(c, q) for c in consumers for q in c.tracker.fetchable()]
        done: queue.SimpleQueue[int] = queue.SimpleQueue()
        in_flight: dict[int, tuple[int, grpc.Future]] = {}  # type: ignore[type-arg]

        def launch(key: int) -> None:
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            if remaining_ms <= 0:
                return
            wait_ms = min(self.long_poll_ms, remaining_ms)
            c, q = keys[key]
            offset, request = c._request(c.tracker, q, wait_ms)
            future = connection.future("Pull", request, wait_ms / 1000 + PULL_MARGIN_S)
            in_flight[key] = (offset, future)
            future.add_done_callback(functools.partial(_signal, done, key))

        got = 0
        try:
            for key in range(len(keys)):
                launch(key)
            if not in_flight:
                # No readable queue: wait as asked instead of making iteration spin.
                time.sleep(max(deadline - time.monotonic(), 0.0))
            while in_flight and not got:
                try:
                    key = done.get(timeout=max(deadline - time.monotonic(), 0.0) + 0.05)
                except queue.Empty:
                    break
                offset, future = in_flight.pop(key)
                c, q = keys[key]
                try:
                    got += c.tracker.absorb(q, offset, connection.result(future))
                except MqstoreError as exc:
                    limit = max_long_poll_of(exc)
                    if limit is None or limit >= self.long_poll_ms:
                        raise
                    self.long_poll_ms = limit
                if not got:
                    launch(key)
        finally:
            for key, (offset, future) in in_flight.items():
                c, q = keys[key]
                if not future.cancel() and future.exception() is None:
                    got += c.tracker.absorb(q, offset, future.result())
        return got

    # -- committing --------------------------------------------------------------------------------

    def commit(self) -> dict[int, int]:
        """Stores the consumed offsets of queues that moved since the last commit; returns them."""
        if self.group is None:
            raise ValueError("this consumer has no group: there is nothing to commit to")
        if self._tracker is None:
            return {}
        for consumer in self._consumers().values():
            if consumer is not self:
                consumer.commit()
        pending = self._tracker.to_commit()
        requests = self._commit_requests(pending)
        answers = self.connection.call_many("CommitOffset", requests, self.timeout) if requests else []
        return self._committed(pending, answers)

    def close(self) -> None:
        """Commits (with auto_commit) and closes the channel the consumer opened."""
        if self._closed:
            return
        self._closed = True
        try:
            if self.auto_commit and self._tracker is not None:
                self.commit()
            if self._membership is not None and self._tracker is not None:
                with contextlib.suppress(MqstoreError):
                    # The others take this member's queues at their next round, not after its timeout.
                    self._membership.unregister()
        finally:
            for consumer in self._consumers().values():
                consumer._closed = True
            super().close()



def _signal(done: queue.SimpleQueue[int], queue_id: int, _future: object) -> None:
    done.put(queue_id)
