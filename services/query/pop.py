"""Pop consumption (RocketMQ 5's): hand out, ack, change invisible time, claim exhausted messages.

The state is :mod:`services.query.pop_checkpoints`; messages are read with the service's own
pulls. Every change keeps the group's committed offset (the lowest offset in flight) in the consumer
offsets table, so ``mqstore groups``, lag and the commitlog's early deletion see pop consumers as they
see pulling ones; an offset committed there by someone else (a reset through mqstore.v1) resets the
queue's pop state to it.
"""

from __future__ import annotations

import dataclasses
import logging

from services.query.consumer_offsets import ConsumerOffsetTable
from services.query.errors import FailedPreconditionError
from services.query.offset_log import OffsetLog
from services.query.pop_checkpoints import InFlight, Key, PopCheckpointTable, PopQueue, inflight_entries, now_ms
from services.query.pull import GetMessageStatus, Puller
from services.query.queue_offset_lookup import QueueOffsets
from services.query.stored_message import StoredMessage
from services.store.errors import InvalidArgumentError, NotFoundError
from services.store.metadata_log import InFlightEntry, PopChange
from services.store.rules.names import check_group, check_queue
from services.store.rules.pull_request import PullQuery
from services.store.rules.subscription import parse_subscription

log = logging.getLogger(__name__)

SHARDING_KEY = "__SHARDINGKEY"
MAX_POP = 1024
#: One pull reads at most this many new messages.
PULL_BATCH = 32
MAX_INVISIBLE_MS = 12 * 3600 * 1000
DEFAULT_MAX_ATTEMPTS = 16
DEFAULT_MAX_CLAIM = 64
#: A queue's pop offset and in-flight messages before a change (replicated shards log the difference).
_Logged = tuple[int, dict[int, InFlightEntry]]


@dataclasses.dataclass(slots=True)
class Popped:
    message: StoredMessage
    attempts: int
    version: int
    visible_at_ms: int


@dataclasses.dataclass(slots=True)
class PopResult:
    messages: list[Popped]
    pop_offset: int
    fifo_blocked: bool
    next_visible_ms: int


@dataclasses.dataclass(slots=True, frozen=True)
class Ref:
    """One hand-out of one message (what a receipt handle names)."""

    group: str
    topic: str
    queue_id: int
    offset: int
    version: int

    @property
    def key(self) -> Key:
        return (self.group, self.topic, self.queue_id)


@dataclasses.dataclass(slots=True)
class Claimed:
    ref: Ref
    msg_id: str
    attempts: int
    reconsume_times: int


class PopService:
    def __init__(self, table: PopCheckpointTable, offsets: ConsumerOffsetTable, puller: Puller,
                 queue_offsets: QueueOffsets) -> None:
        self.table = table
        self._offsets = offsets
        self._puller = puller
        self._queue_offsets = queue_offsets
        #: Set on a replicated shard: the offsets pops move go through the log.
        self.offset_log: OffsetLog | None = None

    async def pop(self, group: str, topic: str, queue_id: int, max_messages: int, invisible_ms: int,
                  subscription: str, max_attempts: int) -> PopResult:
        check_group(group)
        check_queue(topic, queue_id)
        _check_bound("max_messages", max_messages, 1, MAX_POP)
        _check_bound("invisible_ms", invisible_ms, 1, MAX_INVISIBLE_MS)
        filtered = parse_subscription(subscription)
        max_attempts = max_attempts or DEFAULT_MAX_ATTEMPTS
        await self._caught_up()
        q = await self._queue(group, topic, queue_id)
        async with q.lock:
            before = (q.pop_offset, len(q.inflight))
            logged = self._logged(q)
            self._follow_offset(group, topic, queue_id, q)
            out: list[Popped] = []
            await self._hand_out_again(topic, queue_id, q, max_messages, invisible_ms, max_attempts, out)
            blocked = False
            if len(out) < max_messages:
                query = PullQuery.checked(topic, queue_id, q.pop_offset, min(max_messages - len(out), PULL_BATCH), 0,
                                          filtered, 0, 0)
                blocked = await self._hand_out_new(query, q, invisible_ms, out)
            await self._settle(group, topic, queue_id, q, logged)
            if out or before != (q.pop_offset, len(q.inflight)):
                self.table.changed()  # an empty look (a waiting consumer's) writes nothing
            return PopResult(out, q.pop_offset, blocked, q.next_visible_ms(max_attempts))

    async def _hand_out_again(self, topic: str, queue_id: int, q: PopQueue, wanted: int, invisible_ms: int,
                              max_attempts: int, out: list[Popped]) -> None:
        """In-flight messages visible again, lowest offset first (those delivered ``max_attempts``
        times wait for ClaimExhausted)."""
        now = now_ms()
        for offset, entry in sorted(q.inflight.items()):
            if len(out) >= wanted:
                break
            if entry.visible_at_ms > now or entry.attempts >= max_attempts:
                continue
            message = await self._read(topic, queue_id, offset)
            if message is None:  # its commitlog file expired: nothing left to deliver
                del q.inflight[offset]
                continue
            entry.attempts += 1
            entry.version = self.table.new_version()
            entry.visible_at_ms = now + invisible_ms
            out.append(Popped(message, entry.attempts, entry.version, entry.visible_at_ms))

    async def _hand_out_new(self, query: PullQuery, q: PopQueue, invisible_ms: int, out: list[Popped]) -> bool:
        """New messages from the pop offset; True when one waits for an earlier one of its group."""
        result = await self._puller.pull(query)
        next_offset = result.next_begin_offset or q.pop_offset
        blocked = False
        visible_at = now_ms() + invisible_ms
        for message in result.messages:
            group_key = message.properties.get(SHARDING_KEY)
            if q.blocked(group_key, message.queue_offset):
                next_offset, blocked = message.queue_offset, True
                break
            version = self.table.new_version()
            q.inflight[message.queue_offset] = InFlight(visible_at, 1, version, group_key)
            out.append(Popped(message, 1, version, visible_at))
        q.pop_offset = max(q.pop_offset, next_offset)
        return blocked

    async def ack(self, ref: Ref) -> int:
        """The group's offset after the ack."""
        await self._caught_up()
        q = self._existing(ref)
        async with q.lock:
            self._entry(ref, q)
            logged = self._logged(q)
            del q.inflight[ref.offset]
            await self._settle(ref.group, ref.topic, ref.queue_id, q, logged)
            self.table.changed()
            return q.committed

    async def change_invisible_time(self, ref: Ref, invisible_ms: int, renew: bool) -> InFlight:
        _check_bound("invisible_ms", invisible_ms, 0, MAX_INVISIBLE_MS)
        await self._caught_up()
        q = self._existing(ref)
        async with q.lock:
            entry = self._entry(ref, q)
            logged = self._logged(q)
            entry.visible_at_ms = now_ms() + invisible_ms
            if not renew:
                entry.version = self.table.new_version()
            await self._settle(ref.group, ref.topic, ref.queue_id, q, logged)
            entry = q.inflight[ref.offset]  # the log's copy, on a replicated shard
            self.table.changed()
            return dataclasses.replace(entry)

    async def claim_exhausted(self, max_attempts: int, claim_ms: int, max_messages: int) -> list[Claimed]:
        """Expired messages delivered ``max_attempts`` times, each made invisible for ``claim_ms`` under
        a new version: the caller dead-letters them and acks them with that version."""
        _check_bound("claim_ms", claim_ms, 1, MAX_INVISIBLE_MS)
        max_attempts = max_attempts or DEFAULT_MAX_ATTEMPTS
        wanted = max_messages or DEFAULT_MAX_CLAIM
        await self._caught_up()
        out: list[Claimed] = []
        for (group, topic, queue_id), q in list(self.table.queues.items()):
            if len(out) >= wanted:
                break
            now = now_ms()
            if not any(e.visible_at_ms <= now and e.attempts >= max_attempts for e in q.inflight.values()):
                continue
            async with q.lock:
                logged = self._logged(q)
                for offset, entry in sorted(q.inflight.items()):
                    if len(out) >= wanted:
                        break
                    if entry.visible_at_ms > now or entry.attempts < max_attempts:
                        continue
                    message = await self._read(topic, queue_id, offset)
                    if message is None:
                        del q.inflight[offset]
                        continue
                    entry.version = self.table.new_version()
                    entry.visible_at_ms = now_ms() + claim_ms
                    out.append(Claimed(Ref(group, topic, queue_id, offset, entry.version), message.msg_id,
                                       entry.attempts, message.reconsume_times))
                await self._settle(group, topic, queue_id, q, logged)
                self.table.changed()
        return out

    # -- state -----------------------------------------------------------------------------------------
    async def _queue(self, group: str, topic: str, queue_id: int) -> PopQueue:
        """The queue's pop state; a group's first pop starts at its committed offset, else at the
        queue's min offset (it sees what was sent before it first received)."""
        key = (group, topic, queue_id)
        q = self.table.queues.get(key)
        if q is not None:
            return q
        start = self._offsets.query(group, topic, queue_id)
        committed = -1 if start is None else start
        if start is None:
            start, _ = await self._queue_offsets.offset_range(topic, queue_id)
        return self.table.queues.setdefault(key, PopQueue(start, committed=committed))

    def _existing(self, ref: Ref) -> PopQueue:
        check_group(ref.group)
        check_queue(ref.topic, ref.queue_id)
        q = self.table.queues.get(ref.key)
        if q is None:
            raise NotFoundError(f"group {ref.group!r} has popped nothing from {ref.topic}/{ref.queue_id}")
        return q

    @staticmethod
    def _entry(ref: Ref, q: PopQueue) -> InFlight:
        entry = q.inflight.get(ref.offset)
        if entry is None:
            raise NotFoundError(f"the message at offset {ref.offset} of {ref.topic}/{ref.queue_id} is not in flight "
                                f"for group {ref.group!r}: acked already (or its queue's offset was reset)")
        if entry.version != ref.version:
            raise FailedPreconditionError(f"version {ref.version} of the message at offset {ref.offset} of "
                                          f"{ref.topic}/{ref.queue_id} is an earlier hand-out: it was delivered "
                                          "again since; use the newest receipt")
        return entry

    def _follow_offset(self, group: str, topic: str, queue_id: int, q: PopQueue) -> None:
        """An offset committed through mqstore.v1 (a reset) moves the pop state to it."""
        stored = self._offsets.query(group, topic, queue_id)
        if stored is None or q.committed < 0 or stored == q.committed:
            return
        log.info("group %s's offset of %s/%d was set to %d outside pop consumption: its %d messages in flight "
                 "are forgotten and popping goes on from there", group, topic, queue_id, stored, len(q.inflight))
        q.inflight.clear()
        q.pop_offset = q.committed = stored

    async def _caught_up(self) -> None:
        """On a replicated shard, before a call reads the pop state: every record this replica's log holds
        is applied (a follower just promoted may still be applying its predecessor's last changes, and a
        change made on an older state would be logged as a difference from it)."""
        if self.offset_log is not None:
            await self.offset_log.caught_up()

    def _logged(self, q: PopQueue) -> _Logged | None:
        """On a replicated shard, the queue's state before a change (what :meth:`_settle` logs the
        difference from); None otherwise."""
        return None if self.offset_log is None else (q.pop_offset, inflight_entries(q))

    async def _settle(self, group: str, topic: str, queue_id: int, q: PopQueue, before: _Logged | None) -> None:
        """Under the queue's lock, after a change: the group's offset (the lowest in flight) goes into the
        consumer offsets. On a replicated shard the change goes through the log instead (offset_log.py),
        with the messages it handed out, changed or removed: both tables have it once this returns, so a
        pop's ``_follow_offset`` never takes the offset for a reset, and a new leader knows what is in
        flight."""
        lowest = q.lowest
        if self.offset_log is None or before is None:
            if lowest != q.committed:
                self._offsets.commit(group, topic, queue_id, lowest)
                q.committed = lowest
            return
        pop_offset, entries = before
        after = inflight_entries(q)
        changed = {o: e for o, e in after.items() if entries.get(o) != e}
        removed = tuple(o for o in entries if o not in after)
        if changed or removed or lowest != q.committed or q.pop_offset != pop_offset:
            await self.offset_log.commit(PopChange(group, topic, queue_id, q.pop_offset, lowest, changed, removed))
            q.committed = lowest

    async def _read(self, topic: str, queue_id: int, offset: int) -> StoredMessage | None:
        """The message at ``offset``, or None when it is no longer stored."""
        query = PullQuery.checked(topic, queue_id, offset, 1, 0, parse_subscription("*"), 0, 0)
        result = await self._puller.pull(query)
        if result.status != GetMessageStatus.FOUND or not result.messages:
            return None
        message = result.messages[0]
        return message if message.queue_offset == offset else None


def _check_bound(name: str, value: int, low: int, high: int) -> None:
    if not low <= value <= high:
        raise InvalidArgumentError(f"{name} {value} is not within {low}..{high}")
