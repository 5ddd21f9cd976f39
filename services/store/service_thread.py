"""Background service threads of the stores (RocketMQ's ServiceThread), and the flush-threshold rule
they share."""

from __future__ import annotations

import logging
import threading
import time

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


class LeastPages:
    """RocketMQ's "least pages, except every thorough interval": the page threshold of this round."""

    def __init__(self, least_pages: int, thorough_interval_ms: int) -> None:
        self._least_pages = least_pages
        self._thorough_interval_s = thorough_interval_ms / 1000
        self._last_thorough = time.monotonic()

    def now(self) -> int:
        now = time.monotonic()
        if now - self._last_thorough >= self._thorough_interval_s:
            self._last_thorough = now
            return 0
        return self._least_pages
