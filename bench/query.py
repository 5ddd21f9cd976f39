"""The query service under load: pulls, key queries, gets by offset msg id, offsets by time.

    python -m bench.query                                   # every case, 3 reps of 10 s
    python -m bench.query --cases pull,pull-1 --reps 1 --duration 5
    python -m bench.query --key-messages 100000             # a smaller index, a quicker load

Set-up (not timed): real ``mqstore commitlog``, ``mqstore indexer`` and ``mqstore query`` processes on
127.0.0.1 and a fresh store under ``.bench-tmp/``. The commitlog gets ``--pull-messages`` messages of
the RocketMQ perf anchor's workload (1 KiB bodies, UNIQ_KEY + CLUSTER, ``TopicTest``, 8 queues) and
``--key-messages`` messages on ``BenchKeys`` with three KEYS each (``--key-messages`` 333,334 gives
1,000,002 keys in the IndexFile, plus one UNIQ_KEY per message), appended with AppendBatch; the
benchmark waits until the indexer has dispatched everything. The load rate is reported.

Cases (each rep runs ``--duration`` seconds; clients are ``--procs`` processes with ``--concurrency``
calls in flight each, on grpc.aio; the ``-1`` cases have one call in flight, for latency):
  pull      PullMessage of 32 messages (1 KiB bodies) at offsets cycling over the 8 queues
  key       QueryMessage of a random key of the 1,000,000 (one message each)
  id        ViewMessage of a random offset msg id
  time      SearchOffset of a random queue at a random store time
Requests are serialised before the clock starts and answers are taken as raw bytes: the first bytes
say the status (every 256th answer is parsed in full and checked), so the client spends its CPU on
gRPC, not on protobuf. ``cpu srv`` is the cores the three services used during the rep.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import random
import sys
import time
from array import array
from collections.abc import Sequence
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
from bench.services import Service, free_port
from bench.workload import BODY_SIZE, CLUSTER, QUEUES, TOPIC, Workload, print_machine, scratch_dir
from mqstore.v1 import commitlog_pb2, commitlog_pb2_grpc, common_pb2, indexer_pb2, indexer_pb2_grpc, query_pb2

SERVICE = "mqstore.v1.QueryService"
PULL_BATCH = 32
KEY_TOPIC = "BenchKeys"
KEY_QUEUES = 4
KEYS_PER_MESSAGE = 3
KEY_BODY = b"k" * 64
APPEND_BATCH = 1024
SAMPLE_EVERY = 256
MIB = 1024 * 1024
CHANNEL_OPTIONS = [("grpc.max_receive_message_length", 64 * MIB), ("grpc.use_local_subchannel_pool", 1)]
# The first bytes of an answer: field 1 (status) = 1 (FOUND), or field 1 (a repeated message) present.
FOUND_PREFIX = b"\x08\x01"
MESSAGES_PREFIX = b"\x0a"
TARGETS = {"pull": "≥ 250,000 msgs/s", "key": "≥ 10,000 queries/s, p99 ≤ 2 ms", "key-1": "p99 ≤ 2 ms",
           "id": "-", "id-1": "p99 ≤ 1 ms", "time": "≥ 10,000 /s", "pull-1": "-", "time-1": "-"}


def start_services(root: Path, settings: dict[str, str], read_from: str = "files") -> list[Service]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MQSTORE_")}
    env.update(settings)
    commitlog_at, indexer_at, query_at = (f"127.0.0.1:{free_port()}" for _ in range(3))
    specs = [
        ("commitlog", ["--store", str(root / "broker"), "--listen", commitlog_at], "mqstore.v1.CommitLogService"),
        ("indexer", ["--store", str(root / "indexer"), "--listen", indexer_at, "--commitlog", commitlog_at],
         "mqstore.v1.IndexerService"),
        ("query", ["--store", str(root / "query"), "--listen", query_at, "--commitlog", commitlog_at,
                   "--indexer", indexer_at, "--store-root", str(root / "broker"), "--indexer-store",
                   str(root / "indexer"), "--read-from", read_from], SERVICE),
    ]
    services: list[Service] = []
    try:
        for name, args, health_name in specs:
            service = Service(name, args, root / f"{name}.log", env, health_name)
            services.append(service)
            service.wait_serving()
    except BaseException:
        for service in services:
            service.stop()
        raise
    return services


# -- the data ---------------------------------------------------------------------------------------
@dataclass
class Loaded:
    """What the clients need to build requests: per-queue message counts, msg ids, store times."""

    pull_per_queue: list[int]
    msg_ids: list[str]
    key_messages: int
    first_store_ms: int
    last_store_ms: int
    load_seconds: float
    dispatch_seconds: float


def _append_all(stub: commitlog_pb2_grpc.CommitLogServiceStub, batches: Sequence[list[common_pb2.Message]],
                msg_ids: list[str] | None) -> tuple[int, int]:
    first = last = 0
    for batch in batches:
        results = stub.AppendBatch(commitlog_pb2.AppendBatchRequest(messages=batch), timeout=60).results
        if any(r.status != commitlog_pb2.PUT_MESSAGE_STATUS_PUT_OK for r in results):
            raise RuntimeError(f"append failed: {results[0]}")
        first = first or results[0].store_timestamp
        last = results[-1].store_timestamp
        if msg_ids is not None:
            msg_ids.extend(r.msg_id for r in results)
    return first, last


def load(services: list[Service], pull_messages: int, key_messages: int) -> Loaded:
    commitlog, indexer = services[0], services[1]
    workload = Workload.fresh()
    msg_ids: list[str] = []
    started = time.monotonic()
    with grpc.insecure_channel(commitlog.target, options=CHANNEL_OPTIONS) as channel:
        stub = commitlog_pb2_grpc.CommitLogServiceStub(channel)
        pull_batches = []
        for start in range(0, pull_messages, APPEND_BATCH):
            pull_batches.append([
                common_pb2.Message(topic=TOPIC, queue_id=m.queue_id, body=m.body, properties=m.properties,
                                   born_timestamp=m.born_timestamp, born_host=m.born_host)
                for m in workload.messages(start, min(APPEND_BATCH, pull_messages - start))])
        first, _ = _append_all(stub, pull_batches, msg_ids)
        key_batches = [[common_pb2.Message(topic=KEY_TOPIC, queue_id=i % KEY_QUEUES, body=KEY_BODY,
                                           properties={"KEYS": " ".join(key_of(i, k) for k in range(KEYS_PER_MESSAGE)),
                                                       "UNIQ_KEY": workload.uniq_key(pull_messages + i),
                                                       "CLUSTER": CLUSTER})
                        for i in range(start, min(start + APPEND_BATCH, key_messages))]
                       for start in range(0, key_messages, APPEND_BATCH)]
        _, last = _append_all(stub, key_batches, None)
        info = stub.GetStoreInfo(commitlog_pb2.GetStoreInfoRequest(), timeout=10)
    appended = time.monotonic()
    with grpc.insecure_channel(indexer.target) as channel:
        istub = indexer_pb2_grpc.IndexerServiceStub(channel)
        while istub.GetDispatchStatus(indexer_pb2.GetDispatchStatusRequest(), timeout=10).reput_offset < \
                info.max_offset:
            time.sleep(0.2)
    dispatched = time.monotonic()
    per_queue = [len(range(q, pull_messages, QUEUES)) for q in range(QUEUES)]
    return Loaded(per_queue, msg_ids, key_messages, first, last, appended - started, dispatched - started)


def key_of(message: int, index: int) -> str:
    return f"key-{message}-{index}"


# -- the clients ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ClientSpec:
    case: str
    target: str
    seconds: float
    concurrency: int
    seed: int
    loaded: Loaded
    requests: int = 4096


def build_requests(spec: ClientSpec) -> tuple[str, list[bytes], bytes, int]:
    """(method, serialised requests, the prefix of a good answer, messages per good answer)."""
    rng = random.Random(spec.seed)
    kind = spec.case.removesuffix("-1")
    loaded = spec.loaded
    if kind == "pull":
        requests = []
        for i in range(spec.requests):
            queue = i % QUEUES
            top = max(loaded.pull_per_queue[queue] - PULL_BATCH, 0)
            offset = rng.randrange(0, top + 1, PULL_BATCH) if top else 0
            requests.append(query_pb2.PullMessageRequest(topic=TOPIC, queue_id=queue, queue_offset=offset,
                                                         max_messages=PULL_BATCH).SerializeToString())
        return "PullMessage", requests, FOUND_PREFIX, PULL_BATCH
    if kind == "key":
        requests = [query_pb2.QueryMessageRequest(
            topic=KEY_TOPIC, key=key_of(rng.randrange(loaded.key_messages), rng.randrange(KEYS_PER_MESSAGE)),
            max_num=32).SerializeToString() for _ in range(spec.requests)]
        return "QueryMessage", requests, MESSAGES_PREFIX, 1
    if kind == "id":
        requests = [query_pb2.ViewMessageRequest(msg_id=rng.choice(loaded.msg_ids),
                                                 kind=query_pb2.MESSAGE_ID_KIND_OFFSET).SerializeToString()
                    for _ in range(spec.requests)]
        return "ViewMessage", requests, MESSAGES_PREFIX, 1
    if kind == "time":
        requests = [query_pb2.SearchOffsetRequest(
            topic=TOPIC, queue_id=rng.randrange(QUEUES),
            timestamp=rng.randint(loaded.first_store_ms, loaded.last_store_ms)).SerializeToString()
            for _ in range(spec.requests)]
        return "SearchOffset", requests, b"", 1
    raise ValueError(f"unknown case {spec.case}")


def check_sample(method: str, answer: bytes) -> None:
    """Parse one answer in full: the cheap prefix check must not hide a wrong answer."""
    if method == "PullMessage":
        pulled = query_pb2.PullMessageResponse.FromString(answer)
        assert pulled.status == query_pb2.GET_MESSAGE_STATUS_FOUND and len(pulled.messages) == PULL_BATCH
        assert all(len(m.body) == BODY_SIZE for m in pulled.messages)
    elif method == "QueryMessage":
        assert len(query_pb2.QueryMessageResponse.FromString(answer).messages) == 1
    elif method == "ViewMessage":
        assert query_pb2.ViewMessageResponse.FromString(answer).message.msg_id
    else:
        query_pb2.SearchOffsetResponse.FromString(answer)


async def _client(spec: ClientSpec, ready: Any, go: Any) -> dict[str, Any]:
    method, requests, prefix, per_answer = build_requests(spec)
    latencies: array[int] = array("q")
    failed = 0
    answers = 0
    async with grpc.aio.insecure_channel(spec.target, options=CHANNEL_OPTIONS) as channel:
        call = channel.unary_unary(f"/{SERVICE}/{method}", None, None)  # bytes in, bytes out
        await call(requests[0], timeout=30)  # connected before the clock starts
        ready.set()
        while not go.is_set():
            await asyncio.sleep(0.001)
        deadline = time.monotonic() + spec.seconds

        async def worker(index: int) -> None:
            nonlocal failed, answers
            n = len(requests)
            i = index * 7919
            while time.monotonic() < deadline:
                request = requests[i % n]
                i += 1
                t0 = time.perf_counter_ns()
                try:
                    answer: bytes = await call(request, timeout=30)
                except grpc.aio.AioRpcError:
                    failed += 1
                    continue
                latencies.append(time.perf_counter_ns() - t0)
                if not answer.startswith(prefix):
                    failed += 1
                    continue
                answers += 1
                if answers % SAMPLE_EVERY == 0:
                    check_sample(method, answer)

        started = time.monotonic()
        await asyncio.gather(*(worker(k) for k in range(spec.concurrency)))
        elapsed = time.monotonic() - started
    return {"msgs": answers * per_answer, "calls": answers, "failed": failed, "seconds": elapsed,
            "latencies": latencies.tobytes(), "perAnswer": per_answer}


def client_main(spec: ClientSpec, ready: Any, go: Any, results: Any) -> None:
    results.put(asyncio.run(_client(spec, ready, go)))


def run_clients(spec: ClientSpec, procs: int,
                server_pids: Sequence[int]) -> tuple[list[dict[str, Any]], dict[str, float]]:
    ctx = multiprocessing.get_context("spawn")  # no fork: the parent holds gRPC state
    results = ctx.Queue()
    go = ctx.Event()
    readies = [ctx.Event() for _ in range(procs)]
    workers = [ctx.Process(target=client_main, args=(ClientSpec(**{**spec.__dict__, "seed": spec.seed + p}),
                                                     readies[p], go, results), daemon=True)
               for p in range(procs)]
    for w in workers:
        w.start()
    for ready in readies:
        if not ready.wait(120):
            raise RuntimeError("a client did not connect")
    meter = CpuMeter([*server_pids, *(w.pid for w in workers if w.pid)], include_self=False)
    servers = CpuMeter(server_pids, include_self=False)
    go.set()
    collected = [results.get(timeout=spec.seconds + 120) for _ in workers]
    cpu = {**meter.stop(), "cpuSrv": servers.stop()["cpuOurs"]}
    for w in workers:
        w.join(30)
    return collected, cpu


# -- the cases --------------------------------------------------------------------------------------
def run_rep(case: str, rep: int, args: argparse.Namespace, services: list[Service], loaded: Loaded) -> RepResult:
    wait_quiet(args.wait_quiet)
    single = case.endswith("-1")
    spec = ClientSpec(case, services[2].target, args.duration, 1 if single else args.concurrency, 1000 * rep + 1,
                      loaded)
    spy = profiler(args.profile, services[2].pid, f"{case}-{rep}")
    try:
        parts, cpu = run_clients(spec, 1 if single else args.procs, [s.pid for s in services])
    finally:
        if spy is not None:
            spy.stop()
    latencies: array[int] = array("q")
    for part in parts:
        latencies.frombytes(part["latencies"])
    msgs = sum(p["msgs"] for p in parts)
    seconds = max(p["seconds"] for p in parts)
    per_answer = parts[0]["perAnswer"]
    body = msgs * BODY_SIZE if case.startswith("pull") else 0
    return RepResult(case, rep, msgs, seconds, body, body, latencies, msgs_per_call=per_answer,
                     failed=sum(p["failed"] for p in parts),
                     extra={**cpu, "callsPerSec": round(sum(p["calls"] for p in parts) / seconds, 1),
                            "target": TARGETS.get(case, "-")})


EXTRA_COLUMNS = [("calls/s", lambda r: r.extra.get("callsPerSec"), "{:,.0f}"),
                 ("cpu srv", lambda r: r.extra.get("cpuSrv"), "{:.2f}"),
                 ("failed", lambda r: r.failed, "{:,}"),
                 ("target", lambda r: r.extra.get("target"), "{}")]
ALL_CASES = ("pull", "pull-1", "key", "key-1", "id", "id-1", "time", "time-1")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.query", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(parser)
    parser.add_argument("--cases", default=",".join(ALL_CASES), help=f"comma-separated, of {', '.join(ALL_CASES)}")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per rep (default 10)")
    parser.add_argument("--procs", type=int, default=2, help="client processes (default 2)")
    parser.add_argument("--concurrency", type=int, default=16, help="calls in flight per client process (default 16)")
    parser.add_argument("--pull-messages", type=int, default=160_000, help="1 KiB messages to pull (default 160,000)")
    parser.add_argument("--key-messages", type=int, default=333_334,
                        help="messages with 3 KEYS each (default 333,334: 1,000,002 keys)")
    parser.add_argument("--read-from", choices=("files", "grpc"), default="files",
                        help="the query service's data reads: from the store files (default, as mqstore up) or "
                             "over gRPC from the indexer and the commitlog service")
    args = parser.parse_args(argv)
    cases = [c for c in args.cases.split(",") if c]
    if unknown := set(cases) - set(ALL_CASES):
        parser.error(f"unknown cases {sorted(unknown)}")
    settings = parse_settings(parser, args.set)
    print_machine()
    results: list[RepResult] = []
    with scratch_dir("query-", keep=args.keep_store) as root:
        services = start_services(root, settings, args.read_from)
        try:
            progress(f"loading {args.pull_messages:,} pull messages and {args.key_messages:,} key messages ...")
            loaded = load(services, args.pull_messages, args.key_messages)
            keys = args.key_messages * (KEYS_PER_MESSAGE + 1) + args.pull_messages
            print(f"load: appended in {loaded.load_seconds:.1f} s, dispatched (ConsumeQueue + {keys:,} index keys) "
                  f"after {loaded.dispatch_seconds:.1f} s", flush=True)
            for case in cases:
                for rep in range(1, args.reps + 1):
                    progress(f"{case} rep {rep} ...")
                    results.append(run_rep(case, rep, args, services, loaded))
        finally:
            codes = {s.name: s.stop() for s in reversed(services)}
            if any(codes.values()):
                progress(f"warning: unclean stops {codes}")
    print_table("Query service (median of the reps in bold)", results, EXTRA_COLUMNS)
    print_summary(results, EXTRA_COLUMNS)
    if args.json:
        emit_json("query", results, {k: v for k, v in vars(args).items() if k != "set"} | {"settings": settings})
    return 0


if __name__ == "__main__":
    sys.exit(main())
