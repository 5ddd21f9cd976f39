"""In-process CommitLog append throughput: put_message one at a time, or put_messages batches.

    python -m bench.append_engine                       # 1M msgs, single and batch64, 1 thread, 3 reps
    python -m bench.append_engine --threads 1,4 --modes batch --reps 3
    python -m bench.append_engine --transient-store-pool --modes single,batch

Each rep uses a fresh store (fresh random bodies too) under <repo>/.bench-tmp, ASYNC_FLUSH and 1 GiB
files by default, so 1,000,000 records of 1188 B cross into the second file as in the RocketMQ anchor.
The clock runs from the first put to the last put returning (puts only, as the anchor); the shutdown
(the final flush of what the flush service had not yet flushed) is reported beside it.
"""

from __future__ import annotations

import argparse
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
    parse_settings,
    print_summary,
    print_table,
    profiler,
    progress,
    wait_quiet,
)
from bench.workload import (
    BODY_SIZE,
    RECORD_SIZE,
    TOPIC,
    Workload,
    chunks,
    drop_caches,
    print_machine,
    scratch_dir,
)
from services.commitlog.message_store import MessageStore
from services.commitlog.put_result import PutMessageStatus
from services.store.config import ASYNC_FLUSH, SYNC_FLUSH, load_config
from services.store.formats.message import Message

GIB = 1024 * 1024 * 1024
PUT_OK = PutMessageStatus.PUT_OK


class _Worker:
    """One producer thread: its calls (a message or a batch each), timed one by one."""

    def __init__(self, calls: Sequence[Any], put: Callable[[Any], Any], batched: bool, deadline_ns: int) -> None:
        self.calls = calls
        self.put = put
        self.batched = batched
        self.deadline_ns = deadline_ns
        self.latencies: array[int] = array("q")
        self.msgs = 0
        self.failed = 0
        self.wrote_bytes = 0
        self.started = self.ended = 0
        self.error: BaseException | None = None

    def run(self, barrier: threading.Barrier) -> None:
        put, lat, clock, deadline = self.put, self.latencies, time.perf_counter_ns, self.deadline_ns
        append = lat.append
        failed = 0
        done = 0
        barrier.wait()
        self.started = start = clock()
        deadline += start
        try:
            if self.batched:
                for batch in self.calls:
                    t0 = clock()
                    results = put(batch)
                    t1 = clock()
                    append(t1 - t0)
                    done += len(batch)
                    if results[-1].status is not PUT_OK:
                        failed += sum(1 for r in results if r.status is not PUT_OK)
                    if t1 > deadline:
                        break
            else:
                for msg in self.calls:
                    t0 = clock()
                    result = put(msg)
                    t1 = clock()
                    append(t1 - t0)
                    done += 1
                    if result.status is not PUT_OK:
                        failed += 1
                    if t1 > deadline:
                        break
        except BaseException as exc:  # reported by the main thread
            self.error = exc
        self.ended = clock()
        self.msgs, self.failed = done, failed


MADV_POPULATE_READ = 22  # Linux >= 5.14; Python 3.11's mmap module has no name for it


def prefault(engine: MessageStore) -> None:
    """What-if experiment, not what the engine does: fill the page cache of the current and the
    pre-created next commitlog file before the clock starts (madvise MADV_POPULATE_READ), so appends
    no longer take the first-touch page faults that zero fresh file pages."""
    started = time.perf_counter()
    files = [engine.commit_log.mfq.last_file()]
    pending = getattr(engine.commit_log.mfq, "_next", None)  # private: the background-created next file
    if pending is not None:
        files.append(pending[1].result())
    for mapped in files:
        if mapped is not None:
            mapped.buffer.madvise(MADV_POPULATE_READ, 0, mapped.file_size)
    progress(f"prefaulted {len(files)} files in {time.perf_counter() - started:.2f}s")


def run_rep(case: str, rep: int, args: argparse.Namespace, mode: str, threads: int, pool: bool) -> RepResult:
    batched = mode == "batch"
    workload = Workload.fresh(args.body_pool)
    per_thread = [workload.messages(t * args.messages // threads, (t + 1) * args.messages // threads
                                    - t * args.messages // threads) for t in range(threads)]
    calls: list[Sequence[Any]] = [chunks(msgs, args.batch) if batched else msgs for msgs in per_thread]
    config = load_config(environ={**args.settings, "MQSTORE_FLUSH_DISK_TYPE": args.flush,
                                  "MQSTORE_MAPPED_FILE_SIZE_COMMIT_LOG": str(args.file_size),
                                  "MQSTORE_TRANSIENT_STORE_POOL_ENABLE": str(pool)})
    if args.drop_caches and not drop_caches():
        progress("warning: could not drop caches (not root?)")
    wait_quiet(args.wait_quiet)
    with scratch_dir("engine-", args.keep_store) as root:
        engine = MessageStore(config, root)
        engine.start()
        try:
            put: Callable[[Any], Any] = engine.put_messages if batched else engine.put_message
            probe = engine.put_message(Message(TOPIC, 0, b"x"))  # creates the topic (a config write): not timed
            base = engine.max_offset
            assert probe.status is PUT_OK
            if args.prefault:
                prefault(engine)
            barrier = threading.Barrier(threads)
            deadline_ns = int(args.duration * 1e9)
            workers = [_Worker(c, put, batched, deadline_ns) for c in calls]
            gc.collect()
            gc.freeze()  # the pre-built messages are harness data: keep them out of the GC's generations
            pool_threads = [threading.Thread(target=w.run, args=(barrier,), name=f"producer-{i}")
                            for i, w in enumerate(workers)]
            prof = profiler(args.profile, os.getpid(), f"{case}-{rep}")
            meter = CpuMeter()
            for t in pool_threads:
                t.start()
            for t in pool_threads:
                t.join()
            cpu = meter.stop()
            if prof is not None:
                prof.stop()
            for w in workers:
                if w.error is not None:
                    raise RuntimeError(f"a producer failed: {w.error!r}") from w.error
            seconds = (max(w.ended for w in workers) - min(w.started for w in workers)) / 1e9
            msgs = sum(w.msgs for w in workers)
            t0 = time.perf_counter()
        finally:
            engine.shutdown()
            gc.unfreeze()
        shutdown_s = time.perf_counter() - t0
        wrote = engine.max_offset - base  # after shutdown: with the pool, everything is committed by now
    files = -(-wrote // args.file_size)
    # Records never cross a file: every file but the last ends in a BLANK filler, which is not data.
    stored = msgs * RECORD_SIZE
    if not stored <= wrote < stored + files * RECORD_SIZE + args.file_size:
        raise RuntimeError(f"the log grew by {wrote} bytes for {msgs} records of {RECORD_SIZE} B")
    return RepResult(case, rep, msgs, seconds, stored, msgs * BODY_SIZE,
                     array("q", b"".join(w.latencies.tobytes() for w in workers)),
                     args.batch if batched else 1, sum(w.failed for w in workers),
                     {"threads": threads, "shutdownSec": round(shutdown_s, 3), **cpu})


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.append_engine", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=1_000_000, help="messages per rep (default 1,000,000)")
    parser.add_argument("--duration", type=float, default=30.0, help="cap per rep in seconds (default 30)")
    parser.add_argument("--modes", default="single,batch",
                        help="comma list of single (put_message) and batch (put_messages); default both")
    parser.add_argument("--batch", type=int, default=64, help="messages per put_messages call (default 64)")
    parser.add_argument("--threads", default="1", help="comma list of producer thread counts (default 1)")
    parser.add_argument("--flush", choices=(ASYNC_FLUSH, SYNC_FLUSH), default=ASYNC_FLUSH)
    parser.add_argument("--file-size", type=int, default=GIB, help="mappedFileSizeCommitLog (default 1 GiB)")
    parser.add_argument("--transient-store-pool", action="store_true",
                        help="transientStorePoolEnable (appends go to a pooled buffer, committed later)")
    parser.add_argument("--prefault", action="store_true",
                        help="experiment: populate the page cache of the files before timing (not engine behaviour)")
    parser.add_argument("--both-pool-settings", action="store_true", help="run every case with and without the pool")
    parser.add_argument("--body-pool", type=int, default=8192, help="distinct random bodies per rep (default 8192)")
    add_common_args(parser)
    args = parser.parse_args(argv)
    args.settings = parse_settings(parser, args.set)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if any(m not in ("single", "batch") for m in modes):
        parser.error("--modes takes single and/or batch")
    thread_counts = [int(t) for t in args.threads.split(",")]
    pools = [False, True] if args.both_pool_settings else [args.transient_store_pool]

    print_machine()
    print(f"workload: {args.messages:,} msgs/rep (cap {args.duration:g}s), body {BODY_SIZE} B, record {RECORD_SIZE} B, "
          f"1 topic x 8 queues, {args.flush}, files {args.file_size:,} B, reps {args.reps}", flush=True)
    results: list[RepResult] = []
    flush = "async" if args.flush == ASYNC_FLUSH else "sync"
    for pool in pools:
        for threads in thread_counts:
            for mode in modes:
                case = f"{flush} {'single' if mode == 'single' else f'batch{args.batch}'} t{threads}" + \
                       (" pool" if pool else "") + (" prefault" if args.prefault else "")
                for rep in range(1, args.reps + 1):
                    r = run_rep(case, rep, args, mode, threads, pool)
                    progress(f"{case} rep {rep}: {r.msgs_per_s:,.0f} msgs/s, {r.seconds:.2f}s, "
                             f"call p50 {r.call_p50_us:.1f} µs p99 {r.call_p99_us:.1f} µs, "
                             f"shutdown {r.extra['shutdownSec']:.2f}s")
                    results.append(r)
    extra = [("shutdown s", lambda r: r.extra["shutdownSec"], "{:.2f}")]
    print_table("append_engine: every rep", results, extra)
    print_summary(results, extra)
    if args.json:
        emit_json("append_engine", results, {k: v for k, v in vars(args).items() if k != "json"})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
