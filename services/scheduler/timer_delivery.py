"""Timer delivery: RocketMQ 5's TimerMessageStore for messages parked in rmq_sys_wheel_timer.

Two steps in one loop (one asyncio task, so they never interleave):

* take in: rmq_sys_wheel_timer queue 0 is read from the enqueue offset up to the indexer's published
  max; each record's TIMER_OUT_MS (its deliver time) files a unit under its second in the timer store
  (services/store/formats/timer_files.py), or under the second being delivered when that time has passed;
* deliver: the second being delivered (``delivered_second``) has its units re-put (timer_timeup) once
  their deliver ms has come; the second is done once it has ended and all its units are acknowledged.

The checkpoint (enqueue offset, timerlog length, delivered second, the units of that second or later
already delivered, and ``scanFromOffset``) is written every persist interval, at stop, and also at once
after the first acknowledged batch of a run and after every ``PERSIST_EVERY_UNITS`` deliveries, after
the timer files are fsynced. Nothing is lost: a unit leaves the store only by its second being passed,
which happens after its delivery was acknowledged. Nothing is repeated, after kill -9 either: before
its first delivery a run takes in what the queue holds and marks done the units whose re-puts the log
holds past ``scanFromOffset`` (:meth:`TimerScheduler._reconcile`).
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import time
from collections import Counter
from collections.abc import Iterable
from contextlib import suppress
from functools import cached_property, partial
from operator import attrgetter
from pathlib import Path

import grpc

from services.scheduler import metrics
from services.scheduler.delivery_loop import RETRY_S, DeliveryLoop, DeliveryMetrics, now_ms, written_at_ms
from services.scheduler.peers import CommitLogPeer, IndexerPeer
from services.scheduler.store_reader import ScheduleFiles
from services.scheduler.timeup import NotDeliverable, ReputKey, reput_key, timer_timeup
from services.store.formats.message import Message
from services.store.formats.parked_record import ParkedRecord
from services.store.formats.timer_files import CHECK_NAME, UNIT_SIZE, TimerFiles, TimerUnit
from services.store.rules.timer_message import (
    PROPERTY_TIMER_DEQUEUE_MS,
    PROPERTY_TIMER_OUT_MS,
    TIMER_QUEUE_ID,
    TIMER_TOPIC,
)

log = logging.getLogger(__name__)

POLL_S = 1.0
MAX_BATCH = 256
#: units taken in per round before delivering (a backlog does not hold deliveries up)
ENQUEUE_PER_ROUND = 4096

_deliver_ms = attrgetter("deliver_ms")


def wheel_slots(max_delay_sec: int) -> int:
    """Slots of a new timer store: twice the horizon (plus a minute), so a second within the horizon
    of the delivered second never meets a slot still holding an undelivered one."""
    return 2 * max_delay_sec + 60


class TimerScheduler(DeliveryLoop):
    TASK_NAMES = ("deliver-timers", "watch-timer-arrivals", "persist-timer-checkpoint")

    def __init__(self, store: Path, files: ScheduleFiles, indexer: IndexerPeer, commitlog: CommitLogPeer,
                 persist_interval_s: float, max_delay_sec: int) -> None:
        super().__init__(files, indexer, commitlog, persist_interval_s, "the timer checkpoint", log)
        self._store = store
        self._max_delay_sec = max_delay_sec
        self._timer: TimerFiles | None = None
        self.enqueue_offset = 0
        self.delivered_second = 0
        self._max_offset = 0
        self._min_offset = 0
        #: the undelivered units of delivered_second by deliver time (loaded once per second; None: not
        #: loaded), and the timerlog positions of the units of that second or later delivered (with
        #: their second: later ones are found in the log after a kill -9)
        self._current: list[tuple[int, int, TimerUnit]] | None = None
        self._done: dict[int, int] = {}

    @property
    def timer(self) -> TimerFiles:
        assert self._timer is not None, "load() first"
        return self._timer

    def load(self) -> None:
        """Open and recover the timer store (ValueError when it is unreadable)."""
        self._timer = TimerFiles.open(self._store, wheel_slots(self._max_delay_sec))
        if self._timer.slots < self._max_delay_sec + 60:
            log.warning("the timer store has %d wheel slots, fewer than timerMaxDelaySec (%d s) needs: a timer "
                        "further ahead than that holds back the ones sent after it until its time is near "
                        "(resizing %s/timer is not built: keep timerMaxDelaySec within about twice its first "
                        "value)", self._timer.slots, self._max_delay_sec, self._store)
        check = self._timer.checkpoint
        self.enqueue_offset = check.enqueue_offset
        self.delivered_second = check.delivered_second or now_ms() // 1000
        timer = self._timer
        self._done = {p: timer.unit(p).second for p in check.done_positions if p + UNIT_SIZE <= timer.log_end}
        self._scan_from = check.scan_from
        self._written_at_ms = written_at_ms(timer.directory / CHECK_NAME)

    def _snapshot(self) -> partial[None]:
        """Checkpoint what the loop has done so far. The state is taken here, in the loop's thread; the
        fsyncs and the write run in a worker thread (units taken in meanwhile lie past the recorded
        timerlog length: recovery undoes them and they are taken in again)."""
        timer = self.timer
        timer.flush_writes()
        return partial(timer.save, self.enqueue_offset, self.delivered_second, sorted(self._done), timer.log_end,
                       self._scan_from)

    @cached_property
    def _metrics(self) -> DeliveryMetrics:
        """The timer metric children, looked up once (on first use)."""
        return DeliveryMetrics.of("timer", "")

    # -- running -------------------------------------------------------------------------------
    async def stop(self) -> None:
        """Finish the round in flight, write the checkpoint, close the timer store."""
        await super().stop()
        if self._timer is not None:
            self._timer.close()
            self._timer = None

    def _arrived(self, topic: str, queue_id: int, max_offset: int) -> bool:
        if topic == TIMER_TOPIC and queue_id == TIMER_QUEUE_ID and max_offset > self._max_offset:
            self._max_offset = max_offset
            return True
        return False

    async def _refresh_bounds(self) -> None:
        offsets = await self._indexer.queue_offsets(TIMER_TOPIC, TIMER_QUEUE_ID)
        if offsets is None:
            return
        self._min_offset, self._max_offset = offsets
        if self.enqueue_offset > self._max_offset:  # the indexer may still be rebuilding units: ask once it caught up
            self._min_offset, self._max_offset = await self._offsets_after_dispatch(TIMER_TOPIC, TIMER_QUEUE_ID) \
                or offsets
        if self.enqueue_offset < self._min_offset:
            log.warning("timers: enqueue offset %d is below the queue's min offset %d: skipping to it",
                        self.enqueue_offset, self._min_offset)
            self.enqueue_offset, self._dirty = self._min_offset, True
        elif self.enqueue_offset > self._max_offset:
            log.warning("timers: enqueue offset %d is past the queue's max offset %d: going back to it",
                        self.enqueue_offset, self._max_offset)
            self.enqueue_offset, self._dirty = self._max_offset, True

    async def _deliver_loop(self) -> None:
        last_refresh = 0.0
        while not self._stopping:
            self._wake.clear()
            wait_s = POLL_S
            try:
                if time.monotonic() - last_refresh >= POLL_S:
                    await self._refresh_bounds()
                    last_refresh = time.monotonic()
                if not self._recovered:
                    await self._recover()
                if self._enqueue():
                    self._wake.set()  # more to take in: another round at once
                wait_s = min(wait_s, await self._deliver())
            except grpc.aio.AioRpcError as exc:
                log.warning("timers: %s: %s; retrying in %.1fs", exc.code().name, exc.details(), RETRY_S)
                wait_s = RETRY_S
            if self._stopping:
                break
            with suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), max(0.0, wait_s))

    # -- take in -------------------------------------------------------------------------------
    def _enqueue(self) -> bool:
        """Take in units up to the published max; True when more remain for the next round."""
        try:
            return self._enqueue_round()
        finally:
            self.timer.flush_writes()

    def _enqueue_round(self) -> bool:
        timer = self.timer
        scheduled = metrics.SCHEDULED.labels(kind="timer")
        enqueue_ms = now_ms()
        for _ in range(ENQUEUE_PER_ROUND):
            offset = self.enqueue_offset
            if offset >= self._max_offset:
                return False
            unit = self._files.unit(TIMER_QUEUE_ID, offset, TIMER_TOPIC)
            if unit is None:
                return False
            deliver = self._deliver_ms_of(unit.commitlog_offset, offset) if unit.valid else None
            if deliver is not None:
                second = max(deliver // 1000, self.delivered_second)
                if second - self.delivered_second >= timer.slots:
                    return False  # the wheel's far side still holds undelivered seconds: wait for them
                filed = timer.append(second, deliver, enqueue_ms, unit.commitlog_offset, unit.size, offset)
                scheduled.inc()
                if second == self.delivered_second and self._current is not None:
                    heapq.heappush(self._current, (filed.deliver_ms, filed.position, filed))
            else:
                self._metrics.skipped.inc()
            self.enqueue_offset, self._dirty = offset + 1, True
        return True

    def _deliver_ms_of(self, commitlog_offset: int, queue_offset: int) -> int | None:
        found, deliver = self._files.timer_out_ms(commitlog_offset)
        if not found:
            log.warning("timers: the record of unit %d (commitlog offset %d) is gone: passed over", queue_offset,
                        commitlog_offset)
        elif deliver is None:
            log.error("timers: unit %d (commitlog offset %d) has no usable %s: passed over", queue_offset,
                      commitlog_offset, PROPERTY_TIMER_OUT_MS)
        return deliver

    # -- the re-puts past the checkpoint --------------------------------------------------------
    def _reconcile(self, reputs: Iterable[ParkedRecord]) -> tuple[int, int]:
        """Take in up to the published max (the units the checkpoint's timerlog length left out come
        back), then mark done the units whose re-puts are among ``reputs``: those of the seconds from
        the delivered one up to the last re-put's TIMER_DEQUEUE_MS (a unit is re-put only within or
        after its second)."""
        pending: Counter[ReputKey] = Counter()
        last_second = 0
        for record in reputs:
            if PROPERTY_TIMER_OUT_MS in record.properties:
                pending[reput_key(record)] += 1
                last_second = max(last_second, _dequeue_second(record))
        total = pending.total()
        if not total:
            return 0, 0
        while self._enqueue():
            pass
        found, second = 0, self.delivered_second
        while pending and second <= last_second:
            for unit in self.timer.units_of(second):
                parked = None if unit.position in self._done else self._files.parked(unit.commitlog_offset)
                key = None if parked is None else reput_key(parked)
                if key is not None and pending[key] > 0:
                    pending[key] -= 1
                    if not pending[key]:
                        del pending[key]
                    self._done[unit.position], self._dirty, found = second, True, found + 1
            second += 1
        if pending:
            log.warning("timers: %d re-puts past the checkpoint match no unit of seconds %d..%d", pending.total(),
                        self.delivered_second, last_second)
        return total, found

    # -- deliver -------------------------------------------------------------------------------
    async def _deliver(self) -> float:
        """Deliver what is due; the seconds until something may be due next."""
        timer = self.timer
        passed = 0
        while not self._stopping:
            second = self.delivered_second
            if self._current is None:
                self._current = [(u.deliver_ms, u.position, u) for u in timer.units_of(second)
                                 if u.position not in self._done]
                heapq.heapify(self._current)
            pending = self._current
            now = now_ms()
            while pending and pending[0][0] <= now:
                batch: list[TimerUnit] = []
                while pending and pending[0][0] <= now and len(batch) < MAX_BATCH:
                    batch.append(heapq.heappop(pending)[2])
                if not await self._append(second, batch):
                    for unit in batch:  # tried again next round (those stored are in _done)
                        if unit.position not in self._done:
                            heapq.heappush(pending, (unit.deliver_ms, unit.position, unit))
                    return RETRY_S
            if pending:
                return max(0.0, (pending[0][0] - now_ms()) / 1000)
            if now_ms() < (second + 1) * 1000:
                return ((second + 1) * 1000 - now_ms()) / 1000
            self.delivered_second, self._current, self._dirty = second + 1, None, True
            if self._done:
                self._done = {p: s for p, s in self._done.items() if s > second}
            passed += 1
            if passed % 1000 == 0:  # catching up on a long stop: let the rest of the loop run
                await asyncio.sleep(0)
        return 0.0

    async def _append(self, second: int, units: list[TimerUnit]) -> bool:
        """Re-put ``units`` (all due); False when the rest must be tried again."""
        batch: list[tuple[TimerUnit, Message]] = []
        dequeue = now_ms()
        seen = self._metrics.seen
        for unit in units:
            seen.inc()
            record = self._files.parked(unit.commitlog_offset)
            message = None
            if record is None:
                log.warning("timers: the record at commitlog offset %d is gone: passed over", unit.commitlog_offset)
            else:
                try:
                    message = timer_timeup(record, unit.enqueue_ms, dequeue)
                except NotDeliverable as exc:
                    log.error("timers: %s: passed over", exc)
            if message is None:
                self._metrics.skipped.inc()
                self._done[unit.position] = unit.second
                self._dirty = True
            else:
                batch.append((unit, message))
        if not batch:
            return True

        def passed(unit: TimerUnit) -> None:
            self._done[unit.position] = unit.second

        return await self._append_batch(batch, self._metrics, "timers", {"kind": "timer", "second": second},
                                        _deliver_ms, _message_name, passed)


def _dequeue_second(record: ParkedRecord) -> int:
    """The second a timer re-put was made in (its TIMER_DEQUEUE_MS; now for one without)."""
    try:
        return int(record.properties[PROPERTY_TIMER_DEQUEUE_MS]) // 1000
    except (KeyError, ValueError):
        return now_ms() // 1000


def _message_name(unit: TimerUnit) -> str:
    return f"the message at commitlog offset {unit.commitlog_offset}"
