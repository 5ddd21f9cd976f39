"""End to end through the gateway: produce and pull 1 KiB messages against a whole ``mqstore up``.

    python -m bench.gateway                              # every case, 3 reps of 3 s (about 2.5 min)
    python -m bench.gateway --cases batch,pull --reps 1
    python -m bench.gateway --cases batch --batch 64,256 --procs 2 --inflight 2
    python -m bench.gateway --tiny                       # every case tiny: checks the harness (smoke test)
    mqstore bench ...                                    # the same, with progress bars on a terminal

Each case starts ``mqstore up --store <fresh dir> --base-port B --metrics-base-port M`` on free
loopback ports (store settings as ``MQSTORE_*`` environment variables: ``--set``; the caller's own
MQSTORE_*/OTEL_* variables are dropped), waits for "mqstore is up" and the gateway's health SERVING,
creates the topic through the gateway, runs its reps, and stops the system with SIGTERM to the
runner's PID, checking that it exits 0. Clients are ``--procs`` separate processes (spawned, so the
client's Python has its own GIL) running grpc.aio coroutines. Requests are serialised before the
clock starts, from a pool of ``--request-pool`` distinct messages per process (UNIQ_KEYs repeat after
that many); answers are taken as bytes and checked (every message's status; pulls by their offsets).

Cases (the workload of bench/workload.py: 1 KiB random bodies, UNIQ_KEY + CLUSTER, 8 queues, 1188 B
stored records; ASYNC_FLUSH unless said):
  batch   SendBatch of ``--batch`` messages (a comma list: one row each), ``--inflight`` calls in flight
          per process (each coroutine one call at a time)
  stream  SendStream, pipelined: ``--streams`` streams per process, at most ``--window`` messages
          unacknowledged per stream (the gateway appends whatever has arrived as one batch); and
          ``bstream``: SendBatchStream of blob batches of the largest ``--batch``, at most
          ``--batch-window`` batches unacknowledged per stream
  blob    (rows of batch, and of sync with --sync-batch) the same batches as one bytes blob in
          RocketMQ's batch encoding (SendBatchRequest.encoded_messages), answered by one receipt
  sync    SYNC_FLUSH server, ``--sync-producers`` producers (default 64) each doing unary Send one at a
          time, as coroutines spread over ``--sync-procs`` processes
  send    one producer, unary Send one at a time: latency p50/p99/p999 (and its throughput)
  pull    ``--preload`` messages are sent first (SendBatch of 1024, not timed) and dispatched; then
          ``--pull-procs`` x ``--pull-inflight`` consumers pull ``--pull-max`` messages per call across
          the 8 queues (wrapping to offset 0 at a queue's end). Three rows: ``pull raw`` decodes only
          each answer's header (status, next offset; every 64th answer in full), which measures the
          system; ``pull parsed`` decodes every message, as a consumer would; ``pull records`` asks for
          the stored record bytes (raw_records) and decodes every record with the client library
          (mqstore.client.records), as its consumers do

After every produce rep the benchmark waits until the topic's ConsumeQueues (GetQueueOffsets through
the gateway) hold exactly what was acknowledged; ``catch-up s`` is how long after the last ack that
took (the messages are pullable from then on). ``cpu srv`` is the cores used by the runner and its four
services, ``cpu gw``/``cl``/``ix``/``q`` by the gateway, commitlog, indexer and query service alone,
``cpu ours`` by everything of the benchmark (clients included), ``cpu other`` by the rest of the
machine (other people's work on a shared machine; ``load`` is the 1-minute load average before the
rep). ``wire MB/s`` counts request bytes (sends) or answer bytes (pulls). MB = 10^6 B; latencies are
per call (a stream's: per message, send to ack). Before each rep the benchmark waits (``--settle``)
until the system is idle: the first put makes the commitlog prefault its 1 GiB file for seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import re
import signal
import subprocess
import sys
import time
from array import array
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import Message as ProtoMessage
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.client_procs import run_client_processes
from bench.report import (
    MB,
    Column,
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
from bench.services import free_port_block, mqstore_command
from bench.workload import (
    BODY_SIZE,
    BORN_HOST,
    CLUSTER,
    QUEUES,
    RECORD_SIZE,
    REPO,
    TOPIC,
    Workload,
    drop_caches,
    print_machine,
    scratch_dir,
)
from mqstore.client.batch_encoder import encode_entry, properties_bytes
from mqstore.client.progress import Progress
from mqstore.client.records import decode_records
from mqstore.v1 import commitlog_pb2, common_pb2, gateway_pb2, gateway_pb2_grpc, query_pb2
from services.runner import is_child_command

SERVICE = "mqstore.v1.MessagingService"
SEND = f"/{SERVICE}/Send"
SEND_BATCH = f"/{SERVICE}/SendBatch"
SEND_STREAM = f"/{SERVICE}/SendStream"
SEND_BATCH_STREAM = f"/{SERVICE}/SendBatchStream"
PULL = f"/{SERVICE}/Pull"
PULL_TOPIC = "BenchPull"
PRELOAD_BATCH = 1024
# A SendResult with status PUT_OK (1) starts with field 1 as a varint: tag 0x08, value 0x01; checking the
# prefix saves the client a parse per ack (the clients share the 2 CPUs with the system).
PUT_OK_PREFIX = b"\x08\x01"
PUT_OK = commitlog_pb2.PUT_MESSAGE_STATUS_PUT_OK
# Statuses of a message that was stored although the put was not fully OK (flush or replica timeouts).
STORED_NOT_OK = frozenset({commitlog_pb2.PUT_MESSAGE_STATUS_FLUSH_DISK_TIMEOUT,
                           commitlog_pb2.PUT_MESSAGE_STATUS_FLUSH_SLAVE_TIMEOUT,
                           commitlog_pb2.PUT_MESSAGE_STATUS_SLAVE_NOT_AVAILABLE})
FOUND = query_pb2.GET_MESSAGE_STATUS_FOUND
CHECK_EVERY = 64  # pull raw: every 64th answer is decoded in full and checked
MIB = 1024 * 1024
CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 64 * MIB),
    ("grpc.max_send_message_length", 64 * MIB),
    ("grpc.use_local_subchannel_pool", 1),  # a client process's own connection, not a shared one
]
ALL_KINDS = ("batch", "stream", "sync", "send", "pull")
PRODUCE_TARGET = 100_000
SYNC_TARGET = 35_000
PULL_TARGET = 250_000
# From the issue: what other systems do on this machine, for scale.
REFERENCES = "Redis Streams pipelined XADD from Python 61,000; NATS JetStream 25,000"


# -- the system under test ---------------------------------------------------------------------------
class System:
    """``mqstore up`` as a child process (its four services are the runner's children), stopped by
    SIGTERM to the runner's PID: what Ctrl-C does, so the stop is the clean one users get."""

    _STARTED = re.compile(r"started (\w+) \(pid (\d+)\)")
    _WORKER_STARTED = re.compile(r"gateway worker (\d+)/\d+ started \(pid (\d+)\)")

    def __init__(self, scratch: Path, settings: dict[str, str], gateway_workers: int = 1) -> None:
        self.store = scratch / "store"
        self.log_path = scratch / "up.log"
        self.base_port = free_port_block(5)  # gateway, commitlog, indexer, query, scheduler
        # Metrics: commitlog, indexer, query, one port per gateway worker (gateway/workers.py), scheduler.
        self.metrics_base_port = free_port_block(5 + gateway_workers, avoid=range(self.base_port, self.base_port + 5))
        self.gateway_workers: dict[int, int] = {}  # worker index -> pid, with --gateway-workers > 1
        self.gateway = f"127.0.0.1:{self.base_port}"
        self.children: dict[str, int] = {}
        self.exit_code: int | None = None
        self.stop_seconds = 0.0
        env = {k: v for k, v in os.environ.items() if not k.startswith(("MQSTORE_", "OTEL_"))}
        env.update(settings)
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [mqstore_command(), "up", "--store", str(self.store), "--base-port", str(self.base_port),
             "--metrics-base-port", str(self.metrics_base_port),
             *(["--gateway-workers", str(gateway_workers)] if gateway_workers > 1 else [])],
            env=env, cwd=REPO, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT)

    @property
    def pids(self) -> list[int]:
        return [self.proc.pid, *self.children.values(), *self.gateway_workers.values()]

    def log_tail(self, lines: int = 30) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def wait_up(self, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            text = self.log_path.read_text(errors="replace")
            if "mqstore is up" in text:
                self.gateway_workers = {int(i): int(p) for i, p in self._WORKER_STARTED.findall(text)}
                break
            if self.proc.poll() is not None:
                raise RuntimeError(f"mqstore up exited with {self.proc.returncode}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"mqstore up was not up after {timeout_s:.0f}s:\n{self.log_tail()}")
            time.sleep(0.05)
        self.children = {name: int(pid) for name, pid in self._STARTED.findall(text)}
        if set(self.children) != {"commitlog", "indexer", "query", "gateway", "scheduler"}:
            raise RuntimeError(f"unexpected services in the log of mqstore up: {self.children}")
        with grpc.insecure_channel(self.gateway) as channel:
            status = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=SERVICE), timeout=30, wait_for_ready=True).status
        if status != health_pb2.HealthCheckResponse.SERVING:
            raise RuntimeError(f"the gateway reports {status}, not SERVING")

    def stop(self, timeout_s: float = 150.0) -> int:
        started = time.monotonic()
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
        try:
            self.exit_code = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            self.exit_code = self.proc.wait()
        self.stop_seconds = time.monotonic() - started
        self._log.close()
        return self.exit_code

    def kill(self) -> None:
        """Last resort: the runner and then its children (each in its own session), only if they are
        still the processes we started."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        for pid in self.children.values():
            with contextlib.suppress(OSError):
                if is_child_command(Path(f"/proc/{pid}/cmdline").read_bytes()):
                    os.kill(pid, signal.SIGKILL)


class RunningSystem:
    """A system somebody else started (``mqstore bench --gateway ADDR``, with ``make run`` going): only
    its gateway is known, so the CPU columns count the clients alone and the flush mode is its own."""

    def __init__(self, gateway: str) -> None:
        self.gateway = gateway
        self.children: dict[str, int] = {}
        self.gateway_workers: dict[int, int] = {}

    @property
    def pids(self) -> list[int]:
        return []


@contextlib.contextmanager
def attached_system(gateway: str) -> Iterator[RunningSystem]:
    """The running system at ``gateway``, once its health check answers SERVING; left running."""
    with grpc.insecure_channel(gateway) as channel:
        try:
            status = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=SERVICE), timeout=10, wait_for_ready=True).status
        except grpc.RpcError as exc:
            raise SystemExit(f"mqstore bench: no gateway answers at {gateway} ({exc.code().name}): "
                             "start one with `make run`, or leave --gateway out") from None
    if status != health_pb2.HealthCheckResponse.SERVING:
        raise SystemExit(f"mqstore bench: the gateway at {gateway} is not SERVING")
    yield RunningSystem(gateway)


@contextlib.contextmanager
def running_system(settings: dict[str, str], keep_store: bool, pids_file: str | None = None,
                   gateway_workers: int = 1) -> Iterator[System]:
    """A fresh store and a whole system on it; stopped (and its exit code checked) afterwards.
    ``pids_file``: the processes' PIDs as JSON while the system runs, for an external profiler
    (``py-spy record --pid``, ``perf``) to attach to this system and not to somebody else's."""
    with scratch_dir("gateway-", keep_store) as scratch:
        system = System(scratch, settings, gateway_workers)
        try:
            system.wait_up()
            if pids_file:
                Path(pids_file).write_text(json.dumps({"runner": system.proc.pid, **system.children}) + "\n")
            yield system
        except BaseException:
            code = system.stop()
            progress(f"mqstore up stopped with exit code {code}; log tail:\n{system.log_tail()}")
            raise
        finally:
            if pids_file:
                Path(pids_file).unlink(missing_ok=True)
        code = system.stop()
        if code != 0:
            raise RuntimeError(f"mqstore up exited with {code} after SIGTERM:\n{system.log_tail()}")
        progress(f"mqstore up stopped cleanly in {system.stop_seconds:.1f} s")


def settle(system: System | RunningSystem, max_wait_s: float, limit_cores: float = 0.1) -> float:
    """Wait (up to ``max_wait_s``) until the system's processes are idle; returns the seconds waited.
    The first put makes the commitlog prefault its 1 GiB file and a finished rep leaves the indexer
    dispatching: neither should be measured as part of the next rep."""
    started = time.monotonic()
    while system.pids and time.monotonic() - started < max_wait_s:
        meter = CpuMeter(system.pids, include_self=False)
        time.sleep(0.5)
        if meter.stop()["cpuOurs"] < limit_cores:
            break
    return time.monotonic() - started


def warm_up(system: System | RunningSystem, topic: str) -> None:
    """One untimed batch: the commitlog starts its first file (and prefaults it), routes are cached.
    Returns once the indexer has dispatched it, so that the first case's count starts after it."""
    workload = Workload.fresh(64)
    spec = ClientSpec(system.gateway, "batch", 1, 0, topic=topic)
    before = sum(queue_depths(system.gateway, topic))  # the callers create the topic first
    with grpc.insecure_channel(system.gateway, options=CHANNEL_OPTIONS) as channel:
        _stub(channel).SendBatch(gateway_pb2.SendBatchRequest(
            messages=[_message(spec, workload, i) for i in range(64)]), timeout=60)
    wait_dispatched(system.gateway, topic, before + 64, before + 64)


def _stub(channel: grpc.Channel) -> gateway_pb2_grpc.MessagingServiceStub:
    return gateway_pb2_grpc.MessagingServiceStub(channel)


def create_topic(target: str, topic: str) -> None:
    """Before the clock starts: a first send would otherwise create it (and write its config) on the way."""
    with grpc.insecure_channel(target) as channel:
        _stub(channel).CreateTopic(commitlog_pb2.TopicRequest(topic=common_pb2.TopicConfig(
            topic=topic, read_queue_nums=QUEUES, write_queue_nums=QUEUES, perm=6)), timeout=30)


def queue_depths(target: str, topic: str) -> list[int]:
    """The max offset of each queue of ``topic``, as consumers see it (dispatched by the indexer)."""
    with grpc.insecure_channel(target) as channel:
        stub = _stub(channel)
        return [stub.GetQueueOffsets(query_pb2.GetQueueOffsetRangeRequest(topic=topic, queue_id=q),
                                     timeout=10).max_offset for q in range(QUEUES)]


def wait_dispatched(target: str, topic: str, low: int, high: int, timeout_s: float = 120.0) -> float:
    """Wait until the topic's queues hold between ``low`` and ``high`` messages in all; returns the
    monotonic time it happened. Fails when they do not: lost (or extra) messages."""
    deadline = time.monotonic() + timeout_s
    with grpc.insecure_channel(target) as channel:
        stub = _stub(channel)
        while True:
            total = sum(stub.GetQueueOffsets(query_pb2.GetQueueOffsetRangeRequest(topic=topic, queue_id=q),
                                             timeout=10).max_offset for q in range(QUEUES))
            if low <= total <= high:
                return time.monotonic()
            if total > high or time.monotonic() > deadline:
                raise RuntimeError(f"{topic} holds {total:,} messages; expected {low:,}..{high:,} "
                                   f"(waited {timeout_s:.0f}s for the indexer)")
            time.sleep(0.02)


# -- the clients --------------------------------------------------------------------------------------
def _pull_header_class() -> type[ProtoMessage]:
    """PullMessageResponse without its messages (field 2 is skipped by the C parser): enough to count
    what a pull returned from its next offset, without building 1024 Python objects per answer."""
    fdp = descriptor_pb2.FileDescriptorProto(name="bench/pull_header.proto", package="bench", syntax="proto3")
    msg = fdp.message_type.add(name="PullHeader")
    for name, number in (("status", 1), ("next_begin_offset", 3), ("min_offset", 4), ("max_offset", 5)):
        msg.field.add(name=name, number=number, type=descriptor_pb2.FieldDescriptorProto.TYPE_INT64,
                      label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(fdp.SerializeToString())
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("bench.PullHeader"))


PullHeader = _pull_header_class()


@dataclass(frozen=True)
class ClientSpec:
    """What one client process does (picklable: it crosses to spawned processes)."""

    target: str
    mode: str  # batch | blob | stream | bstream | unary | pull-raw | pull-parsed | pull-records
    concurrency: int  # coroutines: calls (or streams) in flight
    duration_s: float
    batch: int = 1
    window: int = 1
    pool: int = 4096
    proc: int = 0
    procs: int = 1
    topic: str = TOPIC
    pull_max: int = 1024
    queue_depth: int = 0  # pull: messages in each queue


def _message(spec: ClientSpec, workload: Workload, i: int) -> common_pb2.Message:
    return common_pb2.Message(topic=spec.topic, body=workload.body(i),
                              properties={"UNIQ_KEY": workload.uniq_key(i), "CLUSTER": CLUSTER},
                              born_timestamp=workload.born_timestamp, born_host=BORN_HOST)


def _blob_request(spec: ClientSpec, workload: Workload, start: int) -> bytes:
    entries = [encode_entry(workload.body(i), 0, properties_bytes({"UNIQ_KEY": workload.uniq_key(i),
                                                                   "CLUSTER": CLUSTER}))
               for i in range(start, start + spec.batch)]
    request = gateway_pb2.SendBatchRequest(topic=spec.topic, encoded_messages=b"".join(entries),
                                           born_timestamp=workload.born_timestamp, born_host=BORN_HOST)
    data: bytes = request.SerializeToString()
    return data


def build_requests(spec: ClientSpec) -> list[bytes]:
    """Serialised SendBatchRequests of ``batch`` messages (objects or a blob), or SendRequests (unary and
    stream alike)."""
    if spec.mode.startswith("pull"):
        return []
    workload = Workload.fresh(min(spec.pool, 8192))
    first = spec.proc * spec.pool
    if spec.mode in ("blob", "bstream"):
        return [_blob_request(spec, workload, s) for s in range(first, first + max(spec.pool, spec.batch), spec.batch)]
    if spec.mode == "batch":
        return [gateway_pb2.SendBatchRequest(messages=[_message(spec, workload, i) for i in range(s, s + spec.batch)])
                .SerializeToString() for s in range(first, first + max(spec.pool, spec.batch), spec.batch)]
    return [gateway_pb2.SendRequest(message=_message(spec, workload, i)).SerializeToString()
            for i in range(first, first + spec.pool)]


class _Worker:
    """One coroutine's calls: counts, latencies (ns per call, or per message for a stream)."""

    def __init__(self, spec: ClientSpec, channel: grpc.aio.Channel, requests: list[bytes], index: int) -> None:
        self.spec = spec
        self.channel = channel
        self.requests = requests
        self.index = index
        self.offset = index * len(requests) // max(spec.concurrency, 1)  # coroutines start apart
        self.latencies: array[int] = array("q")
        self.acked = self.stored_not_ok = self.rejected = self.unknown = 0
        self.wire = self.empty = 0
        self.errors: list[str] = []

    def _status(self, status: int, count: int = 1) -> None:
        if status == PUT_OK:
            self.acked += count
        elif status in STORED_NOT_OK:
            self.stored_not_ok += count
        else:
            self.rejected += count

    def _error(self, exc: grpc.aio.AioRpcError, messages: int) -> None:
        # Nothing known about these messages: counted as possibly stored when checking the queues.
        self.unknown += messages
        if len(self.errors) < 3:
            self.errors.append(f"{exc.code().name}: {exc.details()}")

    async def run(self, deadline_ns: int) -> None:
        mode = self.spec.mode
        if mode in ("batch", "blob"):
            await self._batch(deadline_ns)
        elif mode == "bstream":
            await self._batch_stream(deadline_ns)
        elif mode == "unary":
            await self._unary(deadline_ns)
        elif mode == "stream":
            await self._stream(deadline_ns)
        else:
            await self._pull(deadline_ns, mode)

    async def _batch(self, deadline_ns: int) -> None:
        call = self.channel.unary_unary(SEND_BATCH, request_serializer=None, response_deserializer=None)
        parse = gateway_pb2.SendBatchResponse.FromString
        requests, n, k, batch = self.requests, len(self.requests), self.offset, self.spec.batch
        clock, now, append = time.perf_counter_ns, time.monotonic_ns, self.latencies.append
        while now() < deadline_ns:
            request = requests[k % n]
            k += 1
            t0 = clock()
            try:
                raw = await call(request, timeout=60)
            except grpc.aio.AioRpcError as exc:
                self._error(exc, batch)
                continue
            append(clock() - t0)
            self.wire += len(request)
            self._batch_answer(parse(raw), batch)

    def _batch_answer(self, response: Any, batch: int) -> None:
        """A SendBatchResponse: one receipt (a blob stored alike) or a result per message."""
        if response.HasField("receipt"):
            stored = len(response.receipt.commitlog_offsets)
            self._status(response.receipt.status, stored)
            self.rejected += batch - stored
            return
        statuses = [r.status for r in response.results]
        ok = statuses.count(PUT_OK)
        self.acked += ok
        if ok != len(statuses) or len(statuses) != batch:
            for status in statuses:
                if status != PUT_OK:
                    self._status(status)
            self.rejected += batch - len(statuses)

    async def _unary(self, deadline_ns: int) -> None:
        call = self.channel.unary_unary(SEND, request_serializer=None, response_deserializer=None)
        parse = gateway_pb2.SendResult.FromString
        requests, n, k = self.requests, len(self.requests), self.offset
        clock, now, append = time.perf_counter_ns, time.monotonic_ns, self.latencies.append
        while now() < deadline_ns:
            request = requests[k % n]
            k += 1
            t0 = clock()
            try:
                raw = await call(request, timeout=60)
            except grpc.aio.AioRpcError as exc:
                self._error(exc, 1)
                continue
            append(clock() - t0)
            self.wire += len(request)
            if raw.startswith(PUT_OK_PREFIX):
                self.acked += 1
            else:
                self._status(parse(raw).status)

    async def _write_stream(self, call: Any, window: asyncio.Semaphore, sent: deque[int], deadline_ns: int) -> None:
        """A stream's writer: the pre-serialised requests in turn, each once the window has room, its
        send time noted in ``sent``; the writing side is closed at the deadline."""
        requests, n, k = self.requests, len(self.requests), self.offset
        clock, now = time.perf_counter_ns, time.monotonic_ns
        try:
            while True:
                await window.acquire()
                if now() >= deadline_ns:
                    break
                request = requests[k % n]
                k += 1
                sent.append(clock())
                await call.write(request)
                self.wire += len(request)
        finally:
            with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
                await call.done_writing()

    async def _stream(self, deadline_ns: int) -> None:
        # No request iterator: this coroutine writes (call.write), so the window is ours to keep.
        call = self.channel.stream_stream(SEND_STREAM, request_serializer=None, response_deserializer=None)(
            None, timeout=self.spec.duration_s + 120)
        window = asyncio.Semaphore(self.spec.window)
        sent: deque[int] = deque()
        clock = time.perf_counter_ns

        writer = asyncio.create_task(self._write_stream(call, window, sent, deadline_ns))
        append, popleft, release = self.latencies.append, sent.popleft, window.release
        parse = gateway_pb2.SendResult.FromString
        try:
            while True:
                raw = await call.read()
                if not isinstance(raw, bytes):  # grpc.aio.EOF: the gateway ended the stream
                    break
                append(clock() - popleft())
                release()
                if raw.startswith(PUT_OK_PREFIX):
                    self.acked += 1
                else:
                    self._status(parse(raw).status)
        except grpc.aio.AioRpcError as exc:
            self._error(exc, len(sent))
            sent.clear()
        writer.cancel()
        with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
            await writer

    async def _batch_stream(self, deadline_ns: int) -> None:
        """SendBatchStream: ``window`` batches unacknowledged; latency per batch, send to answer."""
        call = self.channel.stream_stream(SEND_BATCH_STREAM, request_serializer=None, response_deserializer=None)(
            None, timeout=self.spec.duration_s + 120)
        window = asyncio.Semaphore(self.spec.window)
        sent: deque[int] = deque()
        batch, clock = self.spec.batch, time.perf_counter_ns

        writer = asyncio.create_task(self._write_stream(call, window, sent, deadline_ns))
        parse = gateway_pb2.SendBatchResponse.FromString
        try:
            while True:
                raw = await call.read()
                if not isinstance(raw, bytes):
                    break
                self.latencies.append(clock() - sent.popleft())
                window.release()
                self._batch_answer(parse(raw), batch)
        except grpc.aio.AioRpcError as exc:
            self._error(exc, len(sent) * batch)
            sent.clear()
        finally:
            writer.cancel()
            with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                await writer

    async def _pull(self, deadline_ns: int, mode: str) -> None:
        spec = self.spec
        call = self.channel.unary_unary(PULL, request_serializer=None, response_deserializer=None)
        consumer = spec.proc * spec.concurrency + self.index
        queue_id = consumer % QUEUES
        depth = spec.queue_depth
        offset = random.Random(consumer).randrange(depth) if depth else 0
        max_bytes = min(32 * MIB, max(4 * MIB, spec.pull_max * RECORD_SIZE * 2))
        header, full = PullHeader.FromString, query_pb2.PullMessageResponse.FromString
        parsed, records = mode == "pull-parsed", mode == "pull-records"
        clock, now, append = time.perf_counter_ns, time.monotonic_ns, self.latencies.append
        calls = 0
        while now() < deadline_ns:
            request = query_pb2.PullMessageRequest(topic=spec.topic, queue_id=queue_id, queue_offset=offset,
                                                   max_messages=spec.pull_max, max_bytes=max_bytes,
                                                   raw_records=records).SerializeToString()
            t0 = clock()
            try:
                raw = await call(request, timeout=60)
            except grpc.aio.AioRpcError as exc:
                self._error(exc, 0)
                continue
            append(clock() - t0)
            calls += 1
            if records:
                response = full(raw)
                messages = decode_records(response.records, queue_id)
                status, next_offset = response.status, response.next_begin_offset
                got = len(messages)
                if status == FOUND and (got != next_offset - offset
                                        or sum(len(m.body) for m in messages) != got * BODY_SIZE):
                    raise RuntimeError(f"queue {queue_id} at {offset}: {got} records, next offset {next_offset}")
            elif parsed:
                response = full(raw)
                got = body = 0
                for message in response.messages:
                    body += len(message.body)
                    got += 1
                status, next_offset = response.status, response.next_begin_offset
                if status == FOUND and (got != next_offset - offset or body != got * BODY_SIZE):
                    raise RuntimeError(f"queue {queue_id} at {offset}: {got} messages, {body} body bytes, "
                                       f"next offset {next_offset}")
            else:
                head: Any = header(raw)
                status, next_offset = head.status, head.next_begin_offset
                got = next_offset - offset
                if calls % CHECK_EVERY == 1 and status == FOUND:
                    response = full(raw)
                    if len(response.messages) != got or any(len(m.body) != BODY_SIZE for m in response.messages):
                        raise RuntimeError(f"queue {queue_id} at {offset}: {len(response.messages)} messages but "
                                           f"the next offset says {got}")
            if status != FOUND or got <= 0:
                self.empty += 1
                offset = 0
                continue
            self.acked += got
            self.wire += len(raw)
            offset = next_offset if next_offset < depth else 0


async def _client(spec: ClientSpec, ready: Any) -> dict[str, Any]:
    requests = build_requests(spec)
    async with grpc.aio.insecure_channel(spec.target, options=CHANNEL_OPTIONS) as channel:
        await asyncio.wait_for(channel.channel_ready(), 60)
        warm = 0
        if requests:  # one untimed call: connected, and the gateway has the route
            if spec.mode in ("batch", "blob", "bstream"):
                await channel.unary_unary(SEND_BATCH, None, None)(requests[-1], timeout=60)
                warm = spec.batch
            else:
                await channel.unary_unary(SEND, None, None)(requests[-1], timeout=60)
                warm = 1
        else:
            await channel.unary_unary(PULL, None, None)(query_pb2.PullMessageRequest(
                topic=spec.topic, queue_id=0, queue_offset=0, max_messages=1).SerializeToString(), timeout=60)
        workers = [_Worker(spec, channel, requests, i) for i in range(spec.concurrency)]
        await asyncio.get_running_loop().run_in_executor(None, ready.wait, 300)
        started = time.monotonic_ns()
        await asyncio.gather(*(w.run(started + int(spec.duration_s * 1e9)) for w in workers))
        ended = time.monotonic_ns()
    return {
        "acked": sum(w.acked for w in workers), "storedNotOk": sum(w.stored_not_ok for w in workers),
        "rejected": sum(w.rejected for w in workers), "unknown": sum(w.unknown for w in workers),
        "wire": sum(w.wire for w in workers), "empty": sum(w.empty for w in workers), "warm": warm,
        "started": started, "ended": ended, "errors": [e for w in workers for e in w.errors],
        "latencies": b"".join(w.latencies.tobytes() for w in workers),
    }


def client_main(spec: ClientSpec, ready: Any, results: Any) -> None:
    """One client process: report through ``results``; on failure break the barrier so nobody waits."""
    try:
        report = asyncio.run(_client(spec, ready))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        with contextlib.suppress(Exception):
            ready.abort()
        report = {"fatal": f"client {spec.proc}: {exc!r}"}
    results.put(report)


def run_clients(spec: ClientSpec, procs: int, system: System | RunningSystem, desc: str,
                quiet: bool) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """``procs`` client processes started together (a barrier); CPU measured while they run."""
    def meters(client_pids: list[int]) -> dict[str, CpuMeter]:
        services = {f"cpu{name.capitalize()}": CpuMeter([pid, *(system.gateway_workers.values()
                                                               if name == "gateway" else ())], include_self=False)
                    for name, pid in system.children.items()}
        return {"all": CpuMeter([*system.pids, *client_pids]),
                "cpuServer": CpuMeter(system.pids, include_self=False), **services}

    with Progress(total=math.ceil(spec.duration_s), desc=desc, unit="s", quiet=quiet,
                  bar_format="{desc}: {bar} {n_fmt}/{total_fmt} s") as bar:
        def tick(elapsed: float) -> None:
            bar.update(max(0, min(bar.total or 0, int(elapsed)) - bar.count))

        reports, figures = run_client_processes(client_main, [replace(spec, proc=p, procs=procs)
                                                               for p in range(procs)],
                                                "bench-client", spec.duration_s, meters, tick=tick)
    cpu = {**figures.pop("all"), **{key: meter["cpuOurs"] for key, meter in figures.items()}}
    return reports, cpu


# -- cases and reps ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    name: str  # the table row
    kind: str  # batch | stream | sync | send | pull: one system per kind
    mode: str  # the clients' mode
    procs: int
    concurrency: int  # per process
    batch: int = 1
    window: int = 1

    @property
    def flush(self) -> str:
        return "SYNC_FLUSH" if self.kind == "sync" else "ASYNC_FLUSH"


def build_cases(args: argparse.Namespace) -> list[Case]:
    kinds = [k.strip() for k in args.cases.split(",") if k.strip()]
    cases: list[Case] = []
    for kind in kinds:
        if kind == "batch":
            cases += [Case(f"batch{b} {args.procs}x{args.inflight}", kind, "batch", args.procs, args.inflight, b)
                      for b in args.batch]
            cases += [Case(f"blob{b} {args.procs}x{args.inflight}", kind, "blob", args.procs, args.inflight, b)
                      for b in args.batch]
        elif kind == "stream":
            cases.append(Case(f"stream w{args.window} {args.procs}x{args.streams}", kind, "stream", args.procs,
                              args.streams, window=args.window))
            biggest = max(args.batch)
            cases.append(Case(f"bstream{biggest} w{args.batch_window} {args.procs}x{args.streams}", kind, "bstream",
                              args.procs, args.streams, biggest, args.batch_window))
        elif kind == "sync":
            per = max(1, args.sync_producers // args.sync_procs)
            cases.append(Case(f"sync send {args.sync_procs}x{per}", kind, "unary", args.sync_procs, per))
            if args.sync_batch:
                # The same producers batching: what SYNC_FLUSH costs when each fdatasync covers many messages.
                cases.append(Case(f"sync batch{args.sync_batch} {args.sync_procs}x{per}", kind, "batch",
                                  args.sync_procs, per, args.sync_batch))
                cases.append(Case(f"sync blob{args.sync_batch} {args.sync_procs}x{per}", kind, "blob",
                                  args.sync_procs, per, args.sync_batch))
        elif kind == "send":
            cases.append(Case("send 1x1", kind, "unary", 1, 1))
        else:
            cases += [Case(f"pull {how} {args.pull_procs}x{args.pull_inflight}", kind, f"pull-{how}",
                           args.pull_procs, args.pull_inflight, args.pull_max) for how in ("raw", "parsed", "records")]
    return cases


def _rep_prelude(args: argparse.Namespace, system: System | RunningSystem) -> float:
    if args.drop_caches and not drop_caches():
        progress("warning: could not drop caches (not root?)")
    waited = settle(system, args.settle)
    if waited >= args.settle:
        progress(f"warning: the system was still busy after {waited:.0f} s")
    elif waited > 1:
        progress(f"(the system went idle after {waited:.1f} s)")
    if args.wait_quiet > 0:
        wait_quiet(args.wait_quiet)
    return round(os.getloadavg()[0], 2)


def run_rep(case: Case, rep: int, args: argparse.Namespace, system: System | RunningSystem, topic: str,
            queue_depth: int = 0) -> RepResult:
    load = _rep_prelude(args, system)
    produce = not case.mode.startswith("pull")
    before = sum(queue_depths(system.gateway, topic)) if produce else 0
    spec = ClientSpec(system.gateway, case.mode, case.concurrency, args.duration, case.batch, case.window,
                      args.request_pool, topic=topic, pull_max=args.pull_max, queue_depth=queue_depth)
    service_pid = system.children.get(args.profile_service)
    spy = None if service_pid is None else profiler(args.profile, service_pid, f"{case.name}-{rep}")
    try:
        reports, cpu = run_clients(spec, case.procs, system, f"{case.name} rep {rep}", args.quiet)
    finally:
        if spy is not None:
            spy.stop()
    errors = [e for r in reports for e in r["errors"]]
    if errors:
        progress(f"warning: {case.name} rep {rep}: RPC errors, first: {errors[0]}")
    acked = sum(r["acked"] for r in reports)
    stored_not_ok = sum(r["storedNotOk"] for r in reports)
    failed = stored_not_ok + sum(r["rejected"] + r["unknown"] for r in reports)
    first, last = min(r["started"] for r in reports), max(r["ended"] for r in reports)
    extra: dict[str, Any] = {"clients": f"{case.procs}x{case.concurrency}", "load1": load, **cpu,
                             "wireMBPerSec": round(sum(r["wire"] for r in reports) / MB / ((last - first) / 1e9), 2)}
    if produce:
        low = before + acked + stored_not_ok + sum(r["warm"] for r in reports)
        high = low + sum(r["unknown"] for r in reports)
        dispatched = wait_dispatched(system.gateway, topic, low, high)
        extra["catchUpSec"] = round(max(0.0, dispatched - last / 1e9), 3)
    else:
        extra["emptyPulls"] = sum(r["empty"] for r in reports)
    latencies: array[int] = array("q")
    for r in reports:
        latencies.frombytes(r["latencies"])
    result = RepResult(case.name, rep, acked, (last - first) / 1e9, acked * RECORD_SIZE, acked * BODY_SIZE, latencies,
                       case.batch if case.mode == "batch" or case.mode.startswith("pull") else 1, failed, extra)
    result.extra["callP999Us"] = round(percentile(sorted(latencies), 99.9) / 1000, 1)
    return result


def preload(system: System | RunningSystem, count: int, quiet: bool) -> int:
    """``count`` messages (rounded down to whole queues) into PULL_TOPIC with SendBatch of 1024, an equal
    share per queue, a few calls in flight; then wait until the indexer has dispatched them. Returns
    the messages per queue."""
    create_topic(system.gateway, PULL_TOPIC)
    per_queue = max(1, count // QUEUES)
    spec = ClientSpec(system.gateway, "batch", 1, 0, topic=PULL_TOPIC)
    workload = Workload.fresh(8192)
    started = time.monotonic()
    with grpc.insecure_channel(system.gateway, options=CHANNEL_OPTIONS) as channel, \
            Progress(total=per_queue * QUEUES, desc="preload", unit="msg", quiet=quiet) as bar:
        call = channel.unary_unary(SEND_BATCH, request_serializer=None, response_deserializer=None)
        in_flight: deque[tuple[Any, int]] = deque()
        index = 0
        for start in range(0, per_queue, PRELOAD_BATCH):
            size = min(PRELOAD_BATCH, per_queue - start)
            for queue_id in range(QUEUES):
                request = gateway_pb2.SendBatchRequest(
                    messages=[_message(spec, workload, i) for i in range(index, index + size)], queue_id=queue_id)
                index += size
                in_flight.append((call.future(request.SerializeToString(), timeout=120), size))
                while len(in_flight) >= 4:
                    _preload_done(*in_flight.popleft(), bar)
        while in_flight:
            _preload_done(*in_flight.popleft(), bar)
    sent = time.monotonic()
    wait_dispatched(system.gateway, PULL_TOPIC, per_queue * QUEUES, per_queue * QUEUES)
    print(f"preload: {per_queue * QUEUES:,} msgs in {sent - started:.1f} s "
          f"({per_queue * QUEUES / (sent - started):,.0f} msgs/s, SendBatch {PRELOAD_BATCH}, 4 in flight, "
          f"one client thread), dispatched {time.monotonic() - sent:.1f} s later", flush=True)
    return per_queue


def _preload_done(future: Any, size: int, bar: Progress) -> None:
    results = gateway_pb2.SendBatchResponse.FromString(future.result()).results
    if len(results) != size or any(r.status != PUT_OK for r in results):
        raise RuntimeError(f"preload: a batch of {size} came back with {[r.status for r in results][:5]}...")
    bar.update(size)


# -- output --------------------------------------------------------------------------------------------
EXTRA_COLUMNS: list[Column] = [
    ("call p999 µs", lambda r: r.extra.get("callP999Us"), "{:,.1f}"),
    ("wire MB/s", lambda r: r.extra.get("wireMBPerSec"), "{:.1f}"),
    ("cpu srv", lambda r: r.extra.get("cpuServer"), "{:.2f}"),
    ("cpu gw", lambda r: r.extra.get("cpuGateway"), "{:.2f}"),
    ("cpu cl", lambda r: r.extra.get("cpuCommitlog"), "{:.2f}"),
    ("cpu ix", lambda r: r.extra.get("cpuIndexer"), "{:.2f}"),
    ("cpu q", lambda r: r.extra.get("cpuQuery"), "{:.2f}"),
    ("failed", lambda r: r.failed, "{:,}"),
    ("catch-up s", lambda r: r.extra.get("catchUpSec"), "{:.2f}"),
    ("load", lambda r: r.extra.get("load1"), "{:.2f}"),
]


def _median(reps: Sequence[RepResult], attr: str) -> float:
    value = median_of(reps, lambda r: getattr(r, attr))
    return float(value) if value is not None else float("nan")


def print_targets(results: Sequence[RepResult]) -> None:
    """The issue's targets against the medians: met or not, as measured."""
    cases = group_by_case(results)

    def rate(name: str) -> float:
        return _median(cases[name], "msgs_per_s")

    def verdict(value: float, target: float) -> str:
        return "**met**" if value >= target else f"**not met** ({value / target:.0%})"

    rows: list[tuple[str, str, str]] = []
    produce = [n for n in cases if n.startswith(("batch", "blob", "stream", "bstream"))]
    if produce:
        best = max(produce, key=rate)
        rows.append((f"produce, batching/streaming, ASYNC_FLUSH ≥ {PRODUCE_TARGET:,} msgs/s ({REFERENCES})",
                     "; ".join(f"{n}: {rate(n):,.0f}" for n in produce), verdict(rate(best), PRODUCE_TARGET)))
    for name in (n for n in cases if n.startswith("sync")):
        rows.append((f"SYNC_FLUSH, 64 concurrent producers ≥ {SYNC_TARGET:,} msgs/s",
                     f"{name}: {rate(name):,.0f}", verdict(rate(name), SYNC_TARGET)))
    for name in (n for n in cases if n.startswith("send")):
        reps = cases[name]
        p999 = median_of(reps, lambda r: r.extra.get("callP999Us"))
        rows.append(("single-message Send p50 / p99 (report)",
                     f"{_median(reps, 'call_p50_us'):,.0f} / {_median(reps, 'call_p99_us'):,.0f} µs "
                     f"(p999 {p999:,.0f} µs; {rate(name):,.0f} msgs/s one at a time)", "reported"))
    for name in (n for n in cases if n.startswith("pull")):
        rows.append((f"pull ≥ {PULL_TARGET:,} msgs/s", f"{name}: {rate(name):,.0f}", verdict(rate(name), PULL_TARGET)))
    if not rows:
        return
    print("\n### Targets (issue 5), medians\n")
    print("| target | measured | met? |")
    print("|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    sys.stdout.flush()


# -- main ------------------------------------------------------------------------------------------------
def _positive_list(text: str) -> list[int]:
    values = [int(v) for v in text.split(",") if v.strip()]
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give positive integers, comma separated")
    return values


def build_parser(prog: str = "python -m bench.gateway") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default=",".join(ALL_KINDS), help=f"comma list of {', '.join(ALL_KINDS)}")
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per rep (default 3)")
    parser.add_argument("--batch", type=_positive_list, default=[64, 256],
                        help="messages per SendBatch, a comma list: one row each (default 64,256; at most 1024)")
    parser.add_argument("--procs", type=int, default=2, help="client processes of batch and stream (default 2)")
    parser.add_argument("--inflight", type=int, default=4, help="SendBatch calls in flight per process (default 4)")
    parser.add_argument("--sync-batch", type=int, default=64,
                        help="also run the sync producers with SendBatch of this many (default 64; 0: no)")
    parser.add_argument("--streams", type=int, default=1, help="SendStreams per process (default 1)")
    parser.add_argument("--window", type=int, default=512, help="unacknowledged messages per stream (default 512)")
    parser.add_argument("--batch-window", type=int, default=8,
                        help="unacknowledged batches per SendBatchStream (default 8)")
    parser.add_argument("--sync-producers", type=int, default=64, help="producers of the sync case (default 64)")
    parser.add_argument("--sync-procs", type=int, default=2, help="processes they are spread over (default 2)")
    parser.add_argument("--preload", type=int, default=200_000, help="messages to pull from (default 200,000)")
    parser.add_argument("--pull-max", type=int, default=1024, help="max_messages per Pull (default 1024, the most)")
    parser.add_argument("--pull-procs", type=int, default=2, help="consumer processes (default 2)")
    parser.add_argument("--pull-inflight", type=int, default=4, help="pulls in flight per process (default 4)")
    parser.add_argument("--request-pool", type=int, default=16_384,
                        help="distinct pre-serialised messages per client process (default 16,384)")
    parser.add_argument("--profile-service", choices=("gateway", "commitlog", "indexer", "query"), default="gateway",
                        help="the service --profile samples (default gateway)")
    parser.add_argument("--tiny", "--smoke", action="store_true",
                        help="every case tiny (few clients, small preload, no waiting): checks the harness only")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    parser.add_argument("--pids-file", metavar="PATH",
                        help="while a system runs, its PIDs as JSON (runner, gateway, commitlog, indexer, query)")
    parser.add_argument("--gateway-workers", type=int, default=1, metavar="N",
                        help="mqstore up --gateway-workers N: gateway processes on its port (default 1)")
    parser.add_argument("--gateway", metavar="ADDR", default=None,
                        help="benchmark the system already running there (with `make run` going: 127.0.0.1:9876) "
                             "instead of starting one per case kind; its flush mode applies to every case, its "
                             "processes' CPU is not measured, and the benchmark's topics stay in its store")
    parser.add_argument("--settle", type=float, default=60.0, metavar="SECONDS",
                        help="before each rep wait up to this long for the system to go idle (default 60)")
    add_common_args(parser)
    parser.set_defaults(wait_quiet=5.0)
    return parser


def apply_tiny(args: argparse.Namespace) -> None:
    args.duration = min(args.duration, 1.0)
    args.batch = args.batch[:1]
    args.procs = args.inflight = args.streams = args.sync_procs = args.pull_procs = 1
    args.window = min(args.window, 64)
    args.sync_producers = min(args.sync_producers, 4)
    args.preload = min(args.preload, 8 * 512)
    args.pull_max = min(args.pull_max, 256)
    args.pull_inflight = min(args.pull_inflight, 2)
    args.request_pool = min(args.request_pool, 512)
    args.wait_quiet = 0.0
    args.settle = min(args.settle, 2.0)


def main(argv: Sequence[str] | None = None, prog: str = "python -m bench.gateway") -> int:
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    args.settings = parse_settings(parser, args.set)
    if args.tiny:
        apply_tiny(args)
    if unknown := sorted({k.strip() for k in args.cases.split(",") if k.strip()} - set(ALL_KINDS)):
        parser.error(f"unknown cases {unknown}: use {', '.join(ALL_KINDS)}")
    if max(args.batch) > 1024 or args.pull_max > 1024:
        parser.error("--batch and --pull-max are at most 1024 (the gateway's limits)")
    cases = build_cases(args)
    print_machine(f", server: the running system at {args.gateway}" if args.gateway else
                  f", server: {mqstore_command()} up (gateway + commitlog + indexer + query)")
    print(f"load average before the run: {' '.join(f'{v:.2f}' for v in os.getloadavg())}; "
          f"{args.reps} reps of {args.duration:g} s per case; record {RECORD_SIZE} B, body {BODY_SIZE} B", flush=True)
    results: list[RepResult] = []
    kinds = list(dict.fromkeys(c.kind for c in cases))
    for kind in kinds:
        kind_cases = [c for c in cases if c.kind == kind]
        settings = {**args.settings, "MQSTORE_FLUSH_DISK_TYPE": kind_cases[0].flush}
        if args.gateway:
            progress(f"{kind}: on the system at {args.gateway} (its own flush mode) ...")
        else:
            progress(f"{kind}: starting mqstore up ({kind_cases[0].flush}) ...")
        system: System | RunningSystem
        with (attached_system(args.gateway) if args.gateway else
              running_system(settings, args.keep_store, args.pids_file, args.gateway_workers)) as system:
            depth = 0
            topic = PULL_TOPIC if kind == "pull" else TOPIC
            if kind == "pull":
                depth = preload(system, args.preload, args.quiet)
            else:
                create_topic(system.gateway, TOPIC)
                warm_up(system, TOPIC)
            kind_results: list[RepResult] = []
            for case in kind_cases:
                for rep in range(1, args.reps + 1):
                    r = run_rep(case, rep, args, system, topic, depth)
                    progress(f"{case.name} rep {rep}: {r.msgs_per_s:,.0f} msgs/s, {r.body_mb_per_s:.1f} MB/s body, "
                             f"call p50 {r.call_p50_us:,.0f} µs p99 {r.call_p99_us:,.0f} µs, cpu srv "
                             f"{r.extra['cpuServer']} gw {r.extra.get('cpuGateway', '-')} ours {r.extra['cpuOurs']} "
                             f"other {r.extra['cpuOther']}")
                    kind_results.append(r)
        flush = "the running system's flush mode" if args.gateway else kind_cases[0].flush
        print_table(f"gateway {kind} ({flush}): every rep", kind_results, EXTRA_COLUMNS)
        results += kind_results
    print("\n### Medians")
    print_summary(results, EXTRA_COLUMNS)
    print_targets(results)
    if args.json:
        emit_json("gateway", results, {k: v for k, v in vars(args).items() if k not in ("json", "set")})
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        raise SystemExit(main())
