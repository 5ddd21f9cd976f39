"""Append throughput through gRPC, against a real commitlog service process.

    python -m bench.append_grpc                                  # batch + stream (async) + sync, 3 reps
    python -m bench.append_grpc --cases batch,stream --procs 1,2 --reps 1
    python -m bench.append_grpc --cases sync --sync-producers 64 --sync-procs 2

Each rep starts ``mqstore commitlog --store <fresh dir> --listen 127.0.0.1:<free port>`` (settings via
``MQSTORE_*`` environment variables), waits for gRPC health SERVING, creates the topic, runs the
clients, checks with GetStoreInfo that the log grew by what was acknowledged, and stops the server
with SIGTERM (by PID), checking it exits 0.

Cases:
  batch   AppendBatch, ``--batch`` messages per call (default 64), each client thread one call at a time
  stream  AppendStream, pipelined: a generator sends while the thread reads acks; at most ``--window``
          messages unacknowledged per stream (default 512)
  sync    SYNC_FLUSH server, ``--sync-producers`` producers (default 64), each a thread doing unary
          Append (``--sync-rpc unary``) or its own AppendStream with a window of 1 (``--sync-rpc stream``)

Clients run in ``--procs`` separate client processes (default 1) of ``--threads`` threads each, so
the client's Python does not share the server's GIL. On a 2-vCPU machine the clients still share the
CPUs with the server: the table shows the cores used by the server (``cpu srv``) and by all of the
benchmark's processes (``cpu ours``). Requests are serialised before the clock starts, from a pool of
``--request-pool`` distinct messages (UNIQ_KEY repeats after that many; the commitlog does not care).
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import signal
import threading
import time
from array import array
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

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
from bench.services import Service, free_port, mqstore_command
from bench.workload import (
    BODY_SIZE,
    BORN_HOST,
    CLUSTER,
    QUEUES,
    RECORD_SIZE,
    TOPIC,
    Workload,
    drop_caches,
    print_machine,
    scratch_dir,
)
from mqstore.v1 import commitlog_pb2, commitlog_pb2_grpc, common_pb2

SERVICE = "mqstore.v1.CommitLogService"
APPEND = f"/{SERVICE}/Append"
APPEND_BATCH = f"/{SERVICE}/AppendBatch"
APPEND_STREAM = f"/{SERVICE}/AppendStream"
# An AppendResult with status PUT_OK (1) starts with field 1 as a varint: tag 0x08, value 0x01.
# Checking these two bytes saves the client a parse per ack (the client shares the CPUs with the server).
PUT_OK_PREFIX = b"\x08\x01"
PUT_OK = commitlog_pb2.PUT_MESSAGE_STATUS_PUT_OK
CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    ("grpc.use_local_subchannel_pool", 1),  # one TCP connection per client thread
]


# -- the server process ----------------------------------------------------------------------------
class Server(Service):
    """``mqstore commitlog`` as a child process, stopped by SIGTERM to its PID (and the stop timed)."""

    def __init__(self, store: Path, settings: dict[str, str]) -> None:
        self.store = store / "store"
        env = {k: v for k, v in os.environ.items() if not k.startswith("MQSTORE_")}
        env.update(settings)
        super().__init__("commitlog", ["--store", str(self.store), "--listen", f"127.0.0.1:{free_port()}"],
                         store / "server.log", env, SERVICE)
        self.exit_code: int | None = None
        self.stop_seconds = 0.0

    def stop(self) -> int:
        started = time.monotonic()
        self.exit_code = super().stop()
        self.stop_seconds = time.monotonic() - started
        return self.exit_code

    def log_tail(self, lines: int = 20) -> str:
        text = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])


def store_info(target: str) -> commitlog_pb2.StoreInfo:
    with grpc.insecure_channel(target) as channel:
        return commitlog_pb2_grpc.CommitLogServiceStub(channel).GetStoreInfo(
            commitlog_pb2.GetStoreInfoRequest(), timeout=10)


def create_topic(target: str) -> None:
    """Create the topic before the clock starts (auto-creation writes a config file on the put path)."""
    with grpc.insecure_channel(target) as channel:
        stub = commitlog_pb2_grpc.CommitLogServiceStub(channel)
        stub.CreateTopic(commitlog_pb2.TopicRequest(topic=common_pb2.TopicConfig(
            topic=TOPIC, read_queue_nums=QUEUES, write_queue_nums=QUEUES, perm=6)), timeout=10)


# -- the clients -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class ClientSpec:
    """What one client process does (picklable: it crosses to spawned processes)."""

    target: str
    mode: str  # batch | stream | unary
    threads: int
    messages: int  # for the whole process
    batch: int
    window: int
    duration_s: float
    pool: int
    first_index: int


def _proto_message(workload: Workload, i: int) -> common_pb2.Message:
    return common_pb2.Message(topic=TOPIC, queue_id=i % QUEUES, body=workload.body(i),
                              properties={"UNIQ_KEY": workload.uniq_key(i), "CLUSTER": CLUSTER},
                              born_timestamp=workload.born_timestamp, born_host=BORN_HOST)


def build_requests(spec: ClientSpec) -> list[bytes]:
    """Serialised requests: AppendBatchRequests of ``batch`` messages, or single AppendRequests."""
    workload = Workload.fresh(min(spec.pool, 8192))
    first = spec.first_index
    if spec.mode == "batch":
        return [commitlog_pb2.AppendBatchRequest(
                    messages=[_proto_message(workload, i) for i in range(start, start + spec.batch)]
                ).SerializeToString()
                for start in range(first, first + max(spec.pool, spec.batch), spec.batch)]
    return [commitlog_pb2.AppendRequest(message=_proto_message(workload, i)).SerializeToString()
            for i in range(first, first + spec.pool)]


class _ClientThread:
    def __init__(self, spec: ClientSpec, index: int, requests: list[bytes], messages: int) -> None:
        self.spec = spec
        self.requests = requests
        self.offset = index * len(requests) // spec.threads  # threads start at different requests
        self.messages = messages
        self.latencies: array[int] = array("q")
        self.acked = self.failed = 0
        self.started = self.ended = 0
        self.error = ""
        self.channel = grpc.insecure_channel(spec.target, options=CHANNEL_OPTIONS)

    def run(self, ready: threading.Barrier, go: threading.Event) -> None:
        try:
            grpc.channel_ready_future(self.channel).result(timeout=30)
            commitlog_pb2_grpc.CommitLogServiceStub(self.channel).GetStoreInfo(
                commitlog_pb2.GetStoreInfoRequest(), timeout=10)  # the connection is up and warm
        except Exception as exc:  # noqa: BLE001 - reported by the caller
            self.error = f"connect: {exc!r}"
        ready.wait()
        go.wait()
        self.started = time.monotonic_ns()
        if not self.error:
            try:
                if self.spec.mode == "stream":
                    self._stream()
                else:
                    self._unary()
            except grpc.RpcError as exc:
                self.error = f"{exc.code().name}: {exc.details()}"
            except Exception as exc:  # noqa: BLE001
                self.error = repr(exc)
        self.ended = time.monotonic_ns()
        self.channel.close()

    def _unary(self) -> None:
        batch = self.spec.mode == "batch"
        call = self.channel.unary_unary(APPEND_BATCH if batch else APPEND, request_serializer=None,
                                        response_deserializer=None)
        parse = commitlog_pb2.AppendBatchResponse.FromString
        requests, n, k = self.requests, len(self.requests), self.offset
        clock, append = time.perf_counter_ns, self.latencies.append
        deadline = clock() + int(self.spec.duration_s * 1e9)
        acked = failed = 0
        while acked + failed < self.messages:
            t0 = clock()
            raw = call(requests[k % n], timeout=60)
            t1 = clock()
            append(t1 - t0)
            k += 1
            if batch:
                results = parse(raw).results
                good = sum(1 for r in results if r.status == PUT_OK)
                acked += good
                failed += len(results) - good
            elif raw.startswith(PUT_OK_PREFIX):
                acked += 1
            else:
                failed += 1
            if t1 > deadline:
                break
        self.acked, self.failed = acked, failed

    def _stream(self) -> None:
        call = self.channel.stream_stream(APPEND_STREAM, request_serializer=None, response_deserializer=None)
        window = threading.Semaphore(self.spec.window)
        sent: deque[int] = deque()
        clock = time.perf_counter_ns
        deadline = clock() + int(self.spec.duration_s * 1e9)
        requests, n, start, budget = self.requests, len(self.requests), self.offset, self.messages

        def produce() -> Iterator[bytes]:
            for k in range(start, start + budget):
                window.acquire()
                now = clock()
                if now > deadline:
                    return
                sent.append(now)
                yield requests[k % n]

        acked = failed = 0
        append, popleft, release = self.latencies.append, sent.popleft, window.release
        for raw in call(produce(), timeout=self.spec.duration_s + 120):
            append(clock() - popleft())
            release()
            if raw.startswith(PUT_OK_PREFIX):
                acked += 1
            else:
                failed += 1
        self.acked, self.failed = acked, failed


def client_main(spec: ClientSpec, ready: Any, results: Any) -> dict[str, Any]:
    """One client process (or, with ``procs`` 0, the benchmark process itself): prepare, wait on the
    shared barrier ``ready``, run ``spec.threads`` threads, report through ``results`` (a queue) or return."""
    requests = build_requests(spec)
    shares = [spec.messages * (t + 1) // spec.threads - spec.messages * t // spec.threads for t in range(spec.threads)]
    clients = [_ClientThread(spec, t, requests, shares[t]) for t in range(spec.threads)]
    local_ready = threading.Barrier(spec.threads + 1)
    go = threading.Event()
    threads = [threading.Thread(target=c.run, args=(local_ready, go), name=f"client-{i}", daemon=True)
               for i, c in enumerate(clients)]
    for t in threads:
        t.start()
    local_ready.wait()
    ready.wait()
    go.set()
    for t in threads:
        t.join()
    report = {
        "acked": sum(c.acked for c in clients), "failed": sum(c.failed for c in clients),
        "started": min(c.started for c in clients), "ended": max(c.ended for c in clients),
        "latencies": b"".join(c.latencies.tobytes() for c in clients),
        "errors": [c.error for c in clients if c.error],
    }
    if results is not None:
        results.put(report)
    return report


def run_clients(spec: ClientSpec, procs: int, server_pid: int) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """Run ``procs`` client processes (0: threads in this process) and measure CPU while they run."""
    if procs == 0:
        ready = threading.Barrier(2)
        box: list[dict[str, Any]] = []
        thread = threading.Thread(target=lambda: box.append(client_main(spec, ready, None)), daemon=True)
        thread.start()
        ready.wait()
        meter, server_meter = CpuMeter([server_pid]), CpuMeter([server_pid], include_self=False)
        thread.join()
        return box, {**meter.stop(), "cpuServer": server_meter.stop()["cpuOurs"]}
    ctx = multiprocessing.get_context("spawn")  # never fork a process that holds gRPC channels
    ready = ctx.Barrier(procs + 1)
    queue = ctx.Queue()
    specs = [ClientSpec(**{**spec.__dict__, "messages": spec.messages * (p + 1) // procs - spec.messages * p // procs,
                           "first_index": spec.first_index + p * spec.pool}) for p in range(procs)]
    children = [ctx.Process(target=client_main, args=(s, ready, queue), name=f"bench-client-{i}")
                for i, s in enumerate(specs)]
    for child in children:
        child.start()
    try:
        ready.wait(timeout=300)
        meter = CpuMeter([server_pid, *[c.pid for c in children if c.pid]])
        server_meter = CpuMeter([server_pid], include_self=False)
        reports = [queue.get(timeout=spec.duration_s + 300) for _ in children]
        cpu = {**meter.stop(), "cpuServer": server_meter.stop()["cpuOurs"]}
    finally:
        for child in children:
            child.join(timeout=30)
            if child.is_alive() and child.pid:
                os.kill(child.pid, signal.SIGKILL)
                child.join()
    return reports, cpu


# -- one rep -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    name: str
    mode: str  # batch | stream | unary
    flush: str
    procs: int
    threads: int
    per_call: int  # messages per call (the batch), 1 otherwise


def run_rep(case: Case, rep: int, args: argparse.Namespace) -> RepResult:
    settings = {**args.settings, "MQSTORE_FLUSH_DISK_TYPE": case.flush,
                "MQSTORE_TRANSIENT_STORE_POOL_ENABLE": str(args.transient_store_pool and case.flush == "ASYNC_FLUSH")}
    if args.gather_us is not None:
        settings["MQSTORE_GROUP_COMMIT_GATHER_US"] = str(args.gather_us)
    if args.drop_caches and not drop_caches():
        progress("warning: could not drop caches (not root?)")
    wait_quiet(args.wait_quiet)
    with scratch_dir("grpc-", args.keep_store) as scratch:
        server = Server(scratch, settings)
        try:
            server.wait_serving()
            create_topic(server.target)
            base = store_info(server.target).max_offset
            duration = args.sync_duration if case.flush == "SYNC_FLUSH" else args.duration
            spec = ClientSpec(server.target, case.mode, case.threads, args.messages, args.batch,
                              1 if case.mode == "stream" and case.flush == "SYNC_FLUSH" else args.window,
                              duration, args.request_pool, 0)
            prof = profiler(args.profile, server.pid, f"{case.name}-{rep}")
            reports, cpu = run_clients(spec, case.procs, server.pid)
            if prof is not None:
                prof.stop()
            info = store_info(server.target)
        except BaseException:
            server.stop()
            progress(f"server log tail:\n{server.log_tail()}")
            raise
        server.stop()
        if server.exit_code != 0:
            raise RuntimeError(f"the server exited with {server.exit_code} after SIGTERM:\n{server.log_tail()}")
    errors = [e for r in reports for e in r["errors"]]
    if errors:
        raise RuntimeError(f"{len(errors)} client threads failed, first: {errors[0]}")
    acked = sum(r["acked"] for r in reports)
    failed = sum(r["failed"] for r in reports)
    wrote = info.max_offset - base
    if not acked * RECORD_SIZE <= wrote < (acked + failed) * RECORD_SIZE + info.mapped_file_size * 2:
        raise RuntimeError(f"the log grew by {wrote} bytes but {acked} records of {RECORD_SIZE} B were acked")
    seconds = (max(r["ended"] for r in reports) - min(r["started"] for r in reports)) / 1e9
    latencies: array[int] = array("q")
    for r in reports:
        latencies.frombytes(r["latencies"])
    extra = {"procs": case.procs, "threads": case.threads, "serverStopSec": round(server.stop_seconds, 2), **cpu}
    return RepResult(case.name, rep, acked, seconds, acked * RECORD_SIZE, acked * BODY_SIZE, latencies,
                     case.per_call, failed, extra)


def build_cases(args: argparse.Namespace) -> list[Case]:
    cases: list[Case] = []
    names = [c.strip() for c in args.cases.split(",") if c.strip()]
    procs_list = [int(p) for p in args.procs.split(",")]
    for name in names:
        if name == "batch":
            for procs in procs_list:
                cases.append(Case(f"grpc batch{args.batch} {max(procs, 1)}x{args.threads}", "batch", "ASYNC_FLUSH",
                                  procs, args.threads, args.batch))
        elif name == "stream":
            for procs in procs_list:
                cases.append(Case(f"grpc stream w{args.window} {max(procs, 1)}x{args.threads}", "stream",
                                  "ASYNC_FLUSH", procs, args.threads, 1))
        elif name == "sync":
            procs = args.sync_procs
            threads = args.sync_producers // max(procs, 1)
            mode = "unary" if args.sync_rpc == "unary" else "stream"
            cases.append(Case(f"grpc sync {args.sync_rpc} {max(procs, 1)}x{threads}", mode, "SYNC_FLUSH",
                              procs, threads, 1))
        else:
            raise SystemExit(f"unknown case {name!r}: use batch, stream, sync")
    return cases


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.append_grpc", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default="batch,stream,sync", help="comma list of batch, stream, sync")
    parser.add_argument("--messages", type=int, default=1_000_000, help="messages per rep (default 1,000,000)")
    parser.add_argument("--duration", type=float, default=15.0, help="cap per async rep in seconds (default 15)")
    parser.add_argument("--sync-duration", type=float, default=15.0, help="seconds per sync rep (default 15)")
    parser.add_argument("--batch", type=int, default=64, help="messages per AppendBatch (default 64)")
    parser.add_argument("--window", type=int, default=512, help="unacked messages per AppendStream (default 512)")
    parser.add_argument("--procs", default="1",
                        help="comma list of client process counts for batch/stream (0 = threads in this process)")
    parser.add_argument("--threads", type=int, default=1, help="client threads per client process (default 1)")
    parser.add_argument("--sync-producers", type=int, default=64, help="producers of the sync case (default 64)")
    parser.add_argument("--sync-procs", type=int, default=2, help="client processes they are spread over (default 2)")
    parser.add_argument("--sync-rpc", choices=("unary", "stream"), default="unary",
                        help="sync producers use unary Append, or an AppendStream each with a window of 1")
    parser.add_argument("--gather-us", type=int, default=None, help="groupCommitGatherUs of the server")
    parser.add_argument("--transient-store-pool", action="store_true", help="transientStorePoolEnable (async cases)")
    parser.add_argument("--request-pool", type=int, default=65536,
                        help="distinct pre-serialised messages per client process (default 65536)")
    add_common_args(parser)
    args = parser.parse_args(argv)
    args.settings = parse_settings(parser, args.set)
    cases = build_cases(args)

    print_machine(f", server: {mqstore_command()} commitlog")
    print(f"workload: {args.messages:,} msgs/rep (cap {args.duration:g}s async, {args.sync_duration:g}s sync), "
          f"record {RECORD_SIZE} B, reps {args.reps}", flush=True)
    results: list[RepResult] = []
    for case in cases:
        for rep in range(1, args.reps + 1):
            r = run_rep(case, rep, args)
            progress(f"{case.name} rep {rep}: {r.msgs_per_s:,.0f} msgs/s, call p50 {r.call_p50_us:.0f} µs "
                     f"p99 {r.call_p99_us:.0f} µs, cpu server {r.extra['cpuServer']} ours {r.extra['cpuOurs']} "
                     f"other {r.extra['cpuOther']}")
            results.append(r)
    extra = [("cpu srv", lambda r: r.extra["cpuServer"], "{:.2f}")]
    print_table("append_grpc: every rep", results, extra)
    print_summary(results, extra)
    if args.json:
        emit_json("append_grpc", results, {k: v for k, v in vars(args).items() if k != "json"})
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        raise SystemExit(main())
