"""Delayed delivery on time under load: how late does the scheduler re-put due messages?

    python -m bench.scheduler_lateness                     # 10,000 msgs/s for 10 s: DELAY 1, DELAY 2, timers
    python -m bench.scheduler_lateness --kinds 1,2         # DELAY levels 1 and 2 only
    python -m bench.scheduler_lateness --quick             # a few seconds: checks the harness (smoke test)
    python -m bench.scheduler_lateness --profile FILE      # py-spy folded stacks of the scheduler as well
    mqstore bench scheduler-lateness ...                   # the same

A whole ``mqstore up`` (bench/gateway.py's System: fresh store, free loopback ports, SIGTERM at the
end, exit code checked; ``messageDelayLevel`` RocketMQ's default, 1s 5s 10s ...) and ``--procs``
sender processes (spawned; a barrier starts them together) that send blob SendBatch calls of
``--batch`` messages at a steady ``--rate`` over all processes for ``--duration`` seconds, each batch
of one kind in turn: ``1`` / ``2`` (the DELAY property: the store parks it in SCHEDULE_TOPIC_XXXX;
due = its store timestamp there + the level's delay) or ``timer`` (TIMER_DELIVER_MS = the send time +
``--timer-ms``; due = that timestamp). Each body starts with its sender and sequence number.

When every message has come back in the real topic (or the wait ran out), every queue of the topic
is pulled (raw records) and each delivered copy's *lateness* computed: its store timestamp in the real
topic - its due time (both from the store's clock, in ms). Printed: p50/p99/max per kind and over
all, deliveries before due (must be 0), the achieved send rate, sent vs delivered (loss must be 0)
and duplicates, and the cores each service used from the first send to the last delivery (where the
time goes). The issue's target: p99 <= 100 ms at 10,000 scheduled msgs/s. Exit code 1 on a lost
message or an early delivery; a missed target is reported, not an error.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import subprocess
import sys
import time
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import grpc

from bench.client_procs import run_client_processes
from bench.report import CpuMeter, percentile, progress, wait_quiet
from bench.workload import QUEUES, print_machine
from mqstore.client.batch_encoder import encode_entry, properties_bytes
from mqstore.client.records import decode_records
from mqstore.v1 import commitlog_pb2, gateway_pb2, query_pb2
from services.store.formats.message import DEFAULT_MESSAGE_DELAY_LEVEL, SCHEDULE_TOPIC, parse_delay_levels

SERVICE = "mqstore.v1.MessagingService"
SEND_BATCH = f"/{SERVICE}/SendBatch"
PULL = f"/{SERVICE}/Pull"
TOPIC = "BenchDelayed"
WARM_TOPIC = "BenchDelayedWarmUp"
TIMER = "timer"
TIMER_PROPERTY = "TIMER_DELIVER_MS"
TARGET_P99_MS = 100.0
#: "L" + sender (3 digits) + ":" + sequence number (11 digits): every body starts with its id.
HEADER = 16
STORED = frozenset({commitlog_pb2.PUT_MESSAGE_STATUS_PUT_OK, commitlog_pb2.PUT_MESSAGE_STATUS_FLUSH_DISK_TIMEOUT,
                    commitlog_pb2.PUT_MESSAGE_STATUS_FLUSH_SLAVE_TIMEOUT,
                    commitlog_pb2.PUT_MESSAGE_STATUS_SLAVE_NOT_AVAILABLE})
MIB = 1024 * 1024
CHANNEL_OPTIONS = [("grpc.max_receive_message_length", 64 * MIB), ("grpc.max_send_message_length", 64 * MIB),
                   ("grpc.use_local_subchannel_pool", 1)]


def header(proc: int, seq: int) -> bytes:
    return b"L%03d:%011d" % (proc, seq)


def parse_header(body: bytes) -> tuple[int, int]:
    return int(body[1:4]), int(body[5:HEADER])


def now_ms() -> int:
    return time.time_ns() // 1_000_000


# -- the senders ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SenderSpec:
    """What one sender process does (picklable: it crosses to a spawned process)."""

    target: str
    rate: float  # this process's msgs/s
    duration_s: float
    batch: int
    inflight: int
    body_size: int
    kinds: tuple[str, ...]
    delays_ms: tuple[int, ...]
    timer_ms: int
    topic: str = TOPIC
    proc: int = 0


class _Sender:
    """Paced sends: batch ``b`` leaves at ``start + b * batch / rate`` (``inflight`` calls at most at
    once); each message's due time is kept by its sequence number."""

    def __init__(self, spec: SenderSpec) -> None:
        self.spec = spec
        self.batches = max(1, math.ceil(spec.rate * spec.duration_s / spec.batch))
        total = self.batches * spec.batch
        self.due = array("q", bytes(8 * total))
        self.sent = 0
        self.next_batch = 0
        self.behind_ms = 0.0  # how far the sends fell behind their schedule, at most
        self.errors: list[str] = []
        self.padding = os.urandom(max(0, spec.body_size - HEADER))
        self.delay_properties = {kind: properties_bytes({"DELAY": kind}) for kind in spec.kinds if kind != TIMER}

    def _request(self, b: int, kind: str) -> tuple[bytes, int]:
        """A serialised SendBatchRequest of batch ``b``, and its TIMER_DELIVER_MS (0 for a DELAY kind)."""
        spec = self.spec
        deliver = 0
        if kind == TIMER:
            deliver = now_ms() + spec.timer_ms
            props = properties_bytes({TIMER_PROPERTY: str(deliver)})
        else:
            props = self.delay_properties[kind]
        first = b * spec.batch
        blob = b"".join(encode_entry(header(spec.proc, seq) + self.padding, 0, props)
                        for seq in range(first, first + spec.batch))
        request = gateway_pb2.SendBatchRequest(topic=spec.topic, encoded_messages=blob,
                                               queue_id=(spec.proc + b) % QUEUES)
        return request.SerializeToString(), deliver

    def _record(self, b: int, kind: str, deliver: int, response: gateway_pb2.SendBatchResponse) -> None:
        spec, first = self.spec, b * self.spec.batch
        if response.results:
            stored = [(r.status, r.topic, r.store_timestamp) for r in response.results]
        else:
            receipt = response.receipt
            stored = [(receipt.status, receipt.topic, receipt.store_timestamp)] * spec.batch
        if len(stored) != spec.batch:
            raise RuntimeError(f"batch {b}: {len(stored)} results for {spec.batch} messages")
        for i, (status, topic, store_timestamp) in enumerate(stored):
            if status not in STORED:
                raise RuntimeError(f"batch {b} message {i}: status {status}")
            if topic == spec.topic:
                raise RuntimeError(f"a {kind!r} message was stored straight in {topic} (this store does not "
                                   f"schedule it{': no timer messages?' if kind == TIMER else ''})")
            if kind == TIMER:
                self.due[first + i] = deliver
            else:
                if topic != SCHEDULE_TOPIC:
                    raise RuntimeError(f"a DELAY={kind} message was stored in {topic}, not {SCHEDULE_TOPIC}")
                self.due[first + i] = store_timestamp + spec.delays_ms[int(kind) - 1]
        self.sent += spec.batch

    async def worker(self, call: Any, started: float) -> None:
        spec = self.spec
        while self.next_batch < self.batches:
            b = self.next_batch
            self.next_batch += 1
            wait = started + b * spec.batch / spec.rate - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            else:
                self.behind_ms = max(self.behind_ms, -wait * 1000)
            kind = spec.kinds[b % len(spec.kinds)]
            request, deliver = self._request(b, kind)
            try:
                raw = await call(request, timeout=30)
            except grpc.aio.AioRpcError as exc:
                self.errors.append(f"batch {b}: {exc.code().name}: {exc.details()}")
                continue
            self._record(b, kind, deliver, gateway_pb2.SendBatchResponse.FromString(raw))


async def _send(spec: SenderSpec, ready: Any) -> dict[str, Any]:
    sender = _Sender(spec)
    async with grpc.aio.insecure_channel(spec.target, options=CHANNEL_OPTIONS) as channel:
        await asyncio.wait_for(channel.channel_ready(), 30)
        call = channel.unary_unary(SEND_BATCH, request_serializer=None, response_deserializer=None)
        ready.wait(timeout=300)
        started_ns = time.time_ns()
        started = time.monotonic()
        await asyncio.gather(*(sender.worker(call, started) for _ in range(spec.inflight)))
        ended_ns = time.time_ns()
    return {"proc": spec.proc, "sent": sender.sent, "started": started_ns, "ended": ended_ns,
            "behind_ms": sender.behind_ms, "errors": sender.errors[:10], "error_count": len(sender.errors),
            "due": sender.due.tobytes()}


def sender_main(spec: SenderSpec, ready: Any, results: Any) -> None:
    """One sender process: its report through ``results``; on failure it breaks the barrier."""
    try:
        report = asyncio.run(_send(spec, ready))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        with contextlib.suppress(Exception):
            ready.abort()
        report = {"fatal": f"sender {spec.proc}: {exc!r}"}
    results.put(report)


# -- reading what was delivered -----------------------------------------------------------------------
def delivered_count(channel: grpc.Channel, topic: str) -> int:
    offsets = channel.unary_unary(f"/{SERVICE}/GetQueueOffsets",
                                  request_serializer=query_pb2.GetQueueOffsetRangeRequest.SerializeToString,
                                  response_deserializer=query_pb2.QueueOffsetRange.FromString)
    total = 0
    for queue_id in range(QUEUES):
        try:
            request = query_pb2.GetQueueOffsetRangeRequest(topic=topic, queue_id=queue_id)
            total += offsets(request, timeout=10).max_offset
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.NOT_FOUND:  # a queue nothing was delivered to yet
                raise
    return total


def wait_delivered(target: str, topic: str, expected: int, timeout_s: float) -> int:
    """Wait until the real topic holds ``expected`` messages (or ``timeout_s`` passed); the count."""
    deadline = time.monotonic() + timeout_s
    with grpc.insecure_channel(target) as channel:
        while True:
            count = delivered_count(channel, topic)
            if count >= expected or time.monotonic() > deadline:
                return count
            time.sleep(0.1)


def pull_all(target: str, topic: str) -> list[tuple[bytes, int]]:
    """(body header, store timestamp) of every message in the topic's queues."""
    found: list[tuple[bytes, int]] = []
    with grpc.insecure_channel(target, options=CHANNEL_OPTIONS) as channel:
        pull = channel.unary_unary(PULL, request_serializer=query_pb2.PullMessageRequest.SerializeToString,
                                   response_deserializer=query_pb2.PullMessageResponse.FromString)
        for queue_id in range(QUEUES):
            offset = 0
            while True:
                response = pull(query_pb2.PullMessageRequest(topic=topic, queue_id=queue_id, queue_offset=offset,
                                                             max_messages=1024, max_bytes=32 * MIB,
                                                             raw_records=True), timeout=60)
                if response.status != query_pb2.GET_MESSAGE_STATUS_FOUND or response.next_begin_offset <= offset:
                    break
                found.extend((m.body[:HEADER], m.store_timestamp)
                             for m in decode_records(response.records, queue_id))
                offset = response.next_begin_offset
    return found


# -- the run -------------------------------------------------------------------------------------------
@dataclass
class Outcome:
    sent: int
    send_rate: float
    delivered: int
    lost: int
    duplicates: int
    early: int
    lateness_ms: dict[str, list[int]]  # per kind, sorted
    worst_by_second: dict[str, list[int]]
    dispatch_lag: str
    pulled: Sequence[tuple[bytes, int]]
    window_s: float  # from the first send to the last delivery
    load_before: float  # cores the rest of the machine used just before the sends (NaN: not measured)
    behind_ms: float
    send_errors: int
    cores: dict[str, float]

    def row(self, kind: str) -> dict[str, Any]:
        return lateness_row(kind, self.lateness_ms[kind])


def lateness_row(kind: str, values: Sequence[int]) -> dict[str, Any]:
    """One line of the table: lateness percentiles (ms) of sorted ``values``."""
    return {"kind": kind, "delivered": len(values), "p50": percentile(values, 50), "p99": percentile(values, 99),
            "max": values[-1] if values else float("nan"), "min": values[0] if values else float("nan")}


def analyse(reports: Sequence[dict[str, Any]], pulled: Sequence[tuple[bytes, int]], kinds: Sequence[str],
            batch: int) -> tuple[dict[str, list[int]], int, int, int, int]:
    """Lateness per kind (sorted), and lost, duplicated, early and unknown counts."""
    due = {r["proc"]: array("q", r["due"]) for r in reports}
    seen = {proc: bytearray(len(d)) for proc, d in due.items()}
    lateness: dict[str, list[int]] = {kind: [] for kind in kinds}
    duplicates = early = unknown = 0
    for head, store_timestamp in pulled:
        try:
            proc, seq = parse_header(head)
            deadline = due[proc][seq]
        except (ValueError, KeyError, IndexError):
            unknown += 1
            continue
        if deadline == 0:  # a message whose send failed (no due time known) and yet was stored
            unknown += 1
            continue
        if seen[proc][seq]:
            duplicates += 1
            continue
        seen[proc][seq] = 1
        late = store_timestamp - deadline
        early += late < 0
        lateness[kinds[(seq // batch) % len(kinds)]].append(late)
    lost = sum(1 for proc, d in due.items() for seq, deadline in enumerate(d) if deadline and not seen[proc][seq])
    for values in lateness.values():
        values.sort()
    return lateness, lost, duplicates, early, unknown


def lateness_by_second(reports: Sequence[dict[str, Any]], pulled: Sequence[tuple[bytes, int]],
                       kinds: Sequence[str], batch: int) -> dict[str, list[int]]:
    """The worst lateness (ms) of first deliveries per second of due time, per kind and over all ("all"),
    from the first due second on (no message due in a second: 0). Lateness that builds up second after
    second is a scheduler short of throughput (its deliveries per second then, :func:`peak_delivery_rate`,
    are what it can do); one bad second is a stall (a pause of the process, or of the machine); one kind
    late while another is on time is a kind waiting for another."""
    due = {r["proc"]: array("q", r["due"]) for r in reports}
    seen: set[tuple[int, int]] = set()
    worst: dict[str, dict[int, int]] = {kind: {} for kind in (*kinds, "all")}
    for head, store_timestamp in pulled:
        try:
            proc, seq = parse_header(head)
            deadline = due[proc][seq]
        except (ValueError, KeyError, IndexError):
            continue
        if not deadline or (proc, seq) in seen:
            continue
        seen.add((proc, seq))
        second, late = deadline // 1000, store_timestamp - deadline
        for kind in (kinds[(seq // batch) % len(kinds)], "all"):
            worst[kind][second] = max(worst[kind].get(second, -(1 << 62)), late)
    if not worst["all"]:
        return {kind: [] for kind in worst}
    first, last = min(worst["all"]), max(worst["all"])
    return {kind: [seconds.get(second, 0) for second in range(first, last + 1)] for kind, seconds in worst.items()}


def peak_delivery_rate(pulled: Sequence[tuple[bytes, int]]) -> int:
    """The most deliveries stored in one second (of store time, whole seconds between the first and
    the last delivery only)."""
    per_second: dict[int, int] = {}
    for _, store_timestamp in pulled:
        per_second[store_timestamp // 1000] = per_second.get(store_timestamp // 1000, 0) + 1
    inner = sorted(per_second)[1:-1]
    return max((per_second[second] for second in inner), default=0)


def _warm_up(system: Any, delays_ms: tuple[int, ...], timeout_s: float = 30.0) -> None:
    """One DELAY=1 batch delivered before the clock starts: the commitlog's first file, the scheduler's
    first read of the parked records and its first re-put all happen here, not in the measurement."""
    from bench.gateway import create_topic

    create_topic(system.gateway, WARM_TOPIC)
    spec = SenderSpec(system.gateway, 1.0, 1.0, 64, 1, 128, ("1",), delays_ms, 0, topic=WARM_TOPIC, proc=999)
    sender = _Sender(spec)
    request, _ = sender._request(0, "1")
    with grpc.insecure_channel(system.gateway, options=CHANNEL_OPTIONS) as channel:
        channel.unary_unary(SEND_BATCH, request_serializer=None, response_deserializer=None)(request, timeout=60)
    if wait_delivered(system.gateway, WARM_TOPIC, 64, timeout_s + delays_ms[0] / 1000) < 64:
        raise RuntimeError("the warm-up's delayed messages were not delivered: is the scheduler running?")


def measure(args: argparse.Namespace, kinds: tuple[str, ...], delays_ms: tuple[int, ...]) -> Outcome:
    from bench.dispatch_lag import LagSampler
    from bench.gateway import create_topic, running_system, settle

    settings = {"MQSTORE_LOG_LEVEL": "WARNING", "MQSTORE_MESSAGE_DELAY_LEVEL": args.delay_levels}
    with running_system(settings, keep_store=args.keep_store) as system:
        create_topic(system.gateway, TOPIC)
        _warm_up(system, delays_ms)
        settle(system, 30)
        quiet = wait_quiet(args.wait_quiet) if args.wait_quiet > 0 else float("nan")
        spec = SenderSpec(system.gateway, args.rate / args.procs, args.duration, args.batch, args.inflight,
                          args.body_size, kinds, delays_ms, args.timer_ms)
        furthest_ms = max(args.timer_ms if kind == TIMER else delays_ms[int(kind) - 1] for kind in kinds)
        services = {name: CpuMeter([pid], include_self=False) for name, pid in system.children.items()}
        window_started = time.monotonic()
        # The indexer's dispatch lag: the scheduler sees a parked unit only once it is dispatched.
        sampler = LagSampler(f"127.0.0.1:{system.base_port + 2}")
        sampler.start()
        profiler = _start_profiler(args.profile, system.children["scheduler"],
                                   args.duration + furthest_ms / 1000 + 3) if args.profile else None
        try:
            progress(f"sending {args.rate:,.0f} msgs/s for {args.duration:.0f} s ({'/'.join(kinds)}), "
                     f"{args.procs} process(es)")
            reports, figures = run_client_processes(
                sender_main, [replace(spec, proc=p) for p in range(args.procs)], "lateness-sender",
                args.duration, lambda pids: {"clients": CpuMeter(pids, include_self=False),
                                             "all": CpuMeter([*system.pids, *pids])}, what="sender")
            sent = sum(r["sent"] for r in reports)
            progress(f"sent {sent:,}; waiting for their delivery")
            count = wait_delivered(system.gateway, TOPIC, sent, furthest_ms / 1000 + args.wait)
            cores = {name: meter.stop()["cpuOurs"] for name, meter in services.items()}
            window_s = time.monotonic() - window_started
            sampler.stop()
            cores["senders"] = figures["clients"]["cpuOurs"]
            cores["other (while sending)"] = figures["all"]["cpuOther"]
            if count >= sent:
                time.sleep(args.grace)  # a repeat would land just after the last first delivery
            pulled = pull_all(system.gateway, TOPIC)
        finally:
            if profiler is not None:
                _stop_profiler(profiler, args.profile)
            sampler.close()
    lag_ms = sorted(sampler.lag_ms)
    lag = (f"p50 {percentile(lag_ms, 50):.0f} ms, p99 {percentile(lag_ms, 99):.0f} ms, max {lag_ms[-1]:.0f} ms"
           if lag_ms else "not sampled")
    seconds = (max(r["ended"] for r in reports) - min(r["started"] for r in reports)) / 1e9
    lateness, lost, duplicates, early, unknown = analyse(reports, pulled, kinds, args.batch)
    if unknown:
        progress(f"warning: {unknown} delivered messages match no acknowledged send")
    return Outcome(sent=sent, send_rate=sent / seconds, delivered=len(pulled), lost=lost, duplicates=duplicates,
                   early=early, lateness_ms=lateness, behind_ms=max(r["behind_ms"] for r in reports),
                   send_errors=sum(r["error_count"] for r in reports), cores=cores,
                   worst_by_second=lateness_by_second(reports, pulled, kinds, args.batch), dispatch_lag=lag,
                   pulled=pulled, window_s=window_s, load_before=quiet)


def _start_profiler(path: str, pid: int, seconds: float) -> subprocess.Popen[bytes]:
    py_spy = str(Path(sys.executable).parent / "py-spy")
    return subprocess.Popen([py_spy, "record", "--pid", str(pid), "--duration", str(math.ceil(seconds)),
                             "--format", "raw", "--nonblocking", "--gil", "--output", path],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _stop_profiler(profiler: subprocess.Popen[bytes], path: str) -> None:
    try:
        profiler.wait(60)
    except subprocess.TimeoutExpired:
        profiler.kill()
        profiler.wait()
    progress(f"scheduler profile: {path} (python -m bench.profile_summary {path})")


def report(outcome: Outcome, args: argparse.Namespace, kinds: Sequence[str]) -> None:
    print(f"sent {outcome.sent:,} scheduled messages at {outcome.send_rate:,.0f} msgs/s (target {args.rate:,.0f}; "
          f"batches of {args.batch}, {args.procs} process(es) x {args.inflight} in flight, sends at most "
          f"{outcome.behind_ms:.0f} ms behind schedule, {outcome.send_errors} failed calls)")
    print(f"delivered {outcome.delivered:,}: lost {outcome.lost}, duplicates {outcome.duplicates}, "
          f"before due {outcome.early}")
    print(f"{'kind':>6} {'delivered':>10} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'min ms':>8}")
    rows = [outcome.row(kind) for kind in kinds]
    merged = sorted(v for kind in kinds for v in outcome.lateness_ms[kind])
    everything = lateness_row("all", merged)
    for row in [*rows, everything]:
        print(f"{row['kind']:>6} {row['delivered']:>10,} {row['p50']:>8.0f} {row['p99']:>8.0f} {row['max']:>8.0f} "
              f"{row['min']:>8.0f}")
    print("worst lateness per second of due time (ms), from the first due second on:")
    for kind, series in outcome.worst_by_second.items():
        print(f"{kind:>6}: {' '.join(str(v) for v in series)}")
    print(f"indexer dispatch lag while sending and delivering: {outcome.dispatch_lag}; most deliveries in one "
          f"second: {peak_delivery_rate(outcome.pulled):,}")
    print(f"cores over the {outcome.window_s:.1f} s from the first send to the last delivery: "
          + ", ".join(f"{name} {value:.2f}" for name, value in outcome.cores.items())
          + f" (the rest of the machine before the sends: {outcome.load_before:.2f})")
    per_message = outcome.cores.get("scheduler", 0.0) * outcome.window_s / max(1, outcome.delivered) * 1e6
    print(f"scheduler CPU per delivered message: {per_message:.0f} us")
    verdict = "met" if everything["p99"] <= TARGET_P99_MS else "MISSED"
    print(f"target p99 <= {TARGET_P99_MS:.0f} ms late at {args.rate:,.0f} msgs/s: {verdict} "
          f"(p99 {everything['p99']:.0f} ms at {outcome.send_rate:,.0f} msgs/s)")
    if args.json:
        print(json.dumps({"bench": "scheduler_lateness", "config": vars(args),
                          "sent": outcome.sent, "send_rate": round(outcome.send_rate), "delivered": outcome.delivered,
                          "lost": outcome.lost, "duplicates": outcome.duplicates, "early": outcome.early,
                          "rows": [*rows, everything], "cores": outcome.cores,
                          "worst_by_second": outcome.worst_by_second, "dispatch_lag": outcome.dispatch_lag,
                          "peak_delivery_rate": peak_delivery_rate(outcome.pulled)}))


def build_parser(prog: str = "python -m bench.scheduler_lateness") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=10_000, help="scheduled msgs/s over all senders (10,000)")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds of sending (10)")
    parser.add_argument("--kinds", default="1,2,timer",
                        help="comma list: delay levels and/or 'timer' (1,2,timer)")
    parser.add_argument("--timer-ms", type=int, default=2000, help="timer messages: due this long after the send")
    parser.add_argument("--delay-levels", default=DEFAULT_MESSAGE_DELAY_LEVEL, help="the store's messageDelayLevel")
    parser.add_argument("--batch", type=int, default=100, help="messages per SendBatch (100)")
    parser.add_argument("--procs", type=int, default=1, help="sender processes (1)")
    parser.add_argument("--inflight", type=int, default=4, help="calls in flight per sender process (4)")
    parser.add_argument("--body-size", type=int, default=1024, help="bytes per body (1024)")
    parser.add_argument("--wait", type=float, default=60.0,
                        help="seconds to wait for deliveries past the furthest due time (60)")
    parser.add_argument("--grace", type=float, default=1.0,
                        help="seconds to wait after the last delivery before reading (duplicates) (1)")
    parser.add_argument("--profile", metavar="FILE",
                        help="py-spy folded stacks of the scheduler (GIL holders only) into FILE")
    parser.add_argument("--wait-quiet", type=float, default=60.0, metavar="SECONDS",
                        help="wait up to this long for a second in which the rest of the machine is idle (60; 0: no)")
    parser.add_argument("--keep-store", action="store_true")
    parser.add_argument("--json", action="store_true", help="also print one JSON line")
    parser.add_argument("--quick", action="store_true", help="500 msgs/s for 2 s, level 1 and 1 s timers (smoke test)")
    return parser


def main(argv: Sequence[str] | None = None, prog: str = "python -m bench.scheduler_lateness") -> int:
    args = build_parser(prog).parse_args(argv)
    if args.quick:
        args.rate, args.duration, args.kinds, args.batch, args.wait, args.grace = 500.0, 2.0, "1,timer", 50, 30.0, 0.5
        args.timer_ms = 1000
        args.wait_quiet = 0.0
    delays_ms = parse_delay_levels(args.delay_levels)
    kinds = tuple(k.strip() for k in args.kinds.split(",") if k.strip())
    for kind in kinds:
        if kind != TIMER and not (kind.isdigit() and 1 <= int(kind) <= len(delays_ms)):
            raise SystemExit(f"{prog}: --kinds: {kind!r} is neither 'timer' nor a delay level 1..{len(delays_ms)}")
    if not kinds or args.rate <= 0 or args.duration <= 0 or args.batch <= 0 or args.body_size < HEADER:
        raise SystemExit(f"{prog}: need kinds, a positive rate, duration and batch, and bodies of >= {HEADER} bytes")
    print_machine()
    outcome = measure(args, kinds, delays_ms)
    report(outcome, args, kinds)
    return 1 if outcome.lost or outcome.early else 0


if __name__ == "__main__":
    sys.exit(main())
