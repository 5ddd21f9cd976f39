"""CommitOffset through the gateway (``mqstore up`` under SYNC_FLUSH), with consumer offset commits
answered at once (syncConsumerOffsetCommit false: the periodic write) and answered once durable (auto):
latency and rate with one commit in flight and with 16.

``python -m tests.powercut.offset_commit_bench`` prints one line per (mode, in flight); the numbers are
in docs/operations.md.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path

from mqstore.v1 import common_pb2, gateway_pb2, query_pb2
from tests.gateway.system_process import UpProcess, running_up

TOPIC = "offset-bench"


def _commits(up: UpProcess, in_flight: int, seconds: float) -> tuple[list[float], float]:
    """Each of ``in_flight`` threads commits its own group's offset over and over; every latency, and the wall time."""
    latencies: list[list[float]] = [[] for _ in range(in_flight)]
    stop = time.monotonic() + seconds

    def committer(n: int) -> None:
        offset = 0
        while time.monotonic() < stop:
            offset = 1 - offset
            started = time.monotonic()
            up.stub.CommitOffset(query_pb2.UpdateConsumerOffsetRequest(
                consumer_group=f"bench-{n}", topic=TOPIC, queue_id=0, offset=offset), timeout=10)
            latencies[n].append(time.monotonic() - started)

    threads = [threading.Thread(target=committer, args=(n,)) for n in range(in_flight)]
    began = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [x for per in latencies for x in per], time.monotonic() - began


def measure(base: Path, sync: str, seconds: float) -> list[str]:
    env = {"MQSTORE_FLUSH_DISK_TYPE": "SYNC_FLUSH", "MQSTORE_SYNC_CONSUMER_OFFSET_COMMIT": sync,
           "MQSTORE_LOG_LEVEL": "WARNING"}
    lines = []
    with running_up(base / f"store-{sync}", env) as up:
        up.stub.SendBatch(gateway_pb2.SendBatchRequest(messages=[common_pb2.Message(topic=TOPIC, body=b"x")],
                                                       queue_id=0), timeout=10)
        request = query_pb2.GetQueueOffsetRangeRequest(topic=TOPIC, queue_id=0)
        while up.stub.GetQueueOffsets(request, timeout=10).max_offset < 1:  # until dispatched: commits need it
            time.sleep(0.05)
        _commits(up, 1, 0.5)  # warm the channels and the offset table
        for in_flight in (1, 16):
            latencies, wall = _commits(up, in_flight, seconds)
            latencies.sort()
            p99 = latencies[int(len(latencies) * 0.99) - 1]
            lines.append(f"syncConsumerOffsetCommit={sync:5} in flight {in_flight:2}: {len(latencies) / wall:7.0f} "
                         f"commits/s, p50 {statistics.median(latencies) * 1000:6.2f} ms, p99 {p99 * 1000:6.2f} ms")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as base:
        for sync in ("false", "auto"):
            for line in measure(Path(base), sync, args.seconds):
                print(line, flush=True)


if __name__ == "__main__":
    main()
