"""Long-poll wake-ups from the indexer's WatchArrivals stream.

One stream per service, not one per waiting pull. A pull that found nothing registers a waiter for
(topic, queue, offset); an arrival whose max offset passes the offset completes it at once. The race
between "the pull found nothing" and "the waiter is registered" is closed with a per-queue arrival
count: a pull takes a :meth:`token` before it asks the indexer, and :meth:`wait` returns at once if
an arrival came in meanwhile. While the stream is down (indexer restarting) waiters are released
every reconnect attempt, and every ``recheck_s`` anyway (RocketMQ's hold service re-checks every 5 s
too), so a lost arrival costs at most that long, never a missed message.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import suppress
from dataclasses import dataclass

from services.query.backends import IndexerClient
from services.store.errors import ResourceExhaustedError, StoreError

log = logging.getLogger(__name__)

QueueKey = tuple[str, int]
RECHECK_S = 5.0
MAX_WAITERS = 8192
# Arrival counts are kept for this many queues; past it the table starts over (a reset only costs
# waiting pulls one extra round).
MAX_TRACKED_QUEUES = 1_000_000
RECONNECT_MIN_S = 0.05
RECONNECT_MAX_S = 2.0


@dataclass(slots=True, eq=False)
class _Waiter:
    offset: int
    future: asyncio.Future[None]


class ArrivalWatcher:
    def __init__(self, indexer: IndexerClient, recheck_s: float = RECHECK_S, max_waiters: int = MAX_WAITERS) -> None:
        self._indexer = indexer
        self._recheck_s = recheck_s
        self._max_waiters = max_waiters
        self._counts: dict[QueueKey, int] = {}
        self._epoch = 0
        self._waiters: dict[QueueKey, list[_Waiter]] = {}
        self._waiting = 0
        self.connected = False
        self.stopping = False
        self._task: asyncio.Task[None] | None = None
        self._stopped = asyncio.Event()

    @property
    def waiting(self) -> int:
        """Pulls suspended in :meth:`wait` right now."""
        return self._waiting

    # -- the pull side -------------------------------------------------------------------------
    def token(self, key: QueueKey) -> tuple[int, int]:
        return self._epoch, self._counts.get(key, 0)

    async def wait(self, key: QueueKey, offset: int, token: tuple[int, int], timeout_s: float) -> None:
        """Until an arrival takes the queue past ``offset``, the timeout, a stream reconnect or a stop.
        Returns at once if the queue saw arrivals since ``token`` was taken."""
        if self.stopping or self.token(key) != token:
            return
        if self._waiting >= self._max_waiters:
            raise ResourceExhaustedError(f"{self._waiting} pulls are already waiting, the limit: pull again "
                                         "later or with a shorter long poll")
        waiter = _Waiter(offset, asyncio.get_running_loop().create_future())
        self._waiters.setdefault(key, []).append(waiter)
        self._waiting += 1
        try:
            await asyncio.wait_for(waiter.future, min(timeout_s, self._recheck_s))
        except TimeoutError:
            pass
        finally:
            self._waiting -= 1
            self._forget(key, waiter)

    def _forget(self, key: QueueKey, waiter: _Waiter) -> None:
        waiters = self._waiters.get(key)
        if waiters is None:
            return
        with suppress(ValueError):
            waiters.remove(waiter)
        if not waiters:
            del self._waiters[key]

    # -- the stream side -----------------------------------------------------------------------
    def arrived(self, key: QueueKey, max_offset: int) -> None:
        counts = self._counts
        if len(counts) >= MAX_TRACKED_QUEUES and key not in counts:
            counts.clear()
            self._epoch += 1
        counts[key] = counts.get(key, 0) + 1
        for waiter in self._waiters.get(key, ()):
            if max_offset > waiter.offset and not waiter.future.done():
                waiter.future.set_result(None)

    def release_all(self) -> None:
        """Every waiter pulls again: arrivals may have been missed."""
        self._epoch += 1
        for waiters in self._waiters.values():
            for waiter in waiters:
                if not waiter.future.done():
                    waiter.future.set_result(None)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="watch-arrivals")

    def begin_stop(self) -> None:
        """Release every waiting pull (each answers with what it has) and refuse new waits."""
        self.stopping = True
        self._stopped.set()
        self.release_all()

    async def stop(self) -> None:
        self.begin_stop()
        if self._task is not None:
            self._task.cancel()
            with suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        backoff = RECONNECT_MIN_S
        while not self.stopping:
            try:
                async for arrival in self._indexer.arrivals():
                    if not self.connected:
                        self._connected()
                        backoff = RECONNECT_MIN_S
                    if arrival.topic and not arrival.deleted:  # a truncation notice names no queue
                        self.arrived((arrival.topic, arrival.queue_id), arrival.max_offset)
            except StoreError as exc:
                if self.connected:
                    log.warning("arrival stream from the indexer at %s broke (%s); reconnecting",
                                self._indexer.address, exc)
            self.connected = False
            self.release_all()
            with suppress(TimeoutError):
                await asyncio.wait_for(self._stopped.wait(), backoff)
            backoff = min(backoff * 2, RECONNECT_MAX_S)

    def _connected(self) -> None:
        self.connected = True
        log.info("following arrivals from the indexer at %s", self._indexer.address)
        self.release_all()
