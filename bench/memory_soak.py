"""Memory over a long run: does every service's memory level off under a steady mixed load?

    python -m bench.memory_soak --minutes 30          # make soak-memory (not part of make test / CI)
    python -m bench.memory_soak --minutes 5 --heap-types 1 --tracemalloc 8   # diagnosis (much slower)

Starts ``mqstore up`` on free loopback ports in a fresh store under .bench-tmp (removed afterwards),
then runs 64 clients against the gateway for ``--minutes``, split over ``--procs`` client processes:

* 16 producers doing unary Send, 8 doing SendBatch of ``--batch`` messages (1 KiB bodies, a KEYS key
  from a rotating set of ``--keys``), together ``--rate`` messages a second (paced, not flat out);
* 24 PullConsumers (AsyncPullConsumer, long poll, auto commit): 3 groups, each consumer one queue;
* 16 lookups doing GetMessage by offset msg id and by UNIQ_KEY and QueryByKey of recent messages,
  together ``--lookup-rate`` a second.

The store stays small: 128 MiB commitlog files and index files of 1M entries, expired at once
(``fileReservedTime=0`` at every hour): consumers and lookups keep to the recent data.

Every ``--interval`` seconds it samples each service's VmRSS, RssAnon (the process's own memory:
heap, stacks, gRPC buffers) and RssFile (mapped store files, which come and go with the files), and
the service's own report of its heap (services/server/memory_debug.py: CPython's allocated blocks,
glibc's in-use and free-but-kept bytes), into ``--csv``. At the end it prints per service the start,
peak and end of RSS and RssAnon, their slope over the last half of the run (least squares, MB/min)
and a verdict from the RssAnon slope: "levels off" (below ``--threshold`` MB/min) or "grows".
MB = 2^20 bytes here (what ps and top show).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import csv
import itertools
import json
import multiprocessing
import os
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.gateway import System, create_topic, running_system
from bench.report import CpuMeter, parse_settings, progress
from bench.workload import BODY_SIZE, QUEUES, SCRATCH, print_machine
from services.server.memory_debug import proc_status_kb

TOPIC = "MemorySoak"
SERVICES = ("runner", "commitlog", "indexer", "query", "gateway", "scheduler")
REPORTING = ("query", "gateway")  # the services that write memory reports (services/server/memory_debug.py)
MIB = 1024 * 1024
GROUPS = 3
#: The store's settings: small files, deleted as soon as they are full, so a long run keeps ~1 GB.
STORE_SETTINGS = {
    "MQSTORE_MAPPED_FILE_SIZE_COMMIT_LOG": str(128 * MIB),
    "MQSTORE_FILE_RESERVED_TIME": "0",
    "MQSTORE_DELETE_WHEN": ";".join(f"{h:02d}" for h in range(24)),
    "MQSTORE_MAX_HASH_SLOT_NUM": "250000",
    "MQSTORE_MAX_INDEX_NUM": "1000000",
}
# Counters the client processes share with the sampler (one array per process).
COUNTERS = ("sent", "pulled", "lookups", "not_found", "errors")


# -- the clients ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ClientPlan:
    """What one client process runs (picklable)."""

    target: str
    proc: int
    senders: int
    batchers: int
    consumers: list[tuple[str, int]]  # (group, queue id)
    lookups: int
    send_rate: float  # messages/s of each unary sender
    batch_rate: float  # batches/s of each batch sender
    batch: int
    lookup_rate: float  # calls/s of each lookup client
    keys: int
    seed: int


class _Pacer:
    """Spaces calls ``1/rate`` apart without catching up a backlog (a slow system is not flooded)."""

    def __init__(self, rate: float) -> None:
        self.gap = 1.0 / rate if rate > 0 else 0.0
        self.next = time.monotonic() + random.random() * self.gap

    async def wait(self) -> None:
        now = time.monotonic()
        if self.next > now:
            await asyncio.sleep(self.next - now)
        self.next = max(self.next + self.gap, time.monotonic() - self.gap)


def _client_main(plan: ClientPlan, counters: Any, stop: Any) -> None:
    asyncio.run(_clients(plan, counters, stop))


async def _clients(plan: ClientPlan, counters: Any, stop: Any) -> None:
    from mqstore.client.aio import AsyncConnection, AsyncProducer, AsyncPullConsumer
    from mqstore.client.errors import MqstoreError, NotFoundError
    from mqstore.client.models import OutgoingMessage
    from mqstore.v1 import query_pb2

    rng = random.Random(plan.seed)
    bodies = [rng.randbytes(BODY_SIZE) for _ in range(256)]
    recent: collections.deque[tuple[str, str, str]] = collections.deque(maxlen=4096)  # (uniq, offset id, key)
    counts = [0] * len(COUNTERS)
    sent, pulled, lookups, not_found, errors = range(len(COUNTERS))
    running = True

    def failed(exc: BaseException) -> None:
        counts[errors] += 1
        if counts[errors] <= 5:
            progress(f"client {plan.proc}: {type(exc).__name__}: {exc}")

    async def sender(i: int) -> None:
        pacer = _Pacer(plan.send_rate)
        async with AsyncProducer(plan.target) as producer:
            n = i
            while running:
                await pacer.wait()
                key = f"k{rng.randrange(plan.keys)}"
                try:
                    receipt = await producer.send(TOPIC, bodies[n % len(bodies)], keys=[key], tags="t")
                except MqstoreError as exc:
                    failed(exc)
                    continue
                n += 1
                counts[sent] += 1
                recent.append((receipt.msg_id, receipt.offset_msg_id, key))

    async def batcher(i: int) -> None:
        pacer = _Pacer(plan.batch_rate)
        async with AsyncProducer(plan.target) as producer:
            n = i
            while running:
                await pacer.wait()
                keys = [f"k{rng.randrange(plan.keys)}" for _ in range(plan.batch)]
                messages = [OutgoingMessage(body=bodies[(n + j) % len(bodies)], keys=[key])
                            for j, key in enumerate(keys)]
                try:
                    receipts = await producer.send_batch(TOPIC, messages)
                except MqstoreError as exc:
                    failed(exc)
                    continue
                n += plan.batch
                counts[sent] += len(receipts)
                last = receipts[-1]
                recent.append((last.msg_id, last.offset_msg_id, keys[-1]))

    async def consumer(group: str, queue_id: int) -> None:
        async with AsyncPullConsumer(group, TOPIC, plan.target, queue_ids=[queue_id], long_poll_ms=2000,
                                     batch_size=64, commit_interval_s=1.0, from_latest=True) as pull:
            while running:
                try:
                    got = await pull.poll(64, timeout=2.0)  # not inside +=: that reads the count before awaiting
                    counts[pulled] += len(got)
                except MqstoreError as exc:
                    failed(exc)
                    await asyncio.sleep(0.5)

    async def lookup(i: int) -> None:
        pacer = _Pacer(plan.lookup_rate)
        connection = AsyncConnection(plan.target)
        try:
            for k in itertools.count(i):
                if not running:
                    break
                await pacer.wait()
                if not recent:
                    continue
                uniq, offset_id, key = recent[rng.randrange(len(recent))]
                what = k % 3
                try:
                    if what == 0:
                        await connection.call("GetMessage", query_pb2.ViewMessageRequest(msg_id=offset_id, kind=1))
                    elif what == 1:
                        await connection.call("GetMessage", query_pb2.ViewMessageRequest(
                            msg_id=uniq, topic=TOPIC, kind=2))
                    else:
                        await connection.call("QueryByKey", query_pb2.QueryMessageRequest(
                            topic=TOPIC, key=key, max_num=32))
                    counts[lookups] += 1
                except NotFoundError:
                    counts[not_found] += 1  # its commitlog file expired already
                except MqstoreError as exc:
                    failed(exc)
        finally:
            await connection.close()

    async def publish() -> None:
        nonlocal running
        while running:
            await asyncio.sleep(0.5)
            for j, value in enumerate(counts):
                counters[j] = value
            if stop.is_set():
                running = False

    tasks = [asyncio.create_task(sender(i)) for i in range(plan.senders)]
    tasks += [asyncio.create_task(batcher(i)) for i in range(plan.batchers)]
    tasks += [asyncio.create_task(consumer(g, q)) for g, q in plan.consumers]
    tasks += [asyncio.create_task(lookup(i)) for i in range(plan.lookups)]
    await publish()
    done, pending = await asyncio.wait(tasks, timeout=15)
    for task in pending:
        task.cancel()
    for task in done:
        if not task.cancelled() and task.exception() is not None:
            failed(task.exception())  # type: ignore[arg-type]
    for j, value in enumerate(counts):
        counters[j] = value


def plan_clients(target: str, clients: int, procs: int, rate: float, batch: int, lookup_rate: float,
                 keys: int) -> list[ClientPlan]:
    """``clients`` split 1/4 unary senders, 1/8 batch senders, 3/8 consumers, 1/4 lookups; unary and
    batch senders each carry half of ``rate``."""
    senders = max(1, clients // 4)
    batchers = max(1, clients // 8)
    lookups = max(1, clients // 4)
    consumers = max(1, clients - senders - batchers - lookups)
    pairs = [(f"soak-group-{c // QUEUES % GROUPS}", c % QUEUES) for c in range(consumers)]
    send_rate = rate / 2 / senders
    batch_rate = rate / 2 / batch / batchers
    per_lookup = lookup_rate / lookups

    def share(total: int, p: int) -> int:
        return total // procs + (1 if p < total % procs else 0)

    plans = []
    for p in range(procs):
        plans.append(ClientPlan(target, p, share(senders, p), share(batchers, p), pairs[p::procs],
                                share(lookups, p), send_rate, batch_rate, batch, per_lookup, keys, seed=p))
    return plans


# -- sampling ------------------------------------------------------------------------------------------------
def last_report(directory: Path, service: str, pid: int) -> dict[str, Any]:
    """The newest line of a service's memory report ({} if there is none yet)."""
    path = directory / f"{service}-{pid}.jsonl"
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - 65536))
            lines = handle.read().splitlines()
        return dict(json.loads(lines[-1])) if lines else {}
    except (OSError, ValueError, IndexError):
        return {}


def store_bytes(root: Path) -> int:
    total = 0
    for directory, _, files in os.walk(root):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.stat(os.path.join(directory, name)).st_blocks * 512
    return total


CSV_FIELDS = ["elapsed_s", "service", "pid", "rss_kb", "anon_kb", "file_kb", "shmem_kb", "py_blocks", "malloc_used_kb",
              "malloc_free_kb", "malloc_mmap_kb", "gc_objects", "store_mb", "sent", "pulled", "lookups", "load1"]


@dataclass
class Sample:
    elapsed_s: float
    service: str
    rss_kb: int
    anon_kb: int


def slope_mb_per_min(points: Sequence[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, KiB) points, in MiB per minute (0 for fewer than 2 points)."""
    if len(points) < 2:
        return 0.0
    n = len(points)
    mean_t = sum(t for t, _ in points) / n
    mean_v = sum(v for _, v in points) / n
    var = sum((t - mean_t) ** 2 for t, _ in points)
    if var == 0:
        return 0.0
    cov = sum((t - mean_t) * (v - mean_v) for t, v in points)
    return cov / var * 60 / 1024


@dataclass
class Verdict:
    service: str
    rss_start: float
    rss_peak: float
    rss_end: float
    rss_slope: float
    anon_start: float
    anon_peak: float
    anon_end: float
    anon_slope: float
    verdict: str


def summarise(samples: Sequence[Sample], threshold: float) -> list[Verdict]:
    """Per service: start, peak, end (MiB) and last-half slopes (MiB/min) of RSS and RssAnon; the
    verdict from the RssAnon slope."""
    verdicts = []
    for service in dict.fromkeys(s.service for s in samples):
        mine = [s for s in samples if s.service == service]
        half = mine[-1].elapsed_s / 2
        last = [s for s in mine if s.elapsed_s >= half]
        anon_slope = slope_mb_per_min([(s.elapsed_s, s.anon_kb) for s in last])
        verdicts.append(Verdict(
            service, mine[0].rss_kb / 1024, max(s.rss_kb for s in mine) / 1024, mine[-1].rss_kb / 1024,
            slope_mb_per_min([(s.elapsed_s, s.rss_kb) for s in last]),
            mine[0].anon_kb / 1024, max(s.anon_kb for s in mine) / 1024, mine[-1].anon_kb / 1024, anon_slope,
            "grows" if anon_slope > threshold else "levels off"))
    return verdicts


def print_verdicts(verdicts: Sequence[Verdict]) -> None:
    print("\n| service | RSS start / peak / end MB | RSS slope, last half MB/min | RssAnon start / peak / end MB "
          "| RssAnon slope, last half MB/min | verdict |")
    print("|---|---|---|---|---|---|")
    for v in verdicts:
        print(f"| {v.service} | {v.rss_start:.0f} / {v.rss_peak:.0f} / {v.rss_end:.0f} | {v.rss_slope:+.2f} | "
              f"{v.anon_start:.0f} / {v.anon_peak:.0f} / {v.anon_end:.0f} | {v.anon_slope:+.2f} | {v.verdict} |")
    sys.stdout.flush()


def run(args: argparse.Namespace) -> list[Verdict]:
    scratch_reports = Path(args.csv).resolve().with_suffix(".reports")
    Path(args.csv).resolve().parent.mkdir(parents=True, exist_ok=True)
    settings = {**STORE_SETTINGS, **args.settings,
                "MQSTORE_MEMORY_REPORT_DIR": str(scratch_reports),
                "MQSTORE_MEMORY_REPORT_INTERVAL_S": str(args.interval),
                "MQSTORE_MEMORY_REPORT_TYPES_EVERY": str(args.heap_types)}
    if args.tracemalloc:
        settings["PYTHONTRACEMALLOC"] = str(args.tracemalloc)
    if args.malloc_arena_max:
        settings["MALLOC_ARENA_MAX"] = str(args.malloc_arena_max)
    plans: list[ClientPlan] = []
    samples: list[Sample] = []
    ctx = multiprocessing.get_context("spawn")
    with running_system(settings, args.keep_store) as system, open(args.csv, "w", newline="") as out:
        writer = csv.DictWriter(out, CSV_FIELDS)
        writer.writeheader()
        create_topic(system.gateway, TOPIC)
        pids = {"runner": system.proc.pid, **system.children}
        plans = plan_clients(system.gateway, args.clients, args.procs, args.rate, args.batch, args.lookup_rate,
                             args.keys)
        stop = ctx.Event()
        counters = [ctx.Array("q", len(COUNTERS), lock=False) for _ in plans]
        workers = [ctx.Process(target=_client_main, args=(plan, counters[i], stop), name=f"soak-client-{i}",
                               daemon=True) for i, plan in enumerate(plans)]
        for worker in workers:
            worker.start()
        progress(f"{args.clients} clients in {args.procs} processes for {args.minutes:g} min; samples every "
                 f"{args.interval:g} s to {args.csv}")
        cpu = CpuMeter([*pids.values(), *(w.pid for w in workers if w.pid)], include_self=False)
        loads: list[float] = []
        started = time.monotonic()
        end = started + args.minutes * 60
        next_sample = started
        try:
            while True:
                now = time.monotonic()
                if now >= next_sample:
                    loads.append(os.getloadavg()[0])
                    _sample(writer, system, pids, counters, now - started, scratch_reports, samples, loads[-1])
                    out.flush()
                    next_sample += args.interval
                if now >= end:
                    break
                if system.proc.poll() is not None:
                    raise RuntimeError(f"mqstore up exited with {system.proc.returncode}:\n{system.log_tail()}")
                dead = [w.name for w in workers if not w.is_alive()]
                if dead:
                    raise RuntimeError(f"client processes {dead} died")
                time.sleep(min(1.0, max(0.0, min(next_sample, end) - time.monotonic())))
        finally:
            stop.set()
            for worker in workers:
                worker.join(30)
                if worker.is_alive():
                    worker.kill()
                    worker.join()
        used = cpu.stop()
        totals = [sum(c[j] for c in counters) for j in range(len(COUNTERS))]
        minutes = (time.monotonic() - started) / 60
        print(f"load: {used['cpuOurs']:.2f} cores used by the soak (system and clients), {used['cpuOther']:.2f} "
              f"by other processes; 1-minute load average {min(loads):.2f}..{max(loads):.2f} "
              f"(mean {sum(loads) / len(loads):.2f})")
        print(f"traffic: {totals[0]:,} messages sent ({totals[0] / minutes / 60:,.0f}/s), {totals[1]:,} pulled, "
              f"{totals[2]:,} lookups answered ({totals[3]:,} not found: expired), {totals[4]:,} client errors")
    verdicts = summarise(samples, args.threshold)
    print_verdicts(verdicts)
    print(f"samples: {args.csv}; service memory reports: {scratch_reports}/")
    return verdicts


def _sample(writer: csv.DictWriter[str], system: System, pids: dict[str, int], counters: Sequence[Any],
            elapsed: float, reports: Path, samples: list[Sample], load1: float) -> None:
    totals = [sum(c[j] for c in counters) for j in range(len(COUNTERS))]
    store_mb = round(store_bytes(system.store) / MIB, 1)
    for service in SERVICES:
        pid = pids[service]
        status = proc_status_kb(pid)
        if not status:
            continue
        row: dict[str, Any] = {"elapsed_s": round(elapsed, 1), "service": service, "pid": pid, **status,
                               "store_mb": store_mb, "sent": totals[0], "pulled": totals[1], "lookups": totals[2],
                               "load1": round(load1, 2)}
        if service in REPORTING:
            report = last_report(reports, service, pid)
            row.update({k: report.get(k, "") for k in ("py_blocks", "malloc_used_kb", "malloc_free_kb",
                                                       "malloc_mmap_kb", "gc_objects")})
        writer.writerow(row)
        samples.append(Sample(elapsed, service, status.get("rss_kb", 0), status.get("anon_kb", 0)))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.memory_soak", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=30.0, help="length of the run (default 30)")
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between samples (default 5)")
    parser.add_argument("--clients", type=int, default=64, help="clients in all (default 64, at most 64)")
    parser.add_argument("--procs", type=int, default=2, help="client processes (default 2)")
    parser.add_argument("--rate", type=float, default=1000.0, help="messages sent per second (default 1000)")
    parser.add_argument("--batch", type=int, default=64, help="messages per SendBatch (default 64)")
    parser.add_argument("--lookup-rate", type=float, default=200.0, help="lookups per second (default 200)")
    parser.add_argument("--keys", type=int, default=2000, help="distinct KEYS values (default 2000)")
    parser.add_argument("--threshold", type=float, default=0.5,
                        help="RssAnon slope (MB/min) over the last half above which a service grows (default 0.5)")
    parser.add_argument("--csv", default=str(SCRATCH / "memory-soak.csv"),
                        help="where the samples go (default .bench-tmp/memory-soak.csv; the services' memory reports "
                             "go to a .reports directory beside it)")
    parser.add_argument("--heap-types", type=int, default=12, metavar="N",
                        help="the services' reports count live objects by type every N samples (0: never; "
                             "default 12)")
    parser.add_argument("--tracemalloc", type=int, default=0, metavar="FRAMES",
                        help="run the services under tracemalloc (PYTHONTRACEMALLOC=FRAMES): their reports then "
                             "name the allocation sites that grew. Slows them severalfold: diagnosis only")
    parser.add_argument("--malloc-arena-max", type=int, default=0, metavar="N",
                        help="MALLOC_ARENA_MAX for the services (default: glibc's own)")
    parser.add_argument("--keep-store", action="store_true", help="keep the store directory")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="any other store setting, e.g. --set flushIntervalCommitLog=1000 (repeatable)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.settings = parse_settings(parser, args.set)
    if not 1 <= args.clients <= 64:
        parser.error("--clients must be within 1..64 (the machine is shared)")
    if args.minutes <= 0 or args.interval <= 0 or args.rate <= 0 or args.procs <= 0:
        parser.error("--minutes, --interval, --rate and --procs must be positive")
    if not 1 <= args.batch <= 1024:
        parser.error("--batch must be within 1..1024")
    print_machine(", server: mqstore up (gateway + commitlog + indexer + query)")
    print(f"command: python -m bench.memory_soak {' '.join(argv if argv is not None else sys.argv[1:])}")
    print(f"load average before the run: {' '.join(f'{v:.2f}' for v in os.getloadavg())}", flush=True)
    run(args)
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        raise SystemExit(main())
