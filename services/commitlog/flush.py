"""The CommitLog's background services: flush (async), group commit (sync) and commit (pool).

Each is a thread with a stop event and a wakeup event, like RocketMQ's ServiceThread. A flush that
made something durable is timed (``mqstore_commitlog_flush_latency_seconds``): once per fdatasync
round, never per message.
"""

from __future__ import annotations

import logging
import threading
import time

from services.commitlog.metrics import FLUSH_LATENCY
from services.store.formats.mapped_file_queue import MappedFileQueue
from services.store.service_thread import LeastPages, ServiceThread

log = logging.getLogger(__name__)


class FlushRealTimeService(ServiceThread):
    """ASYNC_FLUSH: flush every ``flushIntervalCommitLog`` ms once ``flushCommitLogLeastPages`` are
    dirty, and everything every ``flushCommitLogThoroughInterval`` ms."""

    name = "flush-commitlog"

    def __init__(self, mfq: MappedFileQueue, interval_ms: int, least_pages: int,
                 thorough_interval_ms: int, timed: bool) -> None:
        super().__init__()
        self._mfq = mfq
        self._interval_s = interval_ms / 1000
        self._least_pages = LeastPages(least_pages, thorough_interval_ms)
        self._timed = timed

    def run_once(self) -> None:
        least = self._least_pages.now()
        if self._timed:
            self._stopped.wait(self._interval_s)
        else:
            self.wait_for_running(self._interval_s)
        started = time.perf_counter()
        if self._mfq.flush(least):
            FLUSH_LATENCY.observe(time.perf_counter() - started)

    def on_stop(self) -> None:
        self._mfq.flush_until(self._mfq.max_offset)


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
