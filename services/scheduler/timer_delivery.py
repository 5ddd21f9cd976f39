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

On a replicated shard the scheduler moves with the leadership, and the checkpoint names positions in
its replica's own timer store, which no other replica has. So each checkpoint also goes to the log
(``replicated_state.py``) in the log's terms: the enqueue queue offset, the delivered second, the
commitlog offsets of the done units and ``scanFromOffset`` (:class:`TimerProgress`). A run that finds
in its replica's log a copy newer than its own checkpoint (a fresh replica, or one another leader
went on from) rebuilds its timer store from the queue: units taken in before the copy whose second
had passed were delivered and are passed over, the done ones are marked done, and the re-puts past
the copy's ``scanFromOffset`` are counted as a kill -9's are. So a timer delivered before a failover
is not delivered again, and one due is delivered once.
"""

from __future__ import annotations

import asyncio
import heapq
import json
import logging
import time
from collections import Counter
from collections.abc import Iterable
from contextlib import suppress
from dataclasses import dataclass
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
from services.store.formats.timer_files import CHECK_NAME, TIMER_DIR, UNIT_SIZE, TimerFiles, TimerUnit
from services.store.rules.timer_message import (
    PROPERTY_TIMER_DEQUEUE_MS,
    PROPERTY_TIMER_OUT_MS,
    TIMER_QUEUE_ID,
    TIMER_TOPIC,
)
from services.store.store_root import remove_durably

log = logging.getLogger(__name__)

POLL_S = 1.0
MAX_BATCH = 256
#: units taken in per round before delivering (a backlog does not hold deliveries up)
ENQUEUE_PER_ROUND = 4096

_deliver_ms = attrgetter("deliver_ms")


#: The name of the timer progress among a replicated shard's state files (metadata_log.StateFileChange).
PROGRESS_NAME = "timerProgress.json"


@dataclass(frozen=True, slots=True)
class TimerProgress:
    """A timer checkpoint in the log's terms, which every replica of the shard can read."""

    #: units of rmq_sys_wheel_timer before it were taken in before ``delivered_second`` began: those
    #: whose own second is earlier were filed under a passed second, so they were delivered
    enqueue_offset: int
    delivered_second: int  # every unit filed under an earlier second was delivered
    done: frozenset[int]  # the commitlog offsets of the parked records of the later units delivered
    scan_from: int | None  # re-puts past it are not counted in ``done``

    def to_json(self) -> bytes:
        return json.dumps({"enqueueOffset": self.enqueue_offset, "deliveredSecond": self.delivered_second,
                           "done": sorted(self.done), "scanFromOffset": self.scan_from}).encode()

    @classmethod
    def parse(cls, data: bytes) -> TimerProgress:
        doc = json.loads(data)
        scan_from = doc.get("scanFromOffset")
        return cls(int(doc["enqueueOffset"]), int(doc["deliveredSecond"]), frozenset(int(o) for o in doc["done"]),
                   None if scan_from is None else int(scan_from))


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
        #: After a rebuild from the log's copy, until the copy's second has passed: that copy.
        self._adopted: TimerProgress | None = None
        #: the enqueue offset when delivered_second began (TimerProgress.enqueue_offset)
        self._second_enqueue_offset = 0

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
        self._second_enqueue_offset = check.second_enqueue_offset
        self._written_at_ms = written_at_ms(timer.directory / CHECK_NAME)

    def _snapshot(self) -> partial[None]:
        """Checkpoint what the loop has done so far. The state is taken here, in the loop's thread; the
        fsyncs and the write run in a worker thread (units taken in meanwhile lie past the recorded
        timerlog length: recovery undoes them and they are taken in again)."""
        timer = self.timer
        timer.flush_writes()
        if self.replicated is not None:
            done = frozenset(timer.unit(p).commitlog_offset for p in self._done)
            self._document = TimerProgress(self._second_enqueue_offset, self.delivered_second, done,
                                           self._scan_from).to_json()
        return partial(timer.save, self.enqueue_offset, self.delivered_second, sorted(self._done), timer.log_end,
                       self._scan_from, self._second_enqueue_offset)

    async def _adopt_replicated(self) -> None:
        """Rebuild the timer store from the log's newest copy of the progress when this replica's own
        checkpoint is older (its scan offset is behind the copy's, or it has none)."""
        latest = await self._replicated_copy()
        if latest is None:
            return
        content, stored_ms = latest
        try:
            progress = TimerProgress.parse(content)
        except (ValueError, KeyError, TypeError) as exc:
            log.error("timers: the log's newest copy of %s does not read (%s): starting from this replica's "
                      "checkpoint", PROGRESS_NAME, exc)
            return
        if self._scan_from is not None and progress.scan_from is not None and self._scan_from >= progress.scan_from:
            return  # this replica wrote it, or went on from it
        log.warning("timers: the log's copy of the progress (stored at %d: enqueue offset %d, second %d, %d units "
                    "done, re-puts looked for from %s) is newer than this replica's checkpoint: rebuilding the "
                    "timer store from the queue", stored_ms, progress.enqueue_offset, progress.delivered_second,
                    len(progress.done), progress.scan_from)
        self.timer.close()
        for name in (CHECK_NAME, CHECK_NAME + ".bak"):
            path = self._store / TIMER_DIR / name
            if path.exists():
                remove_durably(path)
        self._timer = TimerFiles.open(self._store, wheel_slots(self._max_delay_sec))
        await self._refresh_bounds()
        self.enqueue_offset, self.delivered_second = self._min_offset, progress.delivered_second
        self._done, self._current, self._scan_from = {}, None, progress.scan_from
        self._second_enqueue_offset = progress.enqueue_offset
        self._written_at_ms, self._adopted, self._dirty = stored_ms, progress, True

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
            adopted = self._adopted
            if adopted is not None and offset < adopted.enqueue_offset and deliver is not None \
                    and deliver // 1000 < adopted.delivered_second:
                pass  # the copy's writer filed it under a second that passed: delivered
            elif deliver is not None:
                second = max(deliver // 1000, self.delivered_second)
                if second - self.delivered_second >= timer.slots:
                    return False  # the wheel's far side still holds undelivered seconds: wait for them
                filed = timer.append(second, deliver, enqueue_ms, unit.commitlog_offset, unit.size, offset)
                scheduled.inc()
                if adopted is not None and unit.commitlog_offset in adopted.done:
                    self._done[filed.position] = second  # delivered by the copy's writer
                elif second == self.delivered_second and self._current is not None:
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
            self._second_enqueue_offset = self.enqueue_offset
            if self._adopted is not None and second >= self._adopted.delivered_second:
                self._adopted = None  # its done units were all of that second
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
