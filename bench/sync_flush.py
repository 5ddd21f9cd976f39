"""SYNC_FLUSH with many concurrent producers: each put_message returns only after the fdatasync that
covers it (group commit), so throughput is how many messages one flush can acknowledge.

    python -m bench.sync_flush                                   # 64 producers, 15 s, gather 200 µs
    python -m bench.sync_flush --gather-us 0,100,200,500 --reps 3
    python -m bench.sync_flush --duration 30 --producers 4

Every fdatasync/fsync of the process is counted by wrapping ``os.fdatasync``/``os.fsync`` in the
benchmark process (the engine calls them through the ``os`` module), so the table shows fsyncs/s and
messages acknowledged per fsync. The wrap costs a clock read per fsync; nothing in services/ changes.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import threading
import time
from array import array
from collections.abc import Callable, Sequence
from typing import Any

from bench.report import (
    CpuMeter,
    RepResult,
    add_common_args,
    emit_json,
    group_by_case,
    median_of,
    parse_settings,
    percentile,
    print_summary,
    print_table,
    profiler,
    progress,
    wait_quiet,
)
from bench.workload import BODY_SIZE, RECORD_SIZE, TOPIC, Workload, drop_caches, print_machine, scratch_dir
from services.commitlog.message_store import MessageStore
from services.commitlog.put_batcher import PutBatcher
from services.commitlog.put_result import PutMessageStatus
from services.store.config import SYNC_FLUSH, load_config
from services.store.formats.message import Message

GIB = 1024 * 1024 * 1024
PUT_OK = PutMessageStatus.PUT_OK


class FsyncCounter:
    """Counts and times os.fdatasync / os.fsync calls while installed."""

    def __init__(self) -> None:
        self.durations: array[int] = array("q")
        self.counting = False
        self._originals: dict[str, Callable[[int], None]] = {}

    def install(self) -> None:
        for name in ("fdatasync", "fsync"):
            original: Callable[[int], None] = getattr(os, name)
            self._originals[name] = original
            setattr(os, name, self._wrap(original))

    def _wrap(self, original: Callable[[int], None]) -> Callable[[int], None]:
        clock, durations = time.perf_counter_ns, self.durations

        def timed(fd: int) -> None:
            t0 = clock()
            try:
                original(fd)
            finally:
                if self.counting:
                    durations.append(clock() - t0)  # one C call: atomic under the GIL
        return timed

    def uninstall(self) -> None:
        for name, original in self._originals.items():
            setattr(os, name, original)
        self._originals.clear()


class _Producer:
    def __init__(self, messages: Sequence[Message], put: Callable[[Message], Any]) -> None:
        self.messages = messages
        self.put = put
        self.latencies: array[int] = array("q")
        self.done = self.failed = 0
        self.error: BaseException | None = None

    def run(self, barrier: threading.Barrier, stop: threading.Event) -> None:
        put, clock, append = self.put, time.perf_counter_ns, self.latencies.append
        done = failed = 0
        barrier.wait()
        try:
            for msg in self.messages:
                t0 = clock()
                result = put(msg)
                append(clock() - t0)
                done += 1
                if result.status is not PUT_OK:
                    failed += 1
                if stop.is_set():
                    break
        except BaseException as exc:  # reported by the main thread
            self.error = exc
        self.done, self.failed = done, failed


def run_asyncio_producers(engine: MessageStore, messages: Sequence[Message], producers: int,
                          duration_s: float) -> list[_Producer]:
    """The producers as coroutines sharing a PutBatcher (the gRPC service's Append path): each awaits
    its own acknowledgement, after the group-commit fsync, one message at a time."""
    workers = [_Producer(messages[i::producers], engine.put_message) for i in range(producers)]

    async def produce(worker: _Producer, batcher: PutBatcher, deadline: float) -> None:
        clock, append = time.perf_counter_ns, worker.latencies.append
        for msg in worker.messages:
            t0 = clock()
            result = await batcher.put(msg)
            append(clock() - t0)
            worker.done += 1
            if result.status is not PUT_OK:
                worker.failed += 1
            if time.perf_counter() > deadline:
                break

    async def main() -> None:
        batcher = PutBatcher(engine)
        batcher.start()
        deadline = time.perf_counter() + duration_s
        await asyncio.gather(*(produce(w, batcher, deadline) for w in workers))
        await batcher.close()

    asyncio.run(main())
    return workers


def run_rep(case: str, rep: int, args: argparse.Namespace, gather_us: int, counter: FsyncCounter) -> RepResult:
    producers = args.producers
    workload = Workload.fresh(args.body_pool)
    messages = workload.messages(0, args.messages)
    env = {**args.settings, "MQSTORE_FLUSH_DISK_TYPE": SYNC_FLUSH,
           "MQSTORE_MAPPED_FILE_SIZE_COMMIT_LOG": str(args.file_size),
           "MQSTORE_GROUP_COMMIT_GATHER_US": str(gather_us)}
    config = load_config(environ=env)
    if args.drop_caches and not drop_caches():
        progress("warning: could not drop caches (not root?)")
    wait_quiet(args.wait_quiet)
    with scratch_dir("sync-", args.keep_store) as root:
        engine = MessageStore(config, root)
        engine.start()
        try:
            probe = engine.put_message(Message(TOPIC, 0, b"x"))  # creates the topic: not timed
            assert probe.status is PUT_OK
            base = engine.max_offset
            if args.kind == "asyncio":
                gc.collect()
                gc.freeze()
                del counter.durations[:]
                counter.counting = True
                meter = CpuMeter()
                started = time.perf_counter()
                workers = run_asyncio_producers(engine, messages, producers, args.duration)
                seconds = time.perf_counter() - started
                counter.counting = False
                cpu = meter.stop()
                wrote = engine.max_offset - base
                return _result(case, rep, workers, seconds, wrote, counter, cpu, producers, gather_us)
            workers = [_Producer(messages[i::producers], engine.put_message) for i in range(producers)]
            barrier = threading.Barrier(producers + 1)
            stop = threading.Event()
            threads = [threading.Thread(target=w.run, args=(barrier, stop), name=f"producer-{i}")
                       for i, w in enumerate(workers)]
            gc.collect()
            gc.freeze()
            for t in threads:
                t.start()
            del counter.durations[:]
            prof = profiler(args.profile, os.getpid(), f"{case}-{rep}")
            barrier.wait()
            counter.counting = True
            meter = CpuMeter()
            started = time.perf_counter()
            deadline = started + args.duration
            while time.perf_counter() < deadline and any(t.is_alive() for t in threads):
                time.sleep(0.05)
            stop.set()
            for t in threads:
                t.join()
            seconds = time.perf_counter() - started
            counter.counting = False
            cpu = meter.stop()
            if prof is not None:
                prof.stop()
            for w in workers:
                if w.error is not None:
                    raise RuntimeError(f"a producer failed: {w.error!r}") from w.error
            wrote = engine.max_offset - base
        finally:
            counter.counting = False
            engine.shutdown()
            gc.unfreeze()
    return _result(case, rep, workers, seconds, wrote, counter, cpu, producers, gather_us)


def _result(case: str, rep: int, workers: list[_Producer], seconds: float, wrote: int, counter: FsyncCounter,
            cpu: dict[str, Any], producers: int, gather_us: int) -> RepResult:
    msgs = sum(w.done for w in workers)
    if wrote < msgs * RECORD_SIZE:
        raise RuntimeError(f"the log grew by {wrote} bytes for {msgs} records of {RECORD_SIZE} B")
    fsyncs = sorted(counter.durations)
    extra = {"producers": producers, "gatherUs": gather_us, "fsyncs": len(fsyncs),
             "fsyncsPerSec": round(len(fsyncs) / seconds, 1),
             "msgsPerFsync": round(msgs / len(fsyncs), 1) if fsyncs else None,
             "fsyncP50Us": round(percentile(fsyncs, 50) / 1000, 1),
             "fsyncP99Us": round(percentile(fsyncs, 99) / 1000, 1), **cpu}
    return RepResult(case, rep, msgs, seconds, msgs * RECORD_SIZE, msgs * BODY_SIZE,
                     array("q", b"".join(w.latencies.tobytes() for w in workers)), 1,
                     sum(w.failed for w in workers), extra)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.sync_flush", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--producers", type=int, default=64, help="concurrent producers (default 64)")
    parser.add_argument("--kind", choices=("threads", "asyncio"), default="threads",
                        help="producers as OS threads calling put_message, or as coroutines sharing a PutBatcher "
                             "(the gRPC service's path); default threads")
    parser.add_argument("--duration", type=float, default=15.0,
                        help="seconds per rep (default 15; the RocketMQ anchor used 30)")
    parser.add_argument("--messages", type=int, default=1_000_000, help="cap of messages per rep (default 1,000,000)")
    parser.add_argument("--gather-us", default="200",
                        help="comma list of groupCommitGatherUs values to try (default 200; e.g. 0,100,200,500)")
    parser.add_argument("--file-size", type=int, default=GIB, help="mappedFileSizeCommitLog (default 1 GiB)")
    parser.add_argument("--body-pool", type=int, default=8192, help="distinct random bodies per rep (default 8192)")
    add_common_args(parser)
    args = parser.parse_args(argv)
    args.settings = parse_settings(parser, args.set)
    gathers = [int(g) for g in args.gather_us.split(",")]

    print_machine()
    print(f"workload: SYNC_FLUSH, {args.producers} producers x put_message, {args.duration:g}s or "
          f"{args.messages:,} msgs per rep, record {RECORD_SIZE} B, gather {gathers} µs, reps {args.reps}", flush=True)
    counter = FsyncCounter()
    counter.install()
    results: list[RepResult] = []
    try:
        for gather in gathers:
            case = f"sync {args.kind} x{args.producers} gather{gather}"
            for rep in range(1, args.reps + 1):
                r = run_rep(case, rep, args, gather, counter)
                progress(f"{case} rep {rep}: {r.msgs_per_s:,.0f} msgs/s, p50 {r.call_p50_us:.0f} µs, "
                         f"p99 {r.call_p99_us:.0f} µs, {r.extra['fsyncs']} fsyncs "
                         f"({r.extra['msgsPerFsync']} msgs each), cpu other {r.extra['cpuOther']}")
                results.append(r)
    finally:
        counter.uninstall()
    extra = [("fsyncs/s", lambda r: r.extra["fsyncsPerSec"], "{:,.0f}"),
             ("msgs/fsync", lambda r: r.extra["msgsPerFsync"], "{:.1f}"),
             ("fsync p50 µs", lambda r: r.extra["fsyncP50Us"], "{:.0f}"),
             ("fsync p99 µs", lambda r: r.extra["fsyncP99Us"], "{:.0f}")]
    print_table("sync_flush: every rep", results, extra)
    print_summary(results, extra)
    if len(gathers) > 1:
        cases = group_by_case(results)
        best = max(cases, key=lambda c: median_of(cases[c], lambda r: r.msgs_per_s))
        print(f"\nbest groupCommitGatherUs: {cases[best][0].extra['gatherUs']} "
              f"({median_of(cases[best], lambda r: r.msgs_per_s):,.0f} msgs/s median)")
    if args.json:
        emit_json("sync_flush", results, {k: v for k, v in vars(args).items() if k != "json"})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
