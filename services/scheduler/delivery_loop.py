"""What the delay-level and the timer schedulers share: three tasks, the persisted state, the accounting
of a re-put batch.

Both re-put due messages with AppendBatch and record how far they got in a state file (delayOffset.json,
the timer checkpoint). So that a crash repeats few deliveries and loses none, both follow the same rules,
kept here in one place:

* the state is taken in the event loop's thread and written in a worker thread; the write is shielded
  so that ``stop`` can wait for one under way (two writes at once would race on the file), and a failed
  write leaves the state dirty with its deliveries still counted as unwritten;
* it is written every persist interval when dirty, at stop, and at once after the first acknowledged
  batch of a run and after every ``PERSIST_EVERY_UNITS`` deliveries (without the early write a crash
  loop repeated the whole backlog on every restart);
* a unit is marked done only once the store acknowledged it (or refused it for good), in batch order;
  the first one to be tried again ends the batch;
* the state carries a commitlog offset, ``scan_from``, at or below every re-put it does not count: the
  end of the last acknowledged re-put, or the log's end when none is in flight and the last call was
  answered (a failed call may have been written: a restart must still find it), moved up every
  persist interval so that the stretch stays short while nothing is delivered. Before its first
  delivery a run reads the re-puts in the log from there to the end (:meth:`ScheduleFiles.reputs`)
  and counts the units they came from as delivered (:meth:`DeliveryLoop._reconcile`): the re-puts a
  killed run made after its last write are in the log, so kill -9 at any point repeats none.
"""

from __future__ import annotations

import asyncio
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from contextlib import suppress
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, TypeVar

import grpc

from services.scheduler import metrics
from services.scheduler.peers import REFUSED, STORED, CommitLogPeer, IndexerPeer
from services.scheduler.replicated_state import ReplicatedStateFile
from services.scheduler.store_reader import ScheduleFiles
from services.server import tracing
from services.server.metrics import Counter, Histogram
from services.store.formats.message import Message
from services.store.formats.parked_record import ParkedRecord

if TYPE_CHECKING:
    from opentelemetry.util.types import AttributeValue

#: after a failed append (RocketMQ waits DELAY_FOR_A_PERIOD, 10 s; shorter keeps lateness bounded)
RETRY_S = 1.0
#: deliveries after which the state is written before the persist interval is up (keeps the stretch of
#: log a restart reads for re-puts short at a high delivery rate)
PERSIST_EVERY_UNITS = 10_000
#: how long after the state file's last write (plus a persist interval) a killed run may still have
#: re-put something: commitlog files whose first record is younger are not read for re-puts (a
#: scheduler that was down a long time does not walk the log written meanwhile)
REPUT_SLACK_MS = 60_000
#: how long a restart waits for the indexer to dispatch the log it reads re-puts from (the units they
#: came from must be readable to be matched), then matches what is
DISPATCH_WAIT_S = 30.0

U = TypeVar("U")


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def written_at_ms(path: Path) -> int | None:
    """When a state file written by ``write_atomically(keep_backup=True)`` was last written: the later
    mtime of it and its ``.bak`` (ms); None when neither exists."""
    times = []
    for candidate in (path, path.with_name(path.name + ".bak")):
        try:
            times.append(candidate.stat().st_mtime_ns // 1_000_000)
        except FileNotFoundError:
            continue
    return max(times, default=None)


class DeliveryMetrics(NamedTuple):
    """The metric children of one kind (and delay level), looked up once: per message the lookups cost
    7% of the loop's CPU."""

    seen: Counter
    delivered: Counter
    skipped: Counter
    lateness: Histogram

    @classmethod
    def of(cls, kind: str, level: str) -> DeliveryMetrics:
        return cls(metrics.SCHEDULED_SEEN.labels(kind=kind, level=level),
                   metrics.DELIVERED.labels(kind=kind, level=level),
                   metrics.SKIPPED.labels(kind=kind, level=level),
                   metrics.LATENESS.labels(kind=kind))


class DeliveryLoop(ABC):
    """A scheduler's deliver loop, arrival watch and persist loop, and the state file they keep.

    A subclass says what its state is (:meth:`_snapshot`), which arrivals concern it
    (:meth:`_arrived`), and runs its rounds in :meth:`_deliver_loop`, re-putting batches with
    :meth:`_append_batch`."""

    #: names of the deliver, arrival-watch and persist tasks
    TASK_NAMES: tuple[str, str, str]

    def __init__(self, files: ScheduleFiles, indexer: IndexerPeer, commitlog: CommitLogPeer,
                 persist_interval_s: float, state_name: str, log: logging.Logger) -> None:
        self._files = files
        self._indexer = indexer
        self._commitlog = commitlog
        self._persist_interval_s = persist_interval_s
        #: the state file as log messages name it, and the subclass's logger (its module's name)
        self._state_name = state_name
        self._log = log
        self._wake = asyncio.Event()
        self._stopping = False
        self._dirty = False
        #: set to have the state written now rather than at the end of the persist interval
        self._persist_soon = asyncio.Event()
        #: whether this run has written the state yet, and the deliveries since the last write
        self._written = False
        self._since_write = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._saving: asyncio.Future[None] | None = None
        self._write_lock = asyncio.Lock()
        self.delivered = 0
        #: a commitlog offset at or below every re-put the state does not count (None: the state file
        #: had none); the re-puts from there on are looked for once before the first delivery
        self._scan_from: int | None = None
        #: when the state file was last written (ms; its mtime), None without one
        self._written_at_ms: int | None = None
        self._recovered = False
        #: an AppendBatch in flight, how many were sent, and whether the last one failed without an
        #: answer (the store may have written it: scan_from stays below it until a batch is answered)
        self._appending = False
        self._appends = 0
        self._unanswered = False
        #: Set on a replicated shard (replicated_state.py): each state written also goes to the log as
        #: ``_document`` (the subclass's snapshot sets it), and a start first takes the log's newest copy
        #: where it says more than this replica's own state (:meth:`_adopt_replicated`).
        self.replicated: ReplicatedStateFile | None = None
        self._document = b""

    # -- the hooks -----------------------------------------------------------------------------
    @abstractmethod
    def _snapshot(self) -> Callable[[], None]:
        """Take the state as it is now (in the loop's thread); the returned call writes it (in a worker)."""

    @abstractmethod
    def _arrived(self, topic: str, queue_id: int, max_offset: int) -> bool:
        """Note a queue's new max offset; True when it may have something for the deliver loop."""

    @abstractmethod
    async def _deliver_loop(self) -> None:
        """Deliver until ``_stopping``; the round in flight is finished first. It calls
        :meth:`_recover` once the queue bounds are known, before its first delivery."""

    @abstractmethod
    async def _refresh_bounds(self) -> None:
        """Ask the indexer for the queue bounds again."""

    @abstractmethod
    def _reconcile(self, reputs: Iterable[ParkedRecord]) -> tuple[int, int]:
        """Count as delivered the units whose re-puts are among ``reputs`` (read from the log past
        ``scan_from``, once; those of the other kind are passed over): (re-puts of this kind, units
        counted)."""

    @abstractmethod
    async def _adopt_replicated(self) -> None:
        """On a replicated shard, before the re-puts past ``scan_from`` are counted: take the log's newest
        copy of the state if it says more than this replica's own (:meth:`_replicated_copy`)."""

    async def _replicated_copy(self) -> tuple[bytes, int] | None:
        """The newest copy of the state in this replica's log, once its indexer dispatched all of it, and
        its store time (ms); None when the log holds none."""
        assert self.replicated is not None
        await self._dispatched(await self._commitlog.log_end())
        return await self.replicated.latest()

    # -- the state file ------------------------------------------------------------------------
    async def _write(self) -> None:
        """Write the state as it is now. The write is shielded: a cancelled caller (the persist loop at
        stop) leaves it to finish, and the next write waits for it (two at once would race on the file)."""
        async with self._write_lock:
            if self._saving is not None and not self._saving.done():
                with suppress(OSError):
                    await asyncio.shield(self._saving)
            save = self._snapshot()
            since = self._since_write
            self._dirty, self._since_write, self._written = False, 0, True
            self._saving = asyncio.ensure_future(asyncio.to_thread(save))
            try:
                await asyncio.shield(self._saving)
            except BaseException:
                self._dirty, self._since_write = True, self._since_write + since
                raise
        if self.replicated is not None and self._document:
            await self.replicated.log(self._document)

    def _write_soon_if_due(self) -> None:
        """After a batch: have the state written now for the first acknowledged batch of this run, or
        after ``PERSIST_EVERY_UNITS`` deliveries since the last write (bounds the repeats after kill -9)."""
        if self._since_write and (not self._written or self._since_write >= PERSIST_EVERY_UNITS):
            self._persist_soon.set()

    async def _persist_loop(self) -> None:
        while True:
            with suppress(TimeoutError):
                await asyncio.wait_for(self._persist_soon.wait(), self._persist_interval_s)
            self._persist_soon.clear()
            await self._advance_scan_from()
            if self._dirty:
                try:
                    await self._write()
                except OSError:
                    self._log.exception("cannot write %s; retrying in %.1fs", self._state_name,
                                        self._persist_interval_s)

    # -- the re-puts past the state ------------------------------------------------------------
    async def _recover(self) -> None:
        """Count the re-puts stored after the state was written (by a run killed since) as delivered,
        then have the state written with ``scan_from`` at the log's end before anything is delivered.
        AioRpcError when the commitlog service does not answer (the deliver loop tries again)."""
        if self.replicated is not None:
            await self._adopt_replicated()
        end = await self._commitlog.log_end()
        start = self._scan_from
        if start is None:
            self._log.info("%s records no commitlog offset to look for re-puts from: starting from the "
                           "log's end %d", self._state_name, end)
        elif start > end:
            self._log.warning("the commitlog ends at %d, before %s's offset %d to look for re-puts from (it lost "
                              "its tail?): none looked for", end, self._state_name, start)
        elif start < end:
            await self._dispatched(end)
            await self._refresh_bounds()
            began = time.monotonic()
            until = None if self._written_at_ms is None else \
                self._written_at_ms + int(self._persist_interval_s * 1000) + REPUT_SLACK_MS
            reputs, found = self._reconcile(self._files.reputs(start, end, until))
            self._log.info("%d re-puts in the commitlog [%d, %d) after %s was written, %d units counted as "
                           "delivered for them (%.3fs)", reputs, start, end, self._state_name, found,
                           time.monotonic() - began)
        self._scan_from, self._recovered, self._dirty = end, True, True
        try:
            await self._write()
        except OSError:
            self._log.exception("cannot write %s: re-puts before the next write may repeat after a crash",
                                self._state_name)
        self._written = False  # the early write after the first acknowledged batch still comes

    async def _reconcile_unanswered(self) -> None:
        """Before a batch whose AppendBatch got no answer is tried again: count its re-puts that the log
        holds all the same as delivered. The call can fail after the commitlog stored them (its leader
        killed while it waited for its followers), and a retry would store them twice. Every re-put before
        ``scan_from`` is counted already, so the look starts there and needs no time bound.
        AioRpcError when the commitlog or the indexer does not answer (the deliver loop tries again)."""
        end = await self._commitlog.log_end()
        start = self._scan_from
        if start is not None and start < end:
            await self._dispatched(end)
            await self._refresh_bounds()
            reputs, found = self._reconcile(self._files.reputs(start, end, None))
            if found:
                self._log.warning("%d re-puts stored by AppendBatch calls that got no answer, found in the "
                                  "commitlog [%d, %d): counted as delivered, not put again", found, start, end)
            elif reputs:
                self._log.info("%d re-puts in the commitlog [%d, %d) after an unanswered AppendBatch: none of "
                               "the batch's", reputs, start, end)
        self._unanswered = False

    async def _offsets_after_dispatch(self, topic: str, queue_id: int) -> tuple[int, int] | None:
        """(min, max offset) of a queue once the indexer has dispatched the log as it ends now. A max offset
        below the progress the state recorded is trusted only then: after a power cut the indexer rebuilds
        the units past its dispatch checkpoint from the log, and going back to a max offset read meanwhile
        would deliver those units again."""
        await self._dispatched(await self._commitlog.log_end())
        return await self._indexer.queue_offsets(topic, queue_id)

    async def _dispatched(self, end: int) -> None:
        """Wait (up to DISPATCH_WAIT_S) until the indexer has dispatched the log below ``end``."""
        deadline = time.monotonic() + DISPATCH_WAIT_S
        while (reput := await self._indexer.reput_offset()) < end:
            if time.monotonic() > deadline or self._stopping:
                self._log.warning("the indexer has dispatched the log up to %d, not to %d: re-puts of units "
                                  "not dispatched yet are not matched", reput, end)
                return
            await asyncio.sleep(0.1)

    async def _advance_scan_from(self) -> None:
        """Move ``scan_from`` up to the log's end while no re-put is in flight (none was sent during the
        call either): every re-put to come lies past it, and the state counts every earlier one."""
        if not self._recovered or self._appending or self._unanswered:
            return
        appends = self._appends
        try:
            end = await self._commitlog.log_end()
        except grpc.aio.AioRpcError:
            return
        if appends == self._appends and not self._appending and end > (self._scan_from or 0):
            self._scan_from, self._dirty = end, True

    # -- running -------------------------------------------------------------------------------
    def start(self) -> None:
        deliver, watch, persist = self.TASK_NAMES
        self._tasks = [asyncio.create_task(self._deliver_loop(), name=deliver),
                       asyncio.create_task(self._watch_arrivals(), name=watch),
                       asyncio.create_task(self._persist_loop(), name=persist)]

    async def stop(self) -> None:
        """Finish the round in flight (an acknowledged delivery is recorded), then write the state."""
        self._stopping = True
        self._wake.set()
        deliver, *others = self._tasks
        for task in others:
            task.cancel()
        for task in [*others, deliver]:
            with suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        if self._saving is not None:  # a write in a worker thread: two at once would race on the file
            with suppress(OSError):
                await self._saving
        try:
            await self._write()
        except OSError:
            self._log.exception("cannot write %s at stop: deliveries since the last write may repeat",
                                self._state_name)

    async def _watch_arrivals(self) -> None:
        while True:
            try:
                async for topic, queue_id, max_offset in self._indexer.arrivals():
                    if self._arrived(topic, queue_id, max_offset):
                        self._wake.set()
            except grpc.aio.AioRpcError as exc:
                self._log.debug("arrival stream from the indexer at %s broke: %s", self._indexer.address,
                                exc.code())
            await asyncio.sleep(RETRY_S)

    # -- a batch -------------------------------------------------------------------------------
    async def _append_batch(self, batch: Sequence[tuple[U, Message]], counts: DeliveryMetrics, prefix: str,
                            span: dict[str, AttributeValue], deliver_ms: Callable[[U], int],
                            name: Callable[[U], str], passed: Callable[[U], None]) -> bool:
        """Re-put ``batch`` with one AppendBatch and account for each result in order: stored (delivered,
        lateness against ``deliver_ms``) or refused for good (passed over) units are ``passed`` and the
        state is dirty; False at a failed call or the first unit to be tried again (``prefix`` and
        ``name`` make the log lines)."""
        self._appending, self._appends = True, self._appends + 1
        try:
            # One trace per delivered batch: this span, and the AppendBatch call's client span beneath it.
            with tracing.span("scheduler.deliver", messages=len(batch), **span):
                results = await self._commitlog.append([message for _, message in batch])
        except grpc.aio.AioRpcError as exc:
            self._log.warning("%s: AppendBatch to %s failed (%s: %s); retrying in %.1fs", prefix,
                              self._commitlog.address, exc.code().name, exc.details(), RETRY_S)
            self._unanswered = True
            return False
        finally:
            self._appending = False
        self._unanswered = len(results) < len(batch)  # a call failed after the ones answered
        done = now_ms()
        delivered, lateness = counts.delivered, counts.lateness
        try:
            for (unit, message), result in zip(batch, results, strict=False):
                if result.status in STORED:
                    delivered.inc()
                    self.delivered += 1
                    self._since_write += 1
                    self._scan_from = max(self._scan_from or 0, result.commitlog_offset + result.wrote_bytes)
                    lateness.observe(max(0, done - deliver_ms(unit)) / 1000)
                elif result.status in REFUSED:
                    self._log.error("%s: the store refused %s for %s queue %d for good (%s): passed over", prefix,
                                    name(unit), message.topic, message.queue_id, result.status)
                    counts.skipped.inc()
                else:
                    self._log.warning("%s: %s not stored (status %d); retrying in %.1fs", prefix, name(unit),
                                      result.status, RETRY_S)
                    return False
                passed(unit)
                self._dirty = True
        finally:
            self._write_soon_if_due()
        return len(results) >= len(batch)
