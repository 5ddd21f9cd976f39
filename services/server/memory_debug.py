"""A service's own view of its memory, written as JSON lines while it runs: off unless asked for.

RSS alone cannot tell a leak (Python objects that pile up) from allocator fragmentation (freed memory
glibc keeps in its arenas) or from buffers the gRPC core holds. With ``MQSTORE_MEMORY_REPORT_DIR``
set, a daemon thread appends one line every ``MQSTORE_MEMORY_REPORT_INTERVAL_S`` seconds (default 5)
to ``<dir>/<service>-<pid>.jsonl``:

* ``rss_kb``, ``anon_kb``, ``file_kb``: /proc/self/status (``anon`` is the process's own memory;
  ``file`` is mapped files, e.g. a commitlog's page cache),
* ``py_blocks``: CPython's allocated blocks (``sys.getallocatedblocks``): grows only with live objects,
* ``malloc_used_kb``, ``malloc_free_kb``, ``malloc_mmap_kb``, ``arenas``: glibc's ``mallinfo2`` summed
  over its arenas: in use, free but kept (fragmentation), large blocks mmapped on their own,
* ``gc_counts``, ``gc_collections``: the cyclic collector's pending counts and runs per generation,
* every ``types_every`` samples, ``types``: the object types whose live count grew most since the
  first sample (an objgraph-style ``growth``), from ``gc.get_objects()``, and ``frames``: the
  functions of the most frequent live frames (kept by coroutines, or by exceptions' tracebacks);
* when tracemalloc runs (Python's own ``PYTHONTRACEMALLOC=<frames>``), also ``traced_kb`` and
  ``top``: the allocation sites (file:line) whose traced size grew most since the first sample.
  tracemalloc slows the process down severalfold: a diagnostic, never a default.

One line costs about a millisecond without types and tracemalloc (the soak, bench/memory_soak.py,
samples every service this way); a types census walks every object (tens of milliseconds).
"""

from __future__ import annotations

import collections
import ctypes
import ctypes.util
import gc
import json
import logging
import os
import sys
import threading
import time
import tracemalloc
from pathlib import Path
from types import FrameType
from typing import Any

log = logging.getLogger(__name__)

REPORT_DIR_ENV = "MQSTORE_MEMORY_REPORT_DIR"
INTERVAL_ENV = "MQSTORE_MEMORY_REPORT_INTERVAL_S"
TYPES_EVERY_ENV = "MQSTORE_MEMORY_REPORT_TYPES_EVERY"
DEFAULT_INTERVAL_S = 5.0
DEFAULT_TYPES_EVERY = 12
TOP = 15


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def _libc_mallinfo2() -> Any:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        fn = ctypes.CDLL(name).mallinfo2  # glibc >= 2.33
    except (OSError, AttributeError):
        return None
    fn.restype = _MallInfo2
    return fn


def proc_status_kb(pid: int | str = "self") -> dict[str, int]:
    """VmRSS, RssAnon, RssFile, RssShmem of a process in KiB ({} once it is gone)."""
    wanted = {"VmRSS": "rss_kb", "RssAnon": "anon_kb", "RssFile": "file_kb", "RssShmem": "shmem_kb"}
    values: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as handle:
            for line in handle:
                key, _, rest = line.partition(":")
                if key in wanted:
                    values[wanted[key]] = int(rest.split()[0])
    except (OSError, ValueError):
        return {}
    return values


class MemoryReporter:
    """The thread that writes the lines (see the module docstring)."""

    def __init__(self, path: Path, interval_s: float, types_every: int) -> None:
        self.path = path
        self.interval_s = interval_s
        self.types_every = types_every
        self._mallinfo2 = _libc_mallinfo2()
        self._first_types: collections.Counter[str] | None = None
        self._first_trace: tracemalloc.Snapshot | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="memory-report", daemon=True)
        self._samples = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def sample(self) -> dict[str, Any]:
        line: dict[str, Any] = {"ts": round(time.time(), 3), **proc_status_kb(),
                                "py_blocks": sys.getallocatedblocks(), "threads": threading.active_count(),
                                "gc_counts": list(gc.get_count()),
                                "gc_collections": [s["collections"] for s in gc.get_stats()]}
        if self._mallinfo2 is not None:
            info = self._mallinfo2()
            line.update(malloc_used_kb=info.uordblks // 1024, malloc_free_kb=info.fordblks // 1024,
                        malloc_mmap_kb=info.hblkhd // 1024, malloc_arena_kb=info.arena // 1024)
        if self.types_every > 0 and self._samples % self.types_every == 0:
            objects = gc.get_objects()
            counts = collections.Counter(type(o).__qualname__ for o in objects)
            line["gc_objects"] = len(objects)
            # Frames are kept alive by coroutines and by exceptions' tracebacks: where they stand says who.
            frames = collections.Counter(f"{o.f_code.co_filename.rsplit('/', 2)[-1]}:{o.f_code.co_qualname}"
                                         for o in objects if type(o) is FrameType)
            line["frames"] = frames.most_common(TOP // 2)
            del objects
            if self._first_types is None:
                self._first_types = counts
            else:
                growth = counts.copy()
                growth.subtract(self._first_types)
                line["types"] = [[name, counts[name], delta] for name, delta in growth.most_common(TOP) if delta > 0]
        if tracemalloc.is_tracing():
            current, peak = tracemalloc.get_traced_memory()
            line.update(traced_kb=current // 1024, traced_peak_kb=peak // 1024)
            snapshot = tracemalloc.take_snapshot().filter_traces(
                [tracemalloc.Filter(False, tracemalloc.__file__)])
            if self._first_trace is None:
                self._first_trace = snapshot
            else:
                diff = snapshot.compare_to(self._first_trace, "lineno")
                line["top"] = [[str(d.traceback), d.size // 1024, d.size_diff // 1024, d.count_diff]
                               for d in diff[:TOP] if d.size_diff > 0]
        self._samples += 1
        return line

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                line = json.dumps(self.sample())
                with open(self.path, "a", encoding="utf-8") as handle:
                    handle.write(line + "\n")
            except Exception:  # noqa: BLE001 - a report must never take the service down
                log.exception("memory report to %s failed; stopping the reports", self.path)
                return
            self._stop.wait(self.interval_s)


def start_memory_report(service: str) -> MemoryReporter | None:
    """Start the reports if ``MQSTORE_MEMORY_REPORT_DIR`` asks for them (a bad value is logged and
    ignored: a diagnostic must not keep a service from starting)."""
    directory = os.environ.get(REPORT_DIR_ENV, "").strip()
    if not directory:
        return None
    try:
        interval_s = float(os.environ.get(INTERVAL_ENV, DEFAULT_INTERVAL_S))
        types_every = int(os.environ.get(TYPES_EVERY_ENV, DEFAULT_TYPES_EVERY))
        if interval_s <= 0:
            raise ValueError("the interval must be positive")
        Path(directory).mkdir(parents=True, exist_ok=True)
    except (ValueError, OSError) as exc:
        log.warning("memory report not started (%s=%s): %s", REPORT_DIR_ENV, directory, exc)
        return None
    reporter = MemoryReporter(Path(directory) / f"{service}-{os.getpid()}.jsonl", interval_s, types_every)
    reporter.start()
    log.info("writing memory reports to %s every %.1f s", reporter.path, interval_s)
    return reporter
