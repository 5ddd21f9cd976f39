"""Client processes of the peer harness (bench/peers.py): one job, ``procs`` spawned processes.

Every system's client module (bench.peer_redis, bench.peer_nats, bench.peer_mqstore) offers
``async def prepare(job) -> Session``; a Session's ``worker(index, deadline_ns, tally)`` coroutines run
``job.concurrency`` to a process, started together across the processes by a barrier (after every
connection is up and every request is built), and ``close()`` ends it. The processes are spawned,
never forked, so each client has its own GIL and no inherited gRPC or event-loop state, as in
bench/gateway.py. Only what a worker counted as done (acknowledged, found, read and checked) is in the
rate; failures are counted apart and the first few errors reported.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import time
from array import array
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import grpc

from bench.client_procs import run_client_processes
from bench.peer_table import Measure
from bench.report import CpuMeter, percentile


@dataclass(frozen=True)
class Job:
    """What the client processes of one case do (picklable: it crosses to spawned processes)."""

    system: str  # redis | nats | mqstore: the module bench.peer_<system>
    op: str
    target: str  # host:port
    duration_s: float
    concurrency: int = 1  # coroutines per process
    batch: int = 1  # messages per call (pipeline, batch)
    proc: int = 0
    procs: int = 1
    data: tuple[Any, ...] = ()  # ids, timestamps, depths: whatever the op needs
    mode: str = ""  # the label of what ran, for the table


@dataclass
class Tally:
    """One worker's counts: ``ok`` operations (messages) done and checked, ``failed`` ones, and one
    latency sample (ns) per call."""

    ok: int = 0
    failed: int = 0
    latencies: array[int] = field(default_factory=lambda: array("q"))
    errors: list[str] = field(default_factory=list)

    def error(self, exc: BaseException, count: int = 1) -> None:
        self.failed += count
        if len(self.errors) < 3:
            self.errors.append(f"{type(exc).__name__}: {exc}"[:300])


async def windowed_stream(call: Any, next_frame: Callable[[], bytes], window: int, deadline_ns: int, tally: Tally,
                          answered: Callable[[bytes], None], frame_messages: int) -> None:
    """Drive one open bidirectional stream: frames written while fewer than ``window`` are unanswered,
    until the deadline; each answer's latency (written to answered) sampled and ``answered(bytes)``
    called; an error counts the unanswered frames' messages as failed."""
    slots = asyncio.Semaphore(window)
    sent: deque[int] = deque()
    clock, now = time.perf_counter_ns, time.monotonic_ns

    async def write() -> None:
        try:
            while True:
                await slots.acquire()
                if now() >= deadline_ns:
                    break
                sent.append(clock())
                await call.write(next_frame())
        finally:
            with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
                await call.done_writing()

    writer = asyncio.create_task(write())
    try:
        while True:
            answer = await call.read()
            if not isinstance(answer, bytes):  # EOF
                break
            tally.latencies.append(clock() - sent.popleft())
            slots.release()
            answered(answer)
    except grpc.aio.AioRpcError as exc:
        tally.error(exc, len(sent) * frame_messages)
        sent.clear()
    writer.cancel()
    with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
        await writer


class Session(Protocol):
    async def worker(self, index: int, deadline_ns: int, tally: Tally) -> None: ...

    async def close(self) -> None: ...


async def _child(job: Job, ready: Any) -> dict[str, Any]:
    module = importlib.import_module(f"bench.peer_{job.system}")
    session: Session = await module.prepare(job)
    try:
        tallies = [Tally() for _ in range(job.concurrency)]
        await asyncio.get_running_loop().run_in_executor(None, ready.wait, 300)
        started = time.monotonic_ns()
        deadline = started + int(job.duration_s * 1e9)
        await asyncio.gather(*(session.worker(i, deadline, t) for i, t in enumerate(tallies)))
        ended = time.monotonic_ns()
    finally:
        await session.close()
    return {"ok": sum(t.ok for t in tallies), "failed": sum(t.failed for t in tallies),
            "errors": [e for t in tallies for e in t.errors], "started": started, "ended": ended,
            "latencies": b"".join(t.latencies.tobytes() for t in tallies)}


def _child_main(job: Job, ready: Any, results: Any) -> None:
    try:
        report = asyncio.run(_child(job, ready))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        with contextlib.suppress(Exception):
            ready.abort()
        report = {"fatal": f"{job.system} client {job.proc}: {exc!r}"}
    results.put(report)


def run_job(job: Job, procs: int, server_pids: Sequence[int] = ()) -> tuple[Measure, dict[str, Any]]:
    """Run ``job`` in ``procs`` client processes; the Measure of what they did, and extras (CPU, errors)."""
    def meters(client_pids: list[int]) -> dict[str, CpuMeter]:
        return {"all": CpuMeter([*server_pids, *client_pids]),
                "cpuServer": CpuMeter(list(server_pids), include_self=False)}

    reports, figures = run_client_processes(_child_main, [replace(job, proc=p, procs=procs) for p in range(procs)],
                                            f"peer-client-{job.system}", job.duration_s, meters,
                                            what=f"{job.system} client")
    cpu = {**figures["all"], "cpuServer": figures["cpuServer"]["cpuOurs"]}
    result = replace(measure(job, reports), cpu_other=cpu["cpuOther"])
    return result, {**cpu, "errors": [e for r in reports for e in r["errors"]][:3]}


def measure(job: Job, reports: Sequence[dict[str, Any]]) -> Measure:
    ok = sum(r["ok"] for r in reports)
    seconds = (max(r["ended"] for r in reports) - min(r["started"] for r in reports)) / 1e9
    latencies: array[int] = array("q")
    for r in reports:
        latencies.frombytes(r["latencies"])
    ordered = sorted(latencies)
    return Measure(rate=ok / seconds if seconds > 0 else 0.0, p50_ms=percentile(ordered, 50) / 1e6 if ordered else None,
                   p99_ms=percentile(ordered, 99) / 1e6 if ordered else None, mode=job.mode,
                   failed=sum(r["failed"] for r in reports), ops=ok)


