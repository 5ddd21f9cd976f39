"""The delivery loop: RocketMQ 4.9.8's DeliverDelayedMessageTimerTask for every delay level at once.

Per level ``n`` the loop walks SCHEDULE_TOPIC_XXXX queue ``n-1`` from its offset in the table. Units
are in store order, so deliver times within a level only grow: the first unit not yet due stops the
level until then. Due units are re-put (:func:`message_timeup`) in one AppendBatch of at most
``MAX_BATCH`` per level and round, the levels in turn (as 4.9.8 runs one timer task per level): a
level that is behind holds the others up for one batch at a time, not until it has caught up.
The level's offset moves past a unit only once the store acknowledged it, so a crash never loses a
delivery.

The table is written every persist interval, at stop, and also at once after the first acknowledged
batch of a run and after every ``PERSIST_EVERY_UNITS`` deliveries, with ``scanFromOffset``. A restart
after kill -9 repeats nothing: before its first delivery it reads the re-puts the log holds past that
offset and moves each level past the units they came from (:meth:`DelayScheduler._reconcile`; a
level's re-puts are in unit order, so a level is walked from its offset while its units' re-puts are
found, stepping over the units 4.9.8 passes over).

The loop sleeps until the earliest known deliver time, a new SCHEDULE_TOPIC_XXXX unit (the indexer's
WatchArrivals), or ``POLL_S`` (max offsets are asked again then: the stream may be down).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Iterable
from contextlib import suppress
from dataclasses import dataclass
from functools import partial
from operator import attrgetter
from pathlib import Path

import grpc

from services.scheduler.delivery_loop import RETRY_S, DeliveryLoop, DeliveryMetrics, now_ms, written_at_ms
from services.scheduler.peers import CommitLogPeer, IndexerPeer
from services.scheduler.store_reader import ScheduledUnit, ScheduleFiles
from services.scheduler.timeup import NotDeliverable, ReputKey, message_timeup, reput_key
from services.store.formats.delay_offsets_file import (
    DelayOffsetTable,
    DelayProgress,
    delay_progress_bytes,
    parse_delay_progress,
    read_delay_progress,
)
from services.store.formats.message import (
    PROPERTY_DELAY_TIME_LEVEL,
    SCHEDULE_TOPIC,
    Message,
)
from services.store.formats.parked_record import ParkedRecord
from services.store.formats.record import real_destination
from services.store.rules.timer_message import PROPERTY_TIMER_OUT_MS
from services.store.store_root import write_atomically

log = logging.getLogger(__name__)

#: RocketMQ's DELAY_FOR_A_WHILE is 100 ms between rounds; here a round starts at the earliest due
#: time or arrival, and the max offsets are asked again at least this often.
POLL_S = 1.0
MAX_BATCH = 256

_deliver_at = attrgetter("deliver_at")


@dataclass(slots=True)
class _Level:
    level: int
    offset: int
    #: the published max offset of the level's queue (units below it are readable)
    max_offset: int = 0
    min_offset: int = 0

    @property
    def queue_id(self) -> int:
        return self.level - 1


class DelayScheduler(DeliveryLoop):
    TASK_NAMES = ("deliver-delayed", "watch-schedule-arrivals", "persist-delay-offsets")

    def __init__(self, delay_levels_ms: tuple[int, ...], offsets_path: Path, files: ScheduleFiles,
                 indexer: IndexerPeer, commitlog: CommitLogPeer, persist_interval_s: float) -> None:
        super().__init__(files, indexer, commitlog, persist_interval_s, str(offsets_path), log)
        self.delay_levels_ms = delay_levels_ms
        self.offsets_path = offsets_path
        self._levels: list[_Level] = []
        self._queues: dict[int, _Level] = {}
        self._level_counters: dict[int, DeliveryMetrics] = {}

    # -- the table -----------------------------------------------------------------------------
    def load(self) -> None:
        """Read delayOffset.json (ValueError when it and its .bak are unreadable)."""
        self._take(read_delay_progress(self.offsets_path), written_at_ms(self.offsets_path))

    def _take(self, progress: DelayProgress, written_at: int | None) -> None:
        table, self._scan_from = progress
        self._written_at_ms = written_at
        self._levels = [_Level(level, table.get(level, 0)) for level in range(1, len(self.delay_levels_ms) + 1)]
        kept = {level: offset for level, offset in table.items() if level > len(self.delay_levels_ms)}
        if kept:
            log.warning("delayOffset.json has levels %s beyond messageDelayLevel: kept in the file, not delivered",
                        sorted(kept))
        self._beyond = kept
        self._queues = {lv.queue_id: lv for lv in self._levels}

    def table(self) -> DelayOffsetTable:
        return {**self._beyond, **{lv.level: lv.offset for lv in self._levels}}

    def _snapshot(self) -> partial[None]:
        self._document = delay_progress_bytes(self.table(), self._scan_from)
        return partial(write_atomically, self.offsets_path, self._document, keep_backup=True)

    async def _adopt_replicated(self) -> None:
        """Start from the newest copy of the file in this replica's log (replicated_state.py)."""
        latest = await self._replicated_copy()
        if latest is None:
            log.info("the log holds no copy of %s: starting from this replica's file", self.offsets_path.name)
            return
        content, stored_ms = latest
        try:
            progress = parse_delay_progress(content)
        except ValueError as exc:
            log.error("the log's newest copy of %s does not read (%s): starting from this replica's file",
                      self.offsets_path.name, exc)
            return
        self._take(progress, stored_ms)
        self._dirty = True
        await self._refresh_bounds()
        log.info("delay progress taken from the log's copy of %s stored at %d: %s, re-puts looked for from %s",
                 self.offsets_path.name, stored_ms, dict(progress.table), progress.scan_from)

    def _arrived(self, topic: str, queue_id: int, max_offset: int) -> bool:
        level = self._queues.get(queue_id) if topic == SCHEDULE_TOPIC else None
        if level is not None and max_offset > level.max_offset:
            level.max_offset = max_offset
            return True
        return False

    # -- running -------------------------------------------------------------------------------
    async def _refresh_bounds(self) -> None:
        for lv in self._levels:
            offsets = await self._indexer.queue_offsets(SCHEDULE_TOPIC, lv.queue_id)
            if offsets is None:
                continue
            lv.min_offset, lv.max_offset = offsets
            if lv.offset > lv.max_offset:  # the indexer may still be rebuilding units: ask once it caught up
                lv.min_offset, lv.max_offset = await self._offsets_after_dispatch(SCHEDULE_TOPIC, lv.queue_id) \
                    or offsets
            if lv.offset < lv.min_offset:  # the units were deleted with their commitlog files
                log.warning("delay level %d: offset %d is below the queue's min offset %d: skipping to it",
                            lv.level, lv.offset, lv.min_offset)
                lv.offset, self._dirty = lv.min_offset, True
            elif lv.offset > lv.max_offset:  # the indexer truncated past it (RocketMQ's correctDeliverOffset)
                log.warning("delay level %d: offset %d is past the queue's max offset %d: going back to it",
                            lv.level, lv.offset, lv.max_offset)
                lv.offset, self._dirty = lv.max_offset, True

    async def _deliver_loop(self) -> None:
        last_refresh = 0.0
        while not self._stopping:
            wait_s = POLL_S
            self._wake.clear()  # before the round: an arrival during it wakes the next one at once
            try:
                if time.monotonic() - last_refresh >= POLL_S:
                    await self._refresh_bounds()
                    last_refresh = time.monotonic()
                if not self._recovered:
                    await self._recover()
                elif self._unanswered:
                    await self._reconcile_unanswered()
                for lv in self._levels:
                    if self._stopping:
                        break
                    next_due = await self._deliver_level(lv)
                    if next_due is not None:
                        wait_s = min(wait_s, max(0.0, (next_due - now_ms()) / 1000))
            except grpc.aio.AioRpcError as exc:
                log.warning("scheduler: %s: %s; retrying in %.1fs", exc.code().name, exc.details(), RETRY_S)
                wait_s = RETRY_S
            if self._stopping:
                break
            if wait_s <= 0:  # a level has more due: the next round at once (other tasks run first)
                await asyncio.sleep(0)
                continue
            with suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), wait_s)

    async def _deliver_level(self, lv: _Level) -> int | None:
        """Deliver one batch of the level's due units; the next deliver time (ms), 0 for "more are due
        now" (the loop comes back to the level after one batch of every other level), or None."""
        delay_ms = self.delay_levels_ms[lv.level - 1]
        now = now_ms()
        batch: list[tuple[ScheduledUnit, Message]] = []
        offset = lv.offset
        next_due: int | None = None
        counters = self._counters(lv.level)
        while offset < lv.max_offset and len(batch) < MAX_BATCH:
            unit = self._files.unit(lv.queue_id, offset)
            if unit is None:
                break
            if unit.valid and unit.deliver_at > now:
                if unit.deliver_at <= now + delay_ms:
                    next_due = unit.deliver_at
                    break
                # 4.9.8's correctDeliverTimestamp: a deliver time further off than the level's delay
                # (the clock went back, or the levels changed) is due now.
                unit = unit._replace(deliver_at=now)
            message = self._message_of(lv, unit, counters)
            if message is not None:
                batch.append((unit, message))
            elif not batch:  # passed over: move on at once (after a batch: once the batch is stored)
                lv.offset, self._dirty = offset + 1, True
            offset += 1
        if not batch:
            return next_due
        if not await self._append(lv, batch, offset):
            return now_ms() + int(RETRY_S * 1000)
        if next_due is not None or lv.offset >= lv.max_offset:
            return next_due
        return 0

    def _reconcile(self, reputs: Iterable[ParkedRecord]) -> tuple[int, int]:
        pending = Counter(reput_key(r) for r in reputs
                          if PROPERTY_DELAY_TIME_LEVEL in r.properties and PROPERTY_TIMER_OUT_MS not in r.properties)
        total, found = pending.total(), 0
        for lv in self._levels:
            if not pending:
                break
            found += self._reconcile_level(lv, pending)
        if pending:
            log.warning("%d delay-level re-puts past %s's last write match no unit due from the levels' offsets",
                        pending.total(), self.offsets_path)
        return total, found

    def _reconcile_level(self, lv: _Level, pending: Counter[ReputKey]) -> int:
        """Move the level past its units whose re-puts are ``pending`` (taking them out): from its offset,
        up to the first unit that would be re-put and has none there (or is not due yet). The units the
        loop passes over (not valid, record gone, no REAL_TOPIC) are stepped over, as they were."""
        delay_ms, now = self.delay_levels_ms[lv.level - 1], now_ms()
        found, offset = 0, lv.offset
        while pending and offset < lv.max_offset:
            unit = self._files.unit(lv.queue_id, offset)
            if unit is None or unit.valid and now < unit.deliver_at <= now + delay_ms:
                break
            record = self._files.parked(unit.commitlog_offset) if unit.valid else None
            if record is not None:
                key = reput_key(record)
                if pending[key] > 0:
                    pending[key] -= 1
                    if not pending[key]:
                        del pending[key]
                    found, lv.offset, self._dirty = found + 1, offset + 1, True
                elif _deliverable(record):
                    break  # re-put by no run yet: the killed run got no further on this level
            offset += 1
        if found:
            log.info("delay level %d: %d units re-put after the last write of %s: moved to offset %d", lv.level,
                     found, self.offsets_path, lv.offset)
        return found

    def _counters(self, level: int) -> DeliveryMetrics:
        """The level's metric children, looked up once (on its first round)."""
        counters = self._level_counters.get(level)
        if counters is None:
            counters = self._level_counters[level] = DeliveryMetrics.of("level", str(level))
        return counters

    def _message_of(self, lv: _Level, unit: ScheduledUnit, counters: DeliveryMetrics) -> Message | None:
        """The re-put message of a due unit; None (logged, counted) for one that cannot be delivered."""
        counters.seen.inc()
        if not unit.valid:
            log.warning("delay level %d: unit %d is not valid (%d, %d): passed over", lv.level, unit.queue_offset,
                        unit.commitlog_offset, unit.size)
        else:
            record = self._files.parked(unit.commitlog_offset)
            if record is None:
                log.warning("delay level %d: the record of unit %d (commitlog offset %d) is gone: passed over",
                            lv.level, unit.queue_offset, unit.commitlog_offset)
            else:
                try:
                    return message_timeup(record)
                except NotDeliverable as exc:
                    log.error("delay level %d: %s: passed over", lv.level, exc)
        counters.skipped.inc()
        return None

    async def _append(self, lv: _Level, batch: list[tuple[ScheduledUnit, Message]], end: int) -> bool:
        """Append ``batch`` (read from the units below ``end``); the level's offset moves past every unit
        stored (or refused for good), to ``end`` when all were. False when the rest must be tried again."""
        def passed(unit: ScheduledUnit) -> None:
            lv.offset = unit.queue_offset + 1

        if not await self._append_batch(batch, self._counters(lv.level), f"delay level {lv.level}",
                                        {"kind": "level", "level": lv.level,
                                         "first_queue_offset": batch[0][0].queue_offset},
                                        _deliver_at, _unit_name, passed):
            return False
        lv.offset = end  # units passed over after the last of the batch
        return True


def _deliverable(record: ParkedRecord) -> bool:
    """Whether the re-put of ``record`` goes to the store (else it is passed over: NotDeliverable)."""
    try:
        real_destination(record.properties)
    except ValueError:
        return False
    return True


def _unit_name(unit: ScheduledUnit) -> str:
    return f"unit {unit.queue_offset}"
