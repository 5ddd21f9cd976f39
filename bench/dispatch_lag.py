"""Does the indexer keep up with the writer? Real processes: a commitlog service, an indexer, and
producers sending AppendBatch (64 messages of 1 KiB with 2 KEYS + UNIQ_KEY) at a target rate; the
indexer's dispatch lag (GetDispatchStatus) is sampled every 100 ms.

    python -m bench.dispatch_lag [--rate 100000] [--duration 20] [--producers 2] [--source auto|files|tail]

``--gateway``: the highest rate the gateway takes instead (a whole ``mqstore up``; SendBatch of
``--batch`` messages in RocketMQ's batch encoding, ``--procs`` client processes x ``--inflight``
calls, bench/gateway.py's clients), with the same lag sampling, and the indexer's CPU per message.

    python -m bench.dispatch_lag --gateway [--batch 256] [--procs 2] [--inflight 4] [--duration 10]

``--source``: where the indexer reads records (MQSTORE_INDEXER_REPUT_SOURCE): ``files`` (the
commitlog's files, up to the readable end a positions-only Tail announces) or ``tail`` (the
byte-carrying Tail, as before the files were read).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import grpc

from bench.append_grpc import Server, create_topic, store_info
from bench.report import CpuMeter, percentile
from bench.services import free_port, mqstore_command
from bench.workload import QUEUES, TOPIC, print_machine, scratch_dir
from mqstore.v1 import commitlog_pb2, common_pb2, indexer_pb2, indexer_pb2_grpc

BATCH = 64


def batch_requests(count: int, body: bytes) -> list[bytes]:
    """Pre-serialised AppendBatchRequests, so the producers spend their time sending."""
    requests, n = [], 0
    for _ in range(count):
        messages = []
        for _ in range(BATCH):
            messages.append(common_pb2.Message(topic=TOPIC, queue_id=n % QUEUES, body=body, properties={
                "KEYS": f"order-{n} user-{n % 1000}", "UNIQ_KEY": f"{n:032X}", "CLUSTER": "DefaultCluster"}))
            n += 1
        requests.append(commitlog_pb2.AppendBatchRequest(messages=messages).SerializeToString())
    return requests


def produce(target: str, requests: list[bytes], rate: float, stop: threading.Event, sent: list[int]) -> None:
    with grpc.insecure_channel(target) as channel:
        call = channel.unary_unary("/mqstore.v1.CommitLogService/AppendBatch",
                                   request_serializer=lambda b: b, response_deserializer=lambda b: b)
        started, n = time.perf_counter(), 0
        while not stop.is_set():
            call(requests[n % len(requests)], timeout=30)
            n += 1
            sent[0] += BATCH
            ahead = n * BATCH / rate - (time.perf_counter() - started)
            if ahead > 0:
                time.sleep(ahead)


class LagSampler:
    """GetDispatchStatus every 100 ms from a thread: lag in ms and bytes while the writers run."""

    def __init__(self, indexer_target: str) -> None:
        self._channel = grpc.insecure_channel(indexer_target)
        self.stub = indexer_pb2_grpc.IndexerServiceStub(self._channel)
        self.lag_ms: list[float] = []
        self.lag_bytes: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lag-sampler", daemon=True)

    def status(self) -> indexer_pb2.DispatchStatus:
        return self.stub.GetDispatchStatus(indexer_pb2.GetDispatchStatusRequest(), timeout=5)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            status = self.status()
            self.lag_ms.append(status.behind_ms)
            self.lag_bytes.append(status.behind_bytes)

    def catch_up(self, end: int) -> float:
        """Seconds until the reput offset reaches ``end``."""
        caught = time.perf_counter()
        while self.status().reput_offset < end:
            time.sleep(0.02)
        return time.perf_counter() - caught

    def report(self, catch_up_s: float) -> str:
        lag_ms, lag_bytes = sorted(self.lag_ms), sorted(self.lag_bytes)
        return (f"dispatch lag while writing: p50 {percentile(lag_ms, 50):.0f} ms, "
                f"p99 {percentile(lag_ms, 99):.0f} ms, max {lag_ms[-1]:.0f} ms; "
                f"bytes p50 {percentile(lag_bytes, 50) / 1e6:.1f} MB, "
                f"max {lag_bytes[-1] / 1e6:.1f} MB; caught up {catch_up_s * 1000:.0f} ms after the writers stopped")

    def close(self) -> None:
        self._channel.close()


def through_gateway(args: argparse.Namespace) -> None:
    from bench.gateway import ClientSpec, create_topic, run_clients, running_system, settle

    settings = {"MQSTORE_LOG_LEVEL": "WARNING", "MQSTORE_INDEXER_REPUT_SOURCE": args.source}
    with running_system(settings, keep_store=False) as system:
        create_topic(system.gateway, TOPIC)
        spec = ClientSpec(target=system.gateway, mode="blob" if args.blob else "batch", concurrency=args.inflight,
                          duration_s=args.duration, batch=args.batch, topic=TOPIC)
        run_clients(replace(spec, duration_s=1.0), args.procs, system, "warm-up", quiet=True)
        settle(system, 30)
        sampler = LagSampler(f"127.0.0.1:{system.base_port + 2}")
        profiler: subprocess.Popen[bytes] | None = None
        try:
            sampler.start()
            if args.profile:  # py-spy on the indexer while the clients send (folded stacks)
                py_spy = str(Path(sys.executable).parent / "py-spy")
                profiler = subprocess.Popen([py_spy, "record", "--pid", str(system.children["indexer"]), "--duration",
                                             str(int(args.duration)), "--format", "raw", "--nonblocking", "--output",
                                             args.profile], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            reports, cpu = run_clients(spec, args.procs, system, "send", quiet=True)
            sampler.stop()
            if profiler is not None:
                profiler.wait(60)
                print(f"indexer profile: {args.profile} (python -m bench.profile_summary {args.profile})")
            acked = sum(r["acked"] for r in reports)
            seconds = (max(r["ended"] for r in reports) - min(r["started"] for r in reports)) / 1e9
            end = store_info(f"127.0.0.1:{system.base_port + 1}").max_offset
            catch_up_s = sampler.catch_up(end)
            indexer_cores = cpu.get("cpuIndexer", 0.0)
            print(f"gateway ({spec.mode} {args.batch}, {args.procs}x{args.inflight}, source {args.source}): "
                  f"{acked:,} msgs in {seconds:.1f}s = {acked / seconds:,.0f} msgs/s; cores: indexer "
                  f"{indexer_cores:.2f} ({indexer_cores * seconds / max(acked, 1) * 1e6:.1f} us/msg), commitlog "
                  f"{cpu.get('cpuCommitlog', 0.0):.2f}, gateway {cpu.get('cpuGateway', 0.0):.2f}")
            print(sampler.report(catch_up_s))
        finally:
            if profiler is not None and profiler.poll() is None:
                profiler.kill()
                profiler.wait()
            sampler.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=100_000, help="target msgs/s over all producers")
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--producers", type=int, default=2)
    parser.add_argument("--source", choices=("auto", "files", "tail"), default="auto",
                        help="where the indexer reads records (default auto: the files when here)")
    parser.add_argument("--gateway", action="store_true", help="as fast as the gateway takes SendBatch")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--inflight", type=int, default=4)
    parser.add_argument("--blob", action=argparse.BooleanOptionalAction, default=True,
                        help="the batch as one blob in RocketMQ's batch encoding (default) or message objects")
    parser.add_argument("--profile", metavar="FILE", help="--gateway: py-spy folded stacks of the indexer here")
    args = parser.parse_args()
    print_machine()
    if args.gateway:
        through_gateway(args)
        return
    settings = {"MQSTORE_LOG_LEVEL": "WARNING", "MQSTORE_INDEXER_REPUT_SOURCE": args.source}
    with scratch_dir("lag-") as root:
        server = Server(root, settings)
        indexer_target = f"127.0.0.1:{free_port()}"
        log = open(root / "indexer.log", "wb")  # noqa: SIM115 - closed below
        indexer = subprocess.Popen([mqstore_command(), "indexer", "--store", str(root / "indexer"), "--listen",
                                    indexer_target, "--commitlog", server.target],
                                   env={**os.environ, **settings}, stdout=log, stderr=subprocess.STDOUT)
        try:
            server.wait_serving()
            create_topic(server.target)
            requests = batch_requests(64, os.urandom(1024))
            stub = indexer_pb2_grpc.IndexerServiceStub(grpc.insecure_channel(indexer_target))
            stub.GetDispatchStatus(indexer_pb2.GetDispatchStatusRequest(), timeout=30, wait_for_ready=True)
            stop, counters = threading.Event(), [[0] for _ in range(args.producers)]
            threads = [threading.Thread(target=produce, args=(server.target, requests, args.rate / args.producers,
                                                              stop, counters[i])) for i in range(args.producers)]
            lag_ms: list[float] = []
            lag_bytes: list[float] = []
            cpu_indexer, cpu_commitlog = CpuMeter([indexer.pid], include_self=False), \
                CpuMeter([server.proc.pid], include_self=False)
            started = time.perf_counter()
            for t in threads:
                t.start()
            while time.perf_counter() - started < args.duration:
                time.sleep(0.1)
                status = stub.GetDispatchStatus(indexer_pb2.GetDispatchStatusRequest(), timeout=5)
                lag_ms.append(status.behind_ms)
                lag_bytes.append(status.behind_bytes)
            stop.set()
            for t in threads:
                t.join()
            written_s = time.perf_counter() - started
            sent = sum(c[0] for c in counters)
            caught = time.perf_counter()
            end = store_info(server.target).max_offset  # the indexer's own view of the end may be stale
            while stub.GetDispatchStatus(indexer_pb2.GetDispatchStatusRequest(), timeout=5).reput_offset < end:
                time.sleep(0.02)
            catch_up_s = time.perf_counter() - caught
            cores_indexer, cores_commitlog = cpu_indexer.stop(), cpu_commitlog.stop()
            spent_s = time.perf_counter() - started
            status = stub.GetDispatchStatus(indexer_pb2.GetDispatchStatusRequest(), timeout=5)
            lag_ms.sort()
            lag_bytes.sort()
            print(f"writer: {sent:,} msgs in {written_s:.1f}s = {sent / written_s:,.0f} msgs/s "
                  f"(target {args.rate:,.0f}); indexer dispatched {status.dispatched_records:,} records")
            print(f"CPU per message (until caught up): indexer "
                  f"{cores_indexer['cpuOurs'] * spent_s / max(sent, 1) * 1e6:.1f} us, commitlog "
                  f"{cores_commitlog['cpuOurs'] * spent_s / max(sent, 1) * 1e6:.1f} us "
                  f"(other processes on the machine: {cores_indexer['cpuOther']:.2f} cores)")
            print(f"dispatch lag while writing: p50 {percentile(lag_ms, 50):.0f} ms, "
                  f"p99 {percentile(lag_ms, 99):.0f} ms, "
                  f"max {lag_ms[-1]:.0f} ms; bytes p50 {percentile(lag_bytes, 50) / 1e6:.1f} MB, "
                  f"max {lag_bytes[-1] / 1e6:.1f} MB; caught up {catch_up_s * 1000:.0f} ms after the writers stopped")
        finally:
            if indexer.poll() is None:
                indexer.send_signal(signal.SIGTERM)
                indexer.wait(60)
            log.close()
            server.stop()


if __name__ == "__main__":
    main()
