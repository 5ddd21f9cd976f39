"""The CommitLog's background services: flush (async), group commit (sync) and commit (pool).

Each is a thread with a stop event and a wakeup event, like RocketMQ's ServiceThread. A flush that
made something durable is timed (``mqstore_commitlog_flush_latency_seconds``): once per fdatasync
round, never per message.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque

from services.commitlog.metrics import FLUSH_LATENCY
from services.store.formats.mapped_file_queue import MappedFileQueue
from services.store.service_thread import LeastPages, ServiceThread

log = logging.getLogger(__name__)
#: A round this close to its deadline is the deadline's (a timed wait may return a little early).
_EARLY_S = 0.001


class FlushRealTimeService(ServiceThread):
    """ASYNC_FLUSH: an append acknowledged from the page cache is durable at most
    ``flushIntervalCommitLog`` ms later.

    RocketMQ's FlushRealTimeService sleeps the interval, then flushes one file once
    ``flushCommitLogLeastPages`` are dirty: an append made just after a flush began waits the sleep,
    the earlier flush's own time and its own flush's time, one in the next file waits a round more,
    and one below the page threshold waits up to ``flushCommitLogThoroughInterval``. Here the rounds
    run at a fixed rate instead, each one due ``flushIntervalCommitLog`` after the previous round
    began, started early by the longest of the last rounds' flush times (:class:`FlushDeadline`),
    and a round covers everything acknowledged when it begins: pending pool bytes are committed
    first, then every file up to that offset is flushed (past a roll too), whatever the page
    threshold. So an append is durable by the end of the first round that begins after it, within
    one interval while a flush takes no longer than the recent ones. ``flushCommitLogLeastPages``
    applies to early rounds: a commit's wakeup when ``flushCommitLogTimed`` is off flushes ahead of
    the deadline only when that many pages wait.
    """

    name = "flush-commitlog"

    def __init__(self, mfq: MappedFileQueue, interval_ms: int, least_pages: int,
                 thorough_interval_ms: int, timed: bool) -> None:
        super().__init__()
        self._mfq = mfq
        self._deadline = FlushDeadline(interval_ms / 1000)
        self._least_pages = LeastPages(least_pages, thorough_interval_ms)
        self._timed = timed

    def run_once(self) -> None:
        wait_s = self._deadline.wait_s()
        if self._timed:
            self._stopped.wait(wait_s)
        else:
            self.wait_for_running(wait_s)
        if self.stopped:
            return
        if self._deadline.wait_s() > _EARLY_S:  # a commit's wakeup ahead of the deadline
            self._flush_if_enough(self._least_pages.now())
            return
        started = time.monotonic()
        before = self._mfq.flushed_where
        while self._mfq.commit(0):  # everything acknowledged so far: pool bytes not yet in their file too
            pass
        self._mfq.flush_until(self._mfq.max_offset)
        took = time.monotonic() - started
        self._deadline.flushed(started, took)
        if self._mfq.flushed_where != before:
            FLUSH_LATENCY.observe(took)

    def _flush_if_enough(self, least_pages: int) -> None:
        """An early round: flush once ``least_pages`` wait; the deadline stays (pool bytes may wait)."""
        started = time.perf_counter()
        if self._mfq.flush(least_pages):
            self._mfq.flush_until(self._mfq.max_offset)
            FLUSH_LATENCY.observe(time.perf_counter() - started)

    def on_stop(self) -> None:
        self._mfq.flush_until(self._mfq.max_offset)


class FlushDeadline:
    """When the next ASYNC_FLUSH round must begin so that whatever the last one did not cover is
    durable within ``interval_s``: the last round's start plus the interval, less the longest flush
    of the last ``window`` rounds (a round takes about as long as the recent ones; a flush that takes
    longer than the interval leaves no wait at all, and the bound is then the flush time)."""

    def __init__(self, interval_s: float, window: int = 8) -> None:
        self._interval_s = interval_s
        self._took: deque[float] = deque(maxlen=window)
        self._last_start = time.monotonic()

    def wait_s(self) -> float:
        lead = max(self._took, default=0.0)
        return max(0.0, self._last_start + self._interval_s - lead - time.monotonic())

    def flushed(self, started: float, took_s: float) -> None:
        """A round that began at ``started`` (monotonic) covered everything written before then."""
        self._last_start = started
        self._took.append(took_s)


class CommitRealTimeService(ServiceThread):
    """transientStorePoolEnable: move pooled bytes into the file every ``commitIntervalCommitLog`` ms
    once ``commitCommitLogLeastPages`` are pending, then wake the flush service."""

    name = "commit-commitlog"

    def __init__(self, mfq: MappedFileQueue, interval_ms: int, least_pages: int,
                 thorough_interval_ms: int, flush_service: ServiceThread) -> None:
        super().__init__()
        self._mfq = mfq
        self._interval_s = interval_ms / 1000
        self._least_pages = LeastPages(least_pages, thorough_interval_ms)
        self._flush_service = flush_service

    def run_once(self) -> None:
        if self._mfq.commit(self._least_pages.now()):
            self._flush_service.wakeup()
        self.wait_for_running(self._interval_s)

    def on_stop(self) -> None:
        while self._mfq.commit(0):
            pass


class GroupCommitService(ServiceThread):
    """SYNC_FLUSH group commit: producers append, then wait here; one fdatasync acknowledges everyone
    whose data it covered, so concurrent producers share the cost of a flush.

    Unlike RocketMQ's dedicated thread, the first waiter that finds no flush running does the flush
    itself (leader/follower). In CPython that saves a thread hand-off per round: the flush thread
    would have to win the GIL back from the producers before it could wake them.
    """

    name = "group-commit"

    def __init__(self, mfq: MappedFileQueue, gather_us: int) -> None:
        super().__init__()
        self._mfq = mfq
        self._gather_s = gather_us / 1_000_000
        self._cond = threading.Condition()
        self._flushing = False
        self.flushed = mfq.flushed_where

    def wait_for_flush(self, offset: int, timeout_s: float) -> bool:
        """Block until the log is durable up to ``offset``; False on timeout."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self._cond:
                while self.flushed < offset and self._flushing:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0 or self.stopped:
                        return False
                    self._cond.wait(remaining)
                if self.flushed >= offset:
                    return True
                self._flushing = True
            self._lead_flush()
            if time.monotonic() > deadline:  # durable now, but not within syncFlushTimeout
                return False

    def _lead_flush(self) -> None:
        # Let producers that are runnable append first, so this flush covers them too.
        time.sleep(self._gather_s)
        before = self._mfq.flushed_where
        started = time.perf_counter()
        try:
            self._mfq.flush_until(self._mfq.max_offset)
            if self._mfq.flushed_where != before:
                FLUSH_LATENCY.observe(time.perf_counter() - started)
        finally:
            with self._cond:
                self._flushing = False
                self.flushed = self._mfq.flushed_where
                self._cond.notify_all()

    def run_once(self) -> None:
        """Background safety net: data written without anyone waiting (WAIT=false) is still flushed."""
        self._stopped.wait(0.01)
        if self._mfq.flushed_where < self._mfq.max_offset:
            with self._cond:
                if self._flushing:
                    return
                self._flushing = True
            self._lead_flush()

    def on_stop(self) -> None:
        self._mfq.flush_until(self._mfq.max_offset)
        with self._cond:
            self.flushed = self._mfq.flushed_where
            self._cond.notify_all()
