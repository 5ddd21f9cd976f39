"""Cost as the store grows: 100,000 topics x 8 queues and 100,000 committed offsets on one shard.

    python -m bench.topic_scale                          # 100,000 topics, 100,000 offsets (long: minutes)
    python -m bench.topic_scale --topics 20000 --offsets 20000 --every 5000
    python -m bench.topic_scale --quick                  # 2,000 of each: checks the harness

A fresh ``mqstore up`` (bench/gateway.py's System, a store under .bench-tmp/) gets CreateTopic calls
through the gateway, one at a time (each timed), then CommitOffset calls (groups ``scale-g<n>``, each
committing the 8 queues of a preloaded topic), and prints at every ``--every`` calls: the calls so far, p50, p99
and max of the last window, and each service's resident anonymous memory. Then the system is stopped cleanly
and started again on the same store, and the restart is timed up to "mqstore is up" and to the
first answered ListTopics and QueryOffset of the last topic and group created. Memory per idle queue
is the commitlog, indexer and query services' RSS growth over the run divided by the queues created.
A figure for the issue's goals: CreateTopic p99 <= 5 ms at any count, a clean restart <= 5 s.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import grpc

from bench.gateway import PULL_TOPIC, System, _stub, preload
from bench.report import percentile, progress
from bench.workload import print_machine, scratch_dir
from mqstore.v1 import commitlog_pb2, common_pb2, query_pb2

PROG = "python -m bench.topic_scale"
QUEUES = 8
PRELOAD = 64  # messages per queue of the topic whose offsets are committed
SERVICES = ("commitlog", "indexer", "query", "scheduler", "gateway")


def rss_kib(pid: int) -> int:
    """Resident anonymous memory of ``pid`` in KiB (0 when it is gone): the process's own memory. A
    commitlog's resident file pages (its mapped files, prefaulted ahead of the writer: clean page cache
    the kernel reclaims under pressure) are left out; they grow with the log, not with topics."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def memory(system: System) -> dict[str, int]:
    return {name: rss_kib(pid) for name, pid in system.children.items() if name in SERVICES}


def committed(i: int, per_queue: int) -> int:
    """The offset the ``i``-th commit gives its group on its queue (1..per_queue, varied per group)."""
    return 1 + (i // QUEUES) % per_queue


def topic_name(i: int) -> str:
    return f"scale-topic-{i:06d}"


def timed_calls(what: str, count: int, every: int, call: Callable[[int], None], system: System) -> list[dict]:
    """``count`` calls of ``call(i)``, one at a time; a row per ``every`` calls with the window's figures."""
    rows: list[dict] = []
    window: list[int] = []
    clock = time.perf_counter_ns
    started = time.monotonic()
    for i in range(count):
        t0 = clock()
        call(i)
        window.append(clock() - t0)
        if (i + 1) % every == 0 or i + 1 == count:
            ordered = sorted(window)
            row = {"op": what, "done": i + 1, "p50_ms": percentile(ordered, 50) / 1e6,
                   "p99_ms": percentile(ordered, 99) / 1e6, "max_ms": ordered[-1] / 1e6,
                   "rate": len(window) / max(sum(window) / 1e9, 1e-9), "rss_kib": memory(system)}
            rows.append(row)
            progress(f"{what} {i + 1:,}: p50 {row['p50_ms']:.2f} p99 {row['p99_ms']:.2f} max {row['max_ms']:.1f} ms, "
                     f"{row['rate']:,.0f}/s, {time.monotonic() - started:.0f} s in")
            window = []
    return rows


def run(args: argparse.Namespace) -> int:
    print_machine("")
    with scratch_dir("topic-scale-", args.keep_store) as scratch:
        system = System(scratch, {})
        try:
            system.wait_up()
            per_queue = preload(system, PRELOAD * QUEUES, True)  # offsets are committed up to a queue's max
        except BaseException:
            system.kill()
            raise
        base = memory(system)
        with contextlib.ExitStack() as on_failure, grpc.insecure_channel(system.gateway) as channel:
            on_failure.callback(system.kill)  # a failed or interrupted run leaves no system behind
            stub = _stub(channel)

            def create(i: int) -> None:
                stub.CreateTopic(commitlog_pb2.TopicRequest(topic=common_pb2.TopicConfig(
                    topic=topic_name(i), read_queue_nums=QUEUES, write_queue_nums=QUEUES, perm=6)), timeout=60)

            def commit(i: int) -> None:
                stub.CommitOffset(query_pb2.UpdateConsumerOffsetRequest(
                    consumer_group=f"scale-g{i // QUEUES}", topic=PULL_TOPIC, queue_id=i % QUEUES,
                    offset=committed(i, per_queue)), timeout=60)

            rows = timed_calls("CreateTopic", args.topics, args.every, create, system)
            after_topics = memory(system)
            rows += timed_calls("CommitOffset", args.offsets, args.every, commit, system)
            grown = memory(system)
            on_failure.pop_all()
        stopping = time.monotonic()
        code = system.stop()
        stop_s = time.monotonic() - stopping
        if code != 0:
            raise SystemExit(f"mqstore up exited with {code} at the clean stop:\n{system.log_tail()}")
        restarting = time.monotonic()
        again = System(scratch, {})
        try:
            again.wait_up(timeout_s=600)
            up_s = time.monotonic() - restarting
            last_group = f"scale-g{(args.offsets - 1) // QUEUES}"
            with grpc.insecure_channel(again.gateway) as channel:
                stub = _stub(channel)
                listed = stub.ListTopics(commitlog_pb2.ListTopicsRequest(), timeout=120)
                answered = stub.QueryOffset(query_pb2.QueryConsumerOffsetRequest(
                    consumer_group=last_group, topic=PULL_TOPIC, queue_id=(args.offsets - 1) % QUEUES), timeout=60)
            serving_s = time.monotonic() - restarting
            restarted = memory(again)
        finally:
            again.stop()
    names = {topic_name(i) for i in range(args.topics)}
    found = sum(1 for t in listed.topics if t.topic in names)
    print(f"\n### {args.topics:,} topics x {QUEUES} queues, {args.offsets:,} committed offsets, one shard\n")
    shown = ("commitlog", "indexer", "query", "gateway")
    print(f"| calls | operation | p50 ms | p99 ms | max ms | calls/s | anon RSS MiB ({' / '.join(shown)}) |")
    print("|---:|---|---:|---:|---:|---:|---|")
    for row in rows:
        rss = row["rss_kib"]
        print(f"| {row['done']:,} | {row['op']} | {row['p50_ms']:.2f} | {row['p99_ms']:.2f} | {row['max_ms']:.1f} | "
              f"{row['rate']:,.0f} | {' / '.join(f'{rss.get(s, 0) / 1024:.0f}' for s in shown)} |")
    queues = args.topics * QUEUES
    idle_bytes = {s: (after_topics.get(s, 0) - base.get(s, 0)) * 1024 / queues for s in shown[:3]}
    print(f"\nclean stop {stop_s:.1f} s; restart: up in {up_s:.1f} s, serving (ListTopics of {found:,} of "
          f"{args.topics:,} topics, QueryOffset = {answered.offset}) in {serving_s:.1f} s")
    print("memory per idle queue (RSS growth over the topic creation / queues): "
          + ", ".join(f"{s} {b:,.0f} B" for s, b in idle_bytes.items()))
    print("anon RSS MiB before / after topics / after offsets / after restart: "
          + "; ".join(f"{s} {base.get(s, 0) / 1024:.0f} / {after_topics.get(s, 0) / 1024:.0f} / "
                      f"{grown.get(s, 0) / 1024:.0f} / {restarted.get(s, 0) / 1024:.0f}" for s in SERVICES))
    want = committed(args.offsets - 1, per_queue)
    ok = found == args.topics and answered.offset == want
    if not ok:
        print(f"error: after the restart {found:,} of {args.topics:,} topics listed, last offset "
              f"{answered.offset} (want {want})", file=sys.stderr)
    return 0 if ok else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--topics", type=int, default=100_000, help="topics to create (default 100,000)")
    parser.add_argument("--offsets", type=int, default=100_000, help="offsets to commit (default 100,000)")
    parser.add_argument("--every", type=int, default=10_000, help="a row every this many calls (default 10,000)")
    parser.add_argument("--quick", action="store_true", help="2,000 topics and offsets, a row every 500")
    parser.add_argument("--keep-store", action="store_true", help="keep the scratch directory")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.quick:
        args.topics, args.offsets, args.every = 2000, 2000, 500
    if min(args.topics, args.offsets, args.every) < 1:
        parser.error("--topics, --offsets and --every must be positive")
    return run(args)


if __name__ == "__main__":
    raise SystemExit(main())
