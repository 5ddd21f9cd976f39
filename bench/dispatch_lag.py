"""Does the indexer keep up with the writer? Real processes: a commitlog service, an indexer, and
producers sending AppendBatch (64 messages of 1 KiB with 2 KEYS + UNIQ_KEY) at a target rate; the
indexer's dispatch lag (GetDispatchStatus) is sampled every 100 ms.

    python -m bench.dispatch_lag [--rate 100000] [--duration 20] [--producers 2]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import threading
import time

import grpc
from mqstore.v1 import commitlog_pb2, common_pb2, indexer_pb2, indexer_pb2_grpc

from bench.append_grpc import Server, create_topic, store_info
from bench.report import percentile
from bench.services import free_port, mqstore_command
from bench.workload import QUEUES, TOPIC, print_machine, scratch_dir

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=100_000, help="target msgs/s over all producers")
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--producers", type=int, default=2)
    args = parser.parse_args()
    print_machine()
    settings = {"MQSTORE_LOG_LEVEL": "WARNING"}
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
            status = stub.GetDispatchStatus(indexer_pb2.GetDispatchStatusRequest(), timeout=5)
            lag_ms.sort()
            lag_bytes.sort()
            print(f"writer: {sent:,} msgs in {written_s:.1f}s = {sent / written_s:,.0f} msgs/s "
                  f"(target {args.rate:,.0f}); indexer dispatched {status.dispatched_records:,} records")
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
