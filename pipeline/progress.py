"""Progress of a running job on stderr, the way Spark's console shows it (``[Stage 3: (12 + 2) / 40]``),
plus what Spark cannot know: how much of the commitlog has been read, and at what rate.

A daemon thread polls the SparkContext's status tracker (no listener, nothing in the tasks): the
stages of the jobs started since, with their done, running and total tasks. Commitlog bytes are
estimated from the scan's stage: the job says how many bytes and splits it planned
(:meth:`Progress.expect`), and a stage with one task per split has read ``planned bytes x done /
total`` of them. On a terminal the line is redrawn in
place; otherwise (``--progress`` into a file or pipe) a line is written every few seconds when it
changed. Only ``mqstore pipeline`` starts it (``--progress``, or stderr is a terminal).
"""

from __future__ import annotations

import sys
import threading
import time
from typing import TYPE_CHECKING, ClassVar, TextIO

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

MB = 1_000_000


class Progress:
    """The one reporter of this process (a job runs one SparkContext)."""

    current: ClassVar[Progress | None] = None
    planned_bytes: ClassVar[int] = 0
    planned_splits: ClassVar[int] = 0

    def __init__(self, session: SparkSession, stream: TextIO, interval_s: float) -> None:
        self.tracker = session.sparkContext.statusTracker()
        self.stream = stream
        self.interval_s = interval_s
        self.tty = stream.isatty()
        self.started = time.monotonic()
        self.stages: dict[int, tuple[int, int]] = {}  # stage id -> (done, total), kept after it ends
        self.active: list[tuple[int, int, int, int]] = []
        self.known_jobs = set(self.tracker.getJobIdsForGroup())  # earlier jobs of the session are not ours
        self.job_stages: set[int] = set()  # the stages of the jobs started since
        self.scanned_fraction = 0.0
        self.last_line = ""
        self.last_written = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mqstore-progress", daemon=True)

    @classmethod
    def start(cls, session: SparkSession, stream: TextIO | None = None, interval_s: float = 0.5) -> Progress:
        if cls.current is None:
            cls.current = cls(session, stream or sys.stderr, interval_s)
            if cls.current.tty and not isinstance(sys.stdout, _ClearingStream):
                sys.stdout = _ClearingStream(sys.stdout, cls.current)
            cls.current._thread.start()
        return cls.current

    @classmethod
    def expect(cls, planned_bytes: int, splits: int) -> None:
        """The scan about to run: ``planned_bytes`` of commitlog in ``splits`` tasks."""
        cls.planned_bytes, cls.planned_splits = planned_bytes, splits

    @classmethod
    def stop(cls) -> None:
        """Draw the last state and end the line."""
        reporter, cls.current = cls.current, None
        if isinstance(sys.stdout, _ClearingStream):
            sys.stdout = sys.stdout.stream
        if reporter is not None:
            reporter._stop.set()
            reporter._thread.join(timeout=2)
            reporter._poll()
            reporter._write(reporter.line(), final=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self._poll()
                self._write(self.line())
            except Exception:  # noqa: BLE001 (the context is stopping: nothing to show)
                return

    def _poll(self) -> list[tuple[int, int, int, int]]:
        """(stage id, done, running, total) of the active stages; remembers every stage of every job
        started since the reporter was (a stage too short to be seen active is still counted)."""
        tracker = self.tracker
        for job_id in set(tracker.getJobIdsForGroup()) - self.known_jobs:
            job = tracker.getJobInfo(job_id)
            if job is not None:  # a job's stages never change: asked once (every tick adds py4j calls)
                self.job_stages.update(getattr(job, "stageIds", None) or [])
                self.known_jobs.add(job_id)
        unfinished = {sid for sid in self.job_stages
                      if sid not in self.stages or self.stages[sid][0] < self.stages[sid][1]}
        active = []
        for stage_id in sorted(unfinished | set(tracker.getActiveStageIds())):
            info = tracker.getStageInfo(stage_id)
            if info is None:
                continue
            self.stages[stage_id] = (info.numCompletedTasks, info.numTasks)
            if info.numActiveTasks or info.numCompletedTasks < info.numTasks:
                active.append((stage_id, info.numCompletedTasks, info.numActiveTasks, info.numTasks))
        for done, total in self.stages.values():
            if total and total == self.planned_splits:
                self.scanned_fraction = max(self.scanned_fraction, done / total)
        self.active = [stage for stage in active if stage[2]]  # running now
        return self.active

    def line(self) -> str:
        elapsed = time.monotonic() - self.started
        parts = [" ".join(f"[Stage {sid}: ({done} + {running}) / {total}]"
                          for sid, done, running, total in self.active)]
        done_tasks = sum(done for done, _ in self.stages.values())
        parts.append(f"{len(self.stages)} stages, {done_tasks} tasks done")
        if self.planned_bytes:
            read = self.planned_bytes * self.scanned_fraction
            parts.append(f"commitlog {read / MB:.1f}/{self.planned_bytes / MB:.1f} MB, "
                         f"{read / MB / max(elapsed, 1e-9):.1f} MB/s")
        parts.append(f"{int(elapsed) // 60:02d}:{int(elapsed) % 60:02d}")
        return " | ".join(part for part in parts if part)

    def clear(self) -> None:
        """Erase the line drawn in place (before the job prints on the same terminal)."""
        if self.tty and self.last_line:
            self.stream.write("\r\x1b[K")
            self.stream.flush()

    def _write(self, line: str, final: bool = False) -> None:
        if self.tty:
            self.stream.write("\r" + line + "\x1b[K" + ("\n" if final else ""))
        elif final or (line != self.last_line and time.monotonic() - self.last_written >= 2.0):
            self.stream.write(line + "\n")
            self.last_written = time.monotonic()
        self.last_line = line
        self.stream.flush()


class _ClearingStream:
    """stdout while progress is drawn on the terminal: a job's own output first erases the progress
    line (the next poll draws it again below), so the two never share a line."""

    def __init__(self, stream: TextIO, progress: Progress) -> None:
        self.stream, self.progress = stream, progress

    def write(self, text: str) -> int:
        self.progress.clear()
        return self.stream.write(text)

    def __getattr__(self, name: str) -> object:
        return getattr(self.stream, name)
