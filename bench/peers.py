"""mqstore side by side with Redis Streams and NATS JetStream, in one run (issue 10's table).

    make bench-peers                                   # every row, 5 s per case (about 10-15 min)
    python -m bench.peers --quick                      # every row tiny: checks the harness (~3 min)
    python -m bench.peers --only produce,pull --reps 3 # some rows, medians of 3 reps
    python -m bench.peers --json                       # also one JSON line with every row

What it does, in order:

1. Installs what is missing: Debian's ``redis-server`` and ``nats-server`` (apt-get, when the binary is
   absent) and the Python clients pinned in bench/requirements-peers.txt (into this .venv).
2. mqstore: a fresh ``mqstore up`` per flush mode (as bench/gateway.py does), its produce cases taken
   from bench/gateway.py (SendBatch 256 and 64, SendStream, one Send at a time; SYNC_FLUSH with 64
   producers: SendBatch 64 and one message per Send), then a third system for the reads: 200,000
   messages preloaded (untimed), ~1M keys indexed for the key rows, and pull / get by offset msg id /
   query by key / SearchOffset through the gateway (bench/peer_mqstore.py).
3. Redis Streams: a private ``redis-server`` (AOF, appendfsync everysec) for the async and read rows and
   another (appendfsync always) for the durable row (bench/peer_redis.py).
4. NATS JetStream: a private ``nats-server -js`` with a file-storage stream (bench/peer_nats.py).
5. The engine in-process append (bench/append_engine.py, single and batch 64) and the crash recovery
   of a 2 GiB commitlog (bench/recovery.py, abnormal), each as a child process.
6. The floor of the stack: a bare grpc.aio echo server (bench/peer_floor.py), unary at 1, 2x16 and
   2x32 calls in flight and streaming (64 KiB frames, 16 unanswered, 2 streams); every row is also
   printed against it (per-call rows: p50 as a multiple, rate as a fraction; streamed rows: rate).

Every server is ours: started on free loopback ports with data dirs under .bench-tmp/peers-*, and
stopped by PID at the end, on failure and on Ctrl-C or SIGTERM. Clients are separate (spawned)
processes on the peers' Python clients or grpc.aio; only what was acknowledged (or found and checked)
counts. The same workload everywhere: 1 KiB random bodies with UNIQ_KEY + CLUSTER, topic TopicTest with
8 queues (8 Redis streams, 8 NATS subjects). The table's ratios are mqstore's figure over the peer's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.peer_servers import FloorServer, NatsServer, RedisServer, ensure_installed, server_version
from bench.peer_table import FLOOR_CASES, GROUPS, Measure, Row, issue_rows, render, select, to_json
from bench.report import progress
from bench.workload import REPO, TOPIC, print_machine, scratch_dir

PROG = "python -m bench.peers"


class Run:
    """The run's settings and what has been measured so far: row key -> system -> one Measure per rep."""

    def __init__(self, args: argparse.Namespace, rows: Sequence[Row]) -> None:
        self.args = args
        self.rows = list(rows)
        self.wanted = {r.key for r in rows}
        self.measures: dict[str, dict[str, list[Measure]]] = {}
        self.notes: dict[str, list[str]] = {}

    def want(self, *keys: str) -> bool:
        return any(k in self.wanted for k in keys)

    def add(self, key: str, system: str, measure: Measure) -> None:
        self.measures.setdefault(key, {}).setdefault(system, []).append(measure)
        rate = f"{measure.rate:,.0f}/s" if measure.rate is not None else ""
        latency = f"p50 {measure.p50_ms:.2f} p99 {measure.p99_ms:.2f} ms" if measure.p50_ms is not None else ""
        seconds = f"{measure.seconds:.2f} s" if measure.seconds is not None else ""
        failed = f", {measure.failed:,} FAILED" if measure.failed else ""
        progress(f"  {key} {system}: {' '.join(x for x in (rate, latency, seconds) if x)} [{measure.mode}]{failed}")

    def note(self, key: str, text: str) -> None:
        if key in self.wanted and text not in self.notes.setdefault(key, []):
            self.notes[key].append(text)

    def filled(self) -> list[Row]:
        for row in self.rows:
            got = self.measures.get(row.key, {})
            for system in ("mqstore", "redis", "nats"):
                if got.get(system):
                    setattr(row, system, Measure.median(got[system]))
            if row.floor_case and (floor := self.measures.get(f"floor:{row.floor_case}", {}).get("floor")):
                row.floor = Measure.median(floor)
            row.notes = self.notes.get(row.key, [])
        return self.rows


# -- mqstore -----------------------------------------------------------------------------------------------
def _gateway_args(run: Run) -> argparse.Namespace:
    from bench import gateway

    a = run.args
    gargs = gateway.build_parser().parse_args([
        "--duration", str(a.duration), "--reps", "1", "--quiet", "--wait-quiet", str(a.wait_quiet),
        "--settle", str(a.settle), "--preload", str(a.preload), "--pull-max", "1024"])
    gargs.settings = {}
    return gargs


def _from_rep(result: Any, mode: str) -> Measure:
    return Measure(rate=result.msgs_per_s, p50_ms=result.call_p50_us / 1000, p99_ms=result.call_p99_us / 1000,
                   mode=mode, failed=result.failed, ops=result.msgs, cpu_other=result.extra.get("cpuOther"))


def _gateway_mode_note(run: Run) -> str:
    """Which of the faster modes this checkout has (other helpers add them; the harness works either way)."""
    from bench.peer_mqstore import pull_mode
    from mqstore.v1 import gateway_pb2

    batch_fields = sorted(f.name for f in gateway_pb2.SendBatchRequest.DESCRIPTOR.fields
                          if f.type == f.TYPE_BYTES)
    service = gateway_pb2.DESCRIPTOR.services_by_name["MessagingService"]
    streamed = sorted(m.name for m in service.methods if m.name not in ("SendStream",) and "Stream" in m.name)
    if run.args.gateway_workers:
        workers = f"{run.args.gateway_workers} (MQSTORE_GATEWAY_WORKERS)"
    else:
        workers = "the default (--gateway-workers N to set)" if _gateway_workers_supported() else "not available"
    return (f"pull: {pull_mode()}; SendBatch bytes fields: {', '.join(batch_fields) or 'none (messages)'}; "
            f"streamed-batch RPCs: {', '.join(streamed) or 'none'}; gateway workers: {workers}")


def _gateway_workers_supported() -> bool:
    from bench.services import mqstore_command

    try:
        out = subprocess.run([mqstore_command(), "up", "--help"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "--gateway-workers" in out.stdout


def mqstore_produce(run: Run) -> None:
    """The produce rows: bench/gateway.py's own cases and reps, or, where this checkout has the faster
    modes (a blob in RocketMQ's batch encoding, SendBatchStream), those (bench/peer_mqstore.py) with
    the same check afterwards: the topic's queues hold exactly what was acknowledged."""
    from bench import gateway
    from bench.peer_mqstore import batch_stream_available, blob_available
    from bench.peer_runner import Job

    gargs = _gateway_args(run)
    d = run.args.duration
    blob, stream = blob_available(), batch_stream_available()
    # (row key, a gateway Case or a Job, procs, mode)
    async_cases: list[tuple[str, Any, int, str]] = []
    for key, size in (("produce-batch256", 256), ("produce-batch64", 64)):
        if not run.want(key):
            continue
        if blob:
            async_cases.append((key, Job("mqstore", "blob", "", d, 4, size), 2,
                                f"SendBatch {size} as one blob (encoded_messages), 2x4 in flight"))
        else:
            async_cases.append((key, gateway.Case(f"batch{size} 2x4", "batch", "batch", 2, 4, size), 2,
                                f"SendBatch {size} (messages), 2x4 in flight"))
    if run.want("produce-stream"):
        if stream:
            async_cases.append(("produce-stream", Job("mqstore", "blob-stream", "", d, 1, 64, data=(16,)), 2,
                                "SendBatchStream of 64-message blobs, 16 unanswered, 2 streams"))
        else:
            async_cases.append(("produce-stream", gateway.Case("stream w512 2x1", "stream", "stream", 2, 1, window=512),
                                2, "SendStream, window 512, 2 streams"))
    if run.want("send-latency"):
        async_cases.append(("send-latency", gateway.Case("send 1x1", "send", "unary", 1, 1), 1, "Send, one at a time"))
    if run.want("send-n"):
        c = run.args.concurrency
        async_cases.append(("send-n", gateway.Case(f"send 2x{c}", "send", "unary", 2, c), 2,
                            f"Send, 2x{c} in flight"))
    sync_cases: list[tuple[str, Any, int, str]] = []
    if run.want("durable-batch64"):
        if blob:
            sync_cases.append(("durable-batch64", Job("mqstore", "blob", "", d, 32, 64), 2,
                               "SYNC_FLUSH SendBatch 64 as one blob, 64 producers"))
        else:
            sync_cases.append(("durable-batch64", gateway.Case("sync batch64 2x32", "sync", "batch", 2, 32, 64), 2,
                               "SYNC_FLUSH SendBatch 64 (messages), 64 producers"))
    if run.want("durable-send"):
        sync_cases.append(("durable-send", gateway.Case("sync send 2x32", "sync", "unary", 2, 32), 2,
                           "SYNC_FLUSH Send, 64 producers"))
    for flush, cases in (("ASYNC_FLUSH", async_cases), ("SYNC_FLUSH", sync_cases)):
        if not cases:
            continue
        progress(f"mqstore: starting mqstore up ({flush}{_workers_text(run)}) for {', '.join(c[0] for c in cases)} ...")
        with gateway.running_system(_settings(run, flush), run.args.keep_store) as system:
            gateway.create_topic(system.gateway, TOPIC)
            gateway.warm_up(system, TOPIC)
            for key, case, procs, mode in cases:
                for rep in range(1, run.args.reps + 1):
                    if isinstance(case, gateway.Case):
                        result = gateway.run_rep(case, rep, gargs, system, TOPIC)
                        run.add(key, "mqstore", _from_rep(result, mode + _workers_text(run)))
                        catch_up = result.extra.get("catchUpSec")
                    else:
                        catch_up = _produce_job(run, key, replace(case, target=system.gateway, mode=mode), procs,
                                                system)
                    if catch_up is not None:
                        run.note(key, f"mqstore dispatch catch-up after the last ack: {catch_up} s")


def _settings(run: Run, flush: str) -> dict[str, str]:
    settings = {"MQSTORE_FLUSH_DISK_TYPE": flush}
    if run.args.gateway_workers:
        settings["MQSTORE_GATEWAY_WORKERS"] = str(run.args.gateway_workers)
    return settings


def _workers_text(run: Run) -> str:
    return f", {run.args.gateway_workers} gateway workers" if run.args.gateway_workers else ""


def _produce_job(run: Run, key: str, job: Any, procs: int, system: Any) -> float:
    """One rep of a produce Job; afterwards the queues must hold what was acked (plus at most the
    messages of failed calls, whose fate is unknown). Returns the dispatch catch-up in seconds."""
    from bench import gateway
    from bench.peer_runner import run_job
    from bench.report import wait_quiet

    gateway.settle(system, run.args.settle)
    if run.args.wait_quiet > 0:
        wait_quiet(run.args.wait_quiet)
    before = sum(gateway.queue_depths(system.gateway, TOPIC))
    measure, extra = run_job(job, procs, system.pids)
    ended = time.monotonic()
    if extra["errors"]:
        progress(f"warning: {key} mqstore: errors, first: {extra['errors'][0]}")
    low = before + measure.ops
    dispatched = gateway.wait_dispatched(system.gateway, TOPIC, low, low + measure.failed)
    run.add(key, "mqstore", replace(measure, mode=measure.mode + _workers_text(run)))
    return round(max(0.0, dispatched - ended), 3)


def mqstore_reads(run: Run) -> None:
    """Pull, get by id, query by key and offset by time through the gateway, on a preloaded store."""
    from bench import gateway
    from bench.peer_mqstore import preload_keys, pull_mode, sample_pulled
    from bench.peer_runner import Job

    if not run.want("pull", "get-1", "get-n", "key-1", "key-n", "time"):
        return
    a = run.args
    progress("mqstore: starting mqstore up (ASYNC_FLUSH) for the reads ...")
    with gateway.running_system(_settings(run, "ASYNC_FLUSH"), a.keep_store) as system:
        per_queue = gateway.preload(system, a.preload, True)
        sample = sample_pulled(system.gateway, per_queue, random.Random(1))
        key_messages = a.key_messages
        if run.want("key-1", "key-n"):
            seconds = preload_keys(system.gateway, key_messages)
            progress(f"mqstore: {key_messages:,} messages with 3 KEYS each ({key_messages * 3:,} keys) sent and "
                     f"indexed in {seconds:.1f} s")
            run.note("key-n", f"{key_messages * 3:,} keys indexed (plus every message's UNIQ_KEY)")
        jobs = [
            ("pull", Job("mqstore", "pull", system.gateway, a.duration, 4, 1024, data=(per_queue,),
                         mode=pull_mode()), 2),
            ("get-1", Job("mqstore", "get", system.gateway, a.duration, 1, data=(tuple(sample["ids"]),),
                          mode="GetMessage by offset msg id"), 1),
            ("get-n", Job("mqstore", "get", system.gateway, a.duration, a.concurrency, data=(tuple(sample["ids"]),),
                          mode=f"GetMessage by offset msg id, 2x{a.concurrency} in flight"), 2),
            ("key-1", Job("mqstore", "key", system.gateway, a.duration, 1, data=(key_messages,), mode="QueryByKey"), 1),
            ("key-n", Job("mqstore", "key", system.gateway, a.duration, a.concurrency, data=(key_messages,),
                          mode=f"QueryByKey, 2x{a.concurrency} in flight"), 2),
            ("time", Job("mqstore", "time", system.gateway, a.duration, a.concurrency,
                         data=((sample["first_ms"], sample["last_ms"]), per_queue),
                         mode=f"SearchOffset, 2x{a.concurrency} in flight"), 2),
        ]
        _run_jobs(run, "mqstore", jobs, system.pids)


def _run_jobs(run: Run, system_name: str, jobs: Sequence[tuple[str, Any, int]], pids: Sequence[int]) -> None:
    from bench.peer_runner import run_job
    from bench.report import wait_quiet

    for key, job, procs in jobs:
        if not run.want(key):
            continue
        for _ in range(run.args.reps):
            if run.args.wait_quiet > 0:
                wait_quiet(run.args.wait_quiet)
            measure, extra = run_job(job, procs, pids)
            if extra["errors"]:
                progress(f"warning: {key} {system_name}: errors, first: {extra['errors'][0]}")
            run.add(key, system_name, measure)


# -- the peers --------------------------------------------------------------------------------------------
def redis_rows(run: Run, scratch: Path) -> None:
    from bench import peer_redis
    from bench.peer_runner import Job

    a = run.args
    if run.want("produce-batch256", "produce-batch64", "produce-stream", "send-latency", "send-n",
                "pull", "get-1", "get-n", "time"):
        with RedisServer(scratch / "redis-everysec", "everysec") as server:
            progress(f"redis: {server.target} (pid {server.pid}, appendfsync everysec)")
            produce = Job("redis", "xadd-raw", server.target, a.duration, 4, 256,
                          mode="XADD pipelined 256 (packed, hiredis), 2x4, everysec")
            for key in ("produce-batch256", "produce-batch64", "produce-stream"):
                if run.want(key):  # one Redis figure for every mqstore batched path
                    _run_jobs(run, "redis", [(key, produce, 2)], [server.pid])
                    break
            _copy_peer(run, "redis", "produce-batch256", ("produce-batch64", "produce-stream"))
            _run_jobs(run, "redis", [("send-latency", Job("redis", "xadd", server.target, a.duration, 1, 1,
                                                          mode="XADD one at a time"), 1),
                                     ("send-n", Job("redis", "xadd", server.target, a.duration, a.concurrency, 1,
                                                    mode=f"XADD one at a time, 2x{a.concurrency}"), 2)],
                      [server.pid])
            if run.want("pull", "get-1", "get-n", "time"):
                peer_redis.flush(server.target)
                loaded = peer_redis.preload(server.target, a.preload)
                progress(f"redis: preloaded {loaded['per_queue'] * 8:,} entries in {loaded['seconds']:.1f} s")
                samples = tuple(tuple(s) for s in loaded["samples"])
                ids = tuple(loaded["ids"])
                _run_jobs(run, "redis", [
                    ("pull", Job("redis", "xrange-raw", server.target, a.duration, 4, 1024, data=(samples,),
                                 mode="XRANGE COUNT 1024 (hiredis)"), 2),
                    ("get-1", Job("redis", "get", server.target, a.duration, 1, data=(ids,), mode="XRANGE id id"), 1),
                    ("get-n", Job("redis", "get", server.target, a.duration, a.concurrency, data=(ids,),
                                  mode=f"XRANGE id id, 2x{a.concurrency}"), 2),
                    ("time", Job("redis", "time", server.target, a.duration, a.concurrency,
                                 data=((loaded["first_ms"], loaded["last_ms"]),), mode="XRANGE <ms> + COUNT 1"), 2),
                ], [server.pid])
    if run.want("durable-batch64", "durable-send"):
        with RedisServer(scratch / "redis-always", "always") as server:
            progress(f"redis: {server.target} (pid {server.pid}, appendfsync always)")
            _run_jobs(run, "redis", [
                ("durable-batch64", Job("redis", "xadd-raw", server.target, a.duration, 32, 64,
                                        mode="XADD pipelined 64 (packed), appendfsync always, 64 producers"), 2),
                ("durable-send", Job("redis", "xadd", server.target, a.duration, 32, 1,
                                     mode="XADD one at a time, appendfsync always, 64 producers"), 2),
            ], [server.pid])


def nats_rows(run: Run, scratch: Path) -> None:
    import asyncio

    from bench import peer_nats
    from bench.peer_runner import Job

    a = run.args
    if not run.want("produce-batch256", "produce-batch64", "produce-stream", "send-latency", "send-n",
                    "durable-batch64", "durable-send", "pull", "get-1", "get-n", "time"):
        return
    with NatsServer(scratch / "nats") as server:
        progress(f"nats: {server.target} (pid {server.pid}, JetStream, file storage)")
        pids = [server.pid]
        asyncio.run(peer_nats.create_stream(server.target))
        for key in ("produce-batch256", "produce-batch64", "produce-stream"):
            if run.want(key):
                _run_jobs(run, "nats", [(key, Job("nats", "publish-async", server.target, a.duration, 4, 256,
                                                  mode="async publish, 256 per ack wait, 2x4"), 2)], pids)
                break
        _copy_peer(run, "nats", "produce-batch256", ("produce-batch64", "produce-stream"))
        _run_jobs(run, "nats", [("send-latency", Job("nats", "publish", server.target, a.duration, 1,
                                                     mode="sync publish, one at a time"), 1),
                                ("send-n", Job("nats", "publish", server.target, a.duration, a.concurrency,
                                               mode=f"sync publish, 2x{a.concurrency}"), 2)], pids)
        _run_jobs(run, "nats", [
            ("durable-batch64", Job("nats", "publish-async", server.target, a.duration, 32, 64,
                                    mode="async publish, 64 per ack wait, 64 producers"), 2),
            ("durable-send", Job("nats", "publish", server.target, a.duration, 32,
                                 mode="sync publish, 64 producers"), 2),
        ], pids)
        for key in ("durable-batch64", "durable-send"):
            run.note(key, "NATS 2.9 acknowledges a publish once written, fsyncing on its own schedule: not "
                     "durable per ack as mqstore SYNC_FLUSH and Redis appendfsync always are")
        if run.want("pull", "get-1", "get-n", "time"):
            loaded = peer_nats.preload(server.target, a.preload)
            progress(f"nats: preloaded {loaded['per_queue'] * 8:,} messages in {loaded['seconds']:.1f} s")
            times = (loaded["first_ms"], loaded["last_ms"])
            _run_jobs(run, "nats", [
                ("pull", Job("nats", "ordered", server.target, a.duration, 4, data=(loaded["per_queue"],),
                             mode="ordered push consumer per subject, 2x4"), 2),
                ("get-1", Job("nats", "get", server.target, a.duration, 1, data=(loaded["last_seq"],),
                              mode="direct get by sequence"), 1),
                ("get-n", Job("nats", "get", server.target, a.duration, a.concurrency, data=(loaded["last_seq"],),
                              mode=f"direct get by sequence, 2x{a.concurrency}"), 2),
                ("time", Job("nats", "time", server.target, a.duration, a.concurrency, data=(times,),
                             mode=f"pull consumer by start time, fetch 1, 2x{a.concurrency}"), 2),
            ], pids)


def _copy_peer(run: Run, system: str, source: str, targets: Sequence[str]) -> None:
    """One peer figure stands beside several mqstore rows (every batched path is held to the same peer)."""
    for key in (source, *targets):
        if got := run.measures.get(key, {}).get(system):
            for target in (source, *targets):
                if target in run.wanted and target != key:
                    run.measures.setdefault(target, {})[system] = list(got)
            return


def floor_rows(run: Run, scratch: Path) -> None:
    """The bare grpc.aio echo at each shape a selected row stands against (bench/peer_floor.py)."""
    from bench.peer_runner import Job, run_job
    from bench.report import wait_quiet

    wanted = {row.floor_case for row in run.rows if row.floor_case}
    if not wanted:
        return
    a = run.args
    with FloorServer(scratch / "floor") as server:
        progress(f"floor: grpc.aio echo on {server.target} (pid {server.pid})")
        target, d, c = server.target, a.duration, a.concurrency
        jobs = {
            "unary-1": (Job("floor", "unary", target, d, 1, 1, mode="unary echo of 1 KiB, one in flight"), 1),
            "unary-n": (Job("floor", "unary", target, d, c, 1, mode=f"unary echo of 1 KiB, 2x{c} in flight"), 2),
            "unary-64": (Job("floor", "unary", target, d, 32, 1, mode="unary echo of 1 KiB, 2x32 in flight"), 2),
            "stream": (Job("floor", "stream", target, d, 1, 64, data=(16,),
                           mode="streaming echo, 64 x 1 KiB frames, 16 unanswered, 2 streams"), 2),
        }
        for case in FLOOR_CASES:
            if case not in wanted:
                continue
            job, procs = jobs[case]
            for _ in range(a.reps):
                if a.wait_quiet > 0:
                    wait_quiet(a.wait_quiet)
                measure, extra = run_job(job, procs, [server.pid])
                if extra["errors"]:
                    progress(f"warning: floor {case}: errors, first: {extra['errors'][0]}")
                run.add(f"floor:{case}", "floor", measure)


# -- engine and recovery (child processes of their own benchmarks) ---------------------------------------
def _child(args: Sequence[str], timeout_s: float) -> str:
    command = [sys.executable, "-m", *args]
    progress(f"running {' '.join(command[2:])} ...")
    with subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, text=True) as proc:
        try:
            out, _ = proc.communicate(timeout=timeout_s)
        except BaseException:
            proc.kill()
            proc.wait()
            raise
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} exited with {proc.returncode}")
    return out


def engine_rows(run: Run) -> None:
    if not run.want("engine-single", "engine-batch"):
        return
    a = run.args
    out = _child(["bench.append_engine", "--messages", str(a.engine_messages), "--reps", str(a.reps),
                  "--wait-quiet", str(a.wait_quiet), "--json"], 1800)
    for line in out.splitlines():
        if not line.startswith("{"):
            continue
        record = json.loads(line)
        key = "engine-single" if " single " in f" {record['case']} " else "engine-batch"
        for rep in record["reps"]:
            run.add(key, "mqstore", Measure(rate=rep["msgsPerSec"], mode=f"{record['case']}, "
                                            f"{a.engine_messages:,} msgs", failed=rep["failed"], ops=rep["ok"]))


RECOVERY_LINE = re.compile(r"^\| abnormal \| \d+ \| ([\d.]+) \|", re.MULTILINE)
RECOVERY_REP = re.compile(r"^\| abnormal \| \d+ \| ([\d.]+) \| ([\d,]+) \| ([\d.]+) \|", re.MULTILINE)


def recovery_rows(run: Run) -> None:
    if not run.want("recovery"):
        return
    a = run.args
    args = ["bench.recovery", "--cases", "abnormal", "--reps", str(a.reps), "--size-gib", str(a.recovery_gib),
            "--wait-quiet", str(a.wait_quiet)]
    if a.recovery_gib < 1:
        args += ["--file-size-mib", "64"]
    out = _child(args, 3600)
    reps = RECOVERY_REP.findall(out)
    if not reps:
        raise RuntimeError(f"bench.recovery printed no abnormal row:\n{out[-2000:]}")
    for gib, records, walk_s in reps:
        run.add("recovery", "mqstore", Measure(seconds=float(walk_s) / float(gib),
                                               mode=f"abnormal walk of {float(gib):.2f} GiB, {records} records"))


# -- main ------------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM stops the run as Ctrl-C does: every server and system is stopped on the way out."""
    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per case (default 5)")
    parser.add_argument("--reps", type=int, default=1, help="repetitions per case; medians when > 1 (default 1)")
    parser.add_argument("--only", metavar="ROWS",
                        help=f"comma list of row groups ({', '.join(GROUPS)}) or row keys (e.g. get-1)")
    parser.add_argument("--quick", action="store_true", help="a short smoke run of every row (1 s cases, small data)")
    parser.add_argument("--json", action="store_true", help="also print the table as one JSON line")
    parser.add_argument("--preload", type=int, default=200_000, help="messages to read from (default 200,000)")
    parser.add_argument("--key-messages", type=int, default=333_334,
                        help="messages with 3 KEYS each for the key rows (default 333,334: 1,000,002 keys)")
    parser.add_argument("--concurrency", type=int, default=16,
                        help="calls in flight per client process (2 processes) of the 'with concurrency' rows")
    parser.add_argument("--engine-messages", type=int, default=1_000_000,
                        help="messages per engine append rep (default 1,000,000)")
    parser.add_argument("--recovery-gib", type=float, default=2.0, help="commitlog size to recover (default 2)")
    parser.add_argument("--wait-quiet", type=float, default=5.0, metavar="SECONDS",
                        help="before each case wait up to this long for other processes to go idle (default 5)")
    parser.add_argument("--settle", type=float, default=30.0, metavar="SECONDS",
                        help="before each mqstore produce case wait up to this long for it to go idle (default 30)")
    parser.add_argument("--gateway-workers", type=int, default=0, metavar="N",
                        help="mqstore up --gateway-workers N (MQSTORE_GATEWAY_WORKERS) where this checkout has "
                             "them (default: the gateway's default)")
    parser.add_argument("--no-install", action="store_true", help="fail instead of installing missing servers")
    parser.add_argument("--keep-store", action="store_true", help="keep the scratch directories")
    return parser


def apply_quick(args: argparse.Namespace) -> None:
    args.duration = min(args.duration, 1.0)
    args.preload = min(args.preload, 8192)
    args.key_messages = min(args.key_messages, 2048)
    args.engine_messages = min(args.engine_messages, 50_000)
    args.recovery_gib = min(args.recovery_gib, 0.125)
    args.wait_quiet = 0.0
    args.settle = min(args.settle, 2.0)
    args.concurrency = min(args.concurrency, 4)


def main(argv: Sequence[str] | None = None, prog: str = PROG) -> int:
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    if args.quick:
        apply_quick(args)
    if args.reps < 1 or args.duration <= 0:
        parser.error("--reps and --duration must be positive")
    try:
        rows = select(issue_rows(), args.only)
    except ValueError as exc:
        parser.error(str(exc))
    ensure_installed(apt=not args.no_install)
    run = Run(args, rows)
    failures: list[str] = []
    started = time.monotonic()
    print_machine(f"; peers: {server_version('redis-server')}; {server_version('nats-server')}")
    print(f"{args.reps} rep(s) of {args.duration:g} s per case; load average before the run: "
          f"{' '.join(f'{v:.2f}' for v in os.getloadavg())}; mqstore modes: {_gateway_mode_note(run)}", flush=True)
    with sigterm_as_interrupt(), scratch_dir("peers-", args.keep_store) as scratch:
        phases: list[tuple[str, Callable[[], None], tuple[str, ...]]] = [
            ("mqstore produce", lambda: mqstore_produce(run), ("produce", "durable", "latency")),
            ("mqstore reads", lambda: mqstore_reads(run), ("pull", "get", "key", "time")),
            ("redis", lambda: redis_rows(run, scratch), ("produce", "durable", "latency", "pull", "get", "time")),
            ("nats", lambda: nats_rows(run, scratch), ("produce", "durable", "latency", "pull", "get", "time")),
            ("floor", lambda: floor_rows(run, scratch), ("floor",)),
            ("engine", lambda: engine_rows(run), ("engine",)),
            ("recovery", lambda: recovery_rows(run), ("recovery",)),
        ]
        for name, phase, groups in phases:
            try:
                phase()
            except Exception as exc:  # noqa: BLE001 - one broken phase must not lose the others' figures
                failures.append(f"{name}: {exc!r}"[:500])
                progress(f"error: {name} failed, its rows stay empty: {exc!r}")
                for row in run.rows:
                    if row.group in groups:
                        run.note(row.key, f"{name} failed: {str(exc).splitlines()[0][:200] if str(exc) else repr(exc)}")
    filled = run.filled()
    print(f"\n### mqstore vs Redis Streams vs NATS JetStream vs the grpc.aio floor, "
          f"{time.monotonic() - started:.0f} s run, {'medians of ' if args.reps > 1 else ''}{args.reps} rep(s) "
          f"of {args.duration:g} s\n")
    print(render(filled), flush=True)
    if args.json:
        print(to_json(filled, {k: v for k, v in vars(args).items() if k != "json"}), flush=True)
    if failures:
        print(f"\n{len(failures)} phase(s) failed: " + "; ".join(failures), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except KeyboardInterrupt:
        progress("interrupted: every server of the run was stopped")
        raise SystemExit(130) from None
