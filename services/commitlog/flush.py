"""The CommitLog's background services: flush (async), group commit (sync) and commit (pool).

Each is a thread with a stop event and a wakeup event, like RocketMQ's ServiceThread.
"""

from __future__ import annotations

import logging
import threading
import time

from services.store.mapped_file_queue import MappedFileQueue

log = logging.getLogger(__name__)


class ServiceThread:
    """A named daemon thread running ``run_once`` until stopped; ``wakeup`` cuts a wait short."""

    name = "service"

    def __init__(self) -> None:
        self._stopped = threading.Event()
        self._wakeup = threading.Event()
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        self._wakeup.set()
        self._thread.join()

    def wakeup(self) -> None:
        self._wakeup.set()

    @property
    def stopped(self) -> bool:
        return self._stopped.is_set()

    def wait_for_running(self, interval_s: float) -> None:
        self._wakeup.wait(interval_s)
        self._wakeup.clear()

    def _run(self) -> None:
        while not self._stopped.is_set():
            try:
                self.run_once()
            except Exception:  # a background service must survive one bad round
                log.exception("%s failed a round", self.name)
                time.sleep(0.1)
        self.on_stop()

    def run_once(self) -> None:
        raise NotImplementedError

    def on_stop(self) -> None:
        """Last work after stop() (a final flush)."""


class FlushRealTimeService(ServiceThread):
    """ASYNC_FLUSH: flush every ``flushIntervalCommitLog`` ms once ``flushCommitLogLeastPages`` are
    dirty, and everything every ``flushCommitLogThoroughInterval`` ms."""

    name = "flush-commitlog"

    def __init__(self, mfq: MappedFileQueue, interval_ms: int, least_pages: int,
                 thorough_interval_ms: int, timed: bool) -> None:
        super().__init__()
        self._mfq = mfq
        self._interval_s = interval_ms / 1000
        self._least_pages = least_pages
        self._thorough_interval_s = thorough_interval_ms / 1000
        self._timed = timed
        self._last_thorough = time.monotonic()

    def run_once(self) -> None:
        now = time.monotonic()
        least = self._least_pages
        if now - self._last_thorough >= self._thorough_interval_s:
            self._last_thorough = now
            least = 0
        if self._timed:
            self._stopped.wait(self._interval_s)
        else:
            self.wait_for_running(self._interval_s)
        self._mfq.flush(least)

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
        self._least_pages = least_pages
        self._thorough_interval_s = thorough_interval_ms / 1000
        self._flush_service = flush_service
        self._last_thorough = time.monotonic()

    def run_once(self) -> None:
        now = time.monotonic()
        least = self._least_pages
        if now - self._last_thorough >= self._thorough_interval_s:
            self._last_thorough = now
            least = 0
        if self._mfq.commit(least):
            self._flush_service.wakeup()
        self.wait_for_running(self._interval_s)

    def on_stop(self) -> None:
        while self._mfq.commit(0):
            pass


class GroupCommitService(ServiceThread):
    """SYNC_FLUSH: producers append, then wait here; one fdatasync acknowledges everyone whose data
    it covered, so concurrent producers share the cost of a flush."""

    name = "group-commit"

    def __init__(self, mfq: MappedFileQueue) -> None:
        super().__init__()
        self._mfq = mfq
        self._cond = threading.Condition()
        self._requested = 0
        self.flushed = mfq.flushed_where

    def wait_for_flush(self, offset: int, timeout_s: float) -> bool:
        """Block until the log is durable up to ``offset``; False on timeout."""
        if self.flushed >= offset:
            return True
        with self._cond:
            if offset > self._requested:
                self._requested = offset
                self._wakeup.set()
            return self._cond.wait_for(lambda: self.flushed >= offset or self.stopped, timeout_s) \
                and self.flushed >= offset

    def run_once(self) -> None:
        self._wakeup.wait(0.01)
        self._wakeup.clear()
        if self._requested <= self.flushed:
            return
        self._mfq.flush_until(self._mfq.max_offset)
        with self._cond:
            self.flushed = self._mfq.flushed_where
            self._cond.notify_all()

    def on_stop(self) -> None:
        self._mfq.flush_until(self._mfq.max_offset)
        with self._cond:
            self.flushed = self._mfq.flushed_where
            self._cond.notify_all()
