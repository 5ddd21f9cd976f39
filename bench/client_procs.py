"""Client processes for a benchmark case: spawned together, released at once by a barrier, each
reporting one dict on a queue; CPU measured while they run. Shared by bench/gateway.py and the peer
harness so that every system's clients start, are metered and are stopped the same way."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import queue
import signal
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from bench.report import CpuMeter

# Takes the client pids; returns the meters to run while the clients work (started when made).
Meters = Callable[[list[int]], dict[str, CpuMeter]]


def run_client_processes(target: Callable[..., None], jobs: Sequence[Any], name: str, duration_s: float,
                         meters: Meters, what: str = "client",
                         tick: Callable[[float], None] = lambda elapsed: None,
                         ) -> tuple[list[dict[str, Any]], dict[str, dict[str, float]]]:
    """Run ``target(job, ready, results)`` in one spawned process per job. Returns their reports and
    each meter's figures. A client that fails before the start, dies without a report, overruns
    ``duration_s`` by 300 s or reports ``fatal`` is a RuntimeError naming ``what``."""
    ctx = multiprocessing.get_context("spawn")  # never fork a process that holds gRPC state
    procs = len(jobs)
    ready = ctx.Barrier(procs + 1)
    results = ctx.Queue()
    children = [ctx.Process(target=target, args=(job, ready, results), name=f"{name}-{p}", daemon=True)
                for p, job in enumerate(jobs)]
    for child in children:
        child.start()
    reports: list[dict[str, Any]] = []
    try:
        try:
            ready.wait(timeout=300)
        except threading.BrokenBarrierError:
            fatal = [r["fatal"] for r in _drain(results, procs) if "fatal" in r]
            raise RuntimeError(f"a {what} failed before the start: {fatal or 'no report'}") from None
        running = meters([c.pid for c in children if c.pid])
        started = time.monotonic()
        while len(reports) < procs:
            try:
                reports.append(results.get(timeout=0.5))
            except queue.Empty:
                if any(c.exitcode not in (None, 0) for c in children):
                    raise RuntimeError(f"a {what} process died without a report") from None
                if time.monotonic() - started > duration_s + 300:
                    raise RuntimeError(f"the {what}s did not finish") from None
            tick(time.monotonic() - started)
        figures = {key: meter.stop() for key, meter in running.items()}
    finally:
        for child in children:
            child.join(timeout=30)
            if child.is_alive() and child.pid:
                os.kill(child.pid, signal.SIGKILL)
                child.join()
    fatal = [r["fatal"] for r in reports if "fatal" in r]
    if fatal:
        raise RuntimeError(f"{what} failed: {fatal[0]}")
    return reports, figures


def _drain(results: Any, count: int) -> list[dict[str, Any]]:
    drained: list[dict[str, Any]] = []
    with contextlib.suppress(queue.Empty):
        for _ in range(count):
            drained.append(results.get(timeout=5))
    return drained
