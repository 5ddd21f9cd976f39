"""Dispatch throughput: Tail chunks -> DispatchRequests -> ConsumeQueue + IndexFile, in-process.

The indexer's hot path without the network: 1 KiB messages with 2 KEYS + UNIQ_KEY + TAGS, chunked
as the commitlog's Tail sends them (4 MiB), default ConsumeQueue and IndexFile geometry. Prints
records/s, MB/s, the per-chunk latency, and this process's CPU time per record in the parser and in
IndexerStore.dispatch (ConsumeQueue units + IndexFile entries), which a busy machine disturbs less.

    python -m bench.dispatch [--records 300000] [--reps 3]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from bench.report import percentile
from bench.workload import print_machine, scratch_dir
from services.indexer.indexer_store import IndexerStore
from services.server.gc_tuning import tune_gc
from services.store.config import load_config
from services.store.formats.message import properties_to_string
from services.store.formats.record import encode_record, parse_dispatch_requests

CHUNK_BYTES = 4 * 1024 * 1024


def make_chunks(records: int) -> list[tuple[int, bytes]]:
    """(start offset, whole records) chunks of a synthetic log: 8 queues, 2 keys + UNIQ_KEY per message."""
    chunks: list[tuple[int, bytes]] = []
    pending: list[bytes] = []
    start = offset = size = 0
    body = bytes(range(256)) * 4
    for i in range(records):
        props = properties_to_string({
            "KEYS": f"order-{i} user-{i % 1000}", "UNIQ_KEY": f"7F00000110921B6D3586{i:012X}",
            "TAGS": f"Tag{i % 3}", "CLUSTER": "DefaultCluster"}).encode()
        record = encode_record(topic=b"TopicTest", queue_id=i % 8, body=body, flag=0, properties=props, sys_flag=0,
                               born_timestamp=1_700_000_000_000 + i, born_host=bytes([127, 0, 0, 1, 0, 0, 195, 80]),
                               store_host=bytes([127, 0, 0, 1, 0, 0, 42, 159]), queue_offset=i // 8,
                               commitlog_offset=offset, store_timestamp=1_800_000_000_000 + i // 100)
        if size + len(record) > CHUNK_BYTES and pending:
            chunks.append((start, b"".join(pending)))
            pending, start, size = [], offset, 0
        pending.append(record)
        size += len(record)
        offset += len(record)
    if pending:
        chunks.append((start, b"".join(pending)))
    return chunks


def run_once(root: Path, chunks: list[tuple[int, bytes]]) -> tuple[float, list[float], float, float]:
    """(wall seconds, per-chunk latencies, CPU seconds parsing, CPU seconds in IndexerStore.dispatch).
    The CPU times (this process's, not wall) hold better than the rates on a machine others share."""
    tune_gc()  # as the indexer process does
    store = IndexerStore(load_config(environ={}), root)
    store.start()
    latencies: list[float] = []
    parse_cpu = dispatch_cpu = 0.0
    cpu = time.process_time
    try:
        started = time.perf_counter()
        for start, data in chunks:
            t = time.perf_counter()
            c0 = cpu()
            requests = parse_dispatch_requests(data, start)
            c1 = cpu()
            store.dispatch(requests, start + len(data))
            dispatch_cpu += cpu() - c1
            parse_cpu += c1 - c0
            latencies.append(time.perf_counter() - t)
        return time.perf_counter() - started, latencies, parse_cpu, dispatch_cpu
    finally:
        store.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    print_machine()
    print(f"building {args.records} records ...", flush=True)
    chunks = make_chunks(args.records)
    total_bytes = sum(len(d) for _, d in chunks)
    rates = []
    cpu_costs: list[tuple[float, float]] = []
    for rep in range(1, args.reps + 1):
        with scratch_dir("dispatch") as root:
            seconds, latencies, parse_cpu, dispatch_cpu = run_once(root, chunks)
        latencies.sort()
        rate = args.records / seconds
        rates.append(rate)
        per_record = (parse_cpu / args.records * 1e6, dispatch_cpu / args.records * 1e6)
        cpu_costs.append(per_record)
        print(f"rep {rep}: {rate:,.0f} records/s, {total_bytes / seconds / 1e6:.1f} MB/s, "
              f"chunk ({len(chunks)} x 4 MiB) p50 {percentile(latencies, 50) * 1e3:.1f} ms "
              f"p99 {percentile(latencies, 99) * 1e3:.1f} ms; CPU per record: parse {per_record[0]:.2f} us, "
              f"dispatch (ConsumeQueue + index) {per_record[1]:.2f} us", flush=True)
    print(f"median: {statistics.median(rates):,.0f} records/s (target >= 150,000); CPU per record: parse "
          f"{statistics.median(c[0] for c in cpu_costs):.2f} us, dispatch "
          f"{statistics.median(c[1] for c in cpu_costs):.2f} us")


if __name__ == "__main__":
    main()
