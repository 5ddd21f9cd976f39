"""Pipeline throughput: export (decode + Parquet write), reindex and verify over a commitlog of 1 KiB
messages, against a plain single-process Python decode loop over the same files (per record, and
columnar without Spark).

    .venv/bin/python -m bench.pipeline [--gib 2] [--store /tmp/mqstore-bench-pipeline] [--master local[*]]
        [--jobs export,reindex,verify] [--skip-plain]

Besides wall time, every Spark job reports the CPU seconds its processes used (the JVM and its
Python workers, read from /proc): on a shared machine the wall time depends on what else runs, the
CPU per MB does much less, and ``mb_per_cpu_s * 2`` is what 2 free cores would reach.

The store is written once by mqstore's own CommitLog (1 GiB files, 1 topic, 8 queues) and reused.
MB = 10^6 bytes of stored records (what is read), so figures compare with the RocketMQ perf anchor.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path

from pipeline.columnar import export_batches
from pipeline.export import SCHEMA, decode_split, export, records_batch
from pipeline.reindex import dispatch_split, reindex
from pipeline.scan import ScanSummary, StoreInput
from pipeline.session import get_session
from pipeline.verify import digest_split, verify
from services.commitlog.message_store import MessageStore
from services.store.config import load_config
from services.store.formats.commitlog_walk import RecordEntry, iter_commitlog, list_commitlog_files
from services.store.formats.message import Message

BODY_SIZE = 1024
BATCH = 512


def write_store(root: Path, target_bytes: int) -> None:
    """Fill a store with 1 KiB messages until the commitlog holds ``target_bytes``."""
    log = MessageStore(load_config(environ={}), root)
    log.start()
    try:
        body = os.urandom(BODY_SIZE)
        i = 0
        while log.max_offset < target_bytes:
            batch = [Message(topic="BenchTopic", queue_id=(i + k) % 8, body=body,
                             properties={"KEYS": f"key-{(i + k) % 100_000}"}, born_timestamp=int(time.time() * 1000))
                     for k in range(BATCH)]
            log.put_messages(batch)
            i += BATCH
    finally:
        log.shutdown()


def plain_decode(commitlog: Path) -> tuple[int, int, float]:
    """(records, bytes, seconds) of one process walking every record (decode + CRC, as recovery does)."""
    start = time.perf_counter()
    records = size = 0
    for entry in iter_commitlog(commitlog):
        if isinstance(entry, RecordEntry):
            records += 1
            size += entry.size
    return records, size, time.perf_counter() - start


def _tree_cpu(root: int, own_only: bool = False) -> float:
    """CPU seconds (user + system) of process ``root`` and its descendants, reaped ones included
    (``own_only``: of ``root``'s own threads alone)."""
    ticks = os.sysconf("SC_CLK_TCK")
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        parents[int(entry)] = int(fields[1])
        times[int(entry)] = sum(int(v) for v in fields[11:15]) / ticks  # utime stime cutime cstime
    if own_only:
        return sum(int(v) for v in Path(f"/proc/{root}/stat").read_text().rpartition(")")[2].split()[11:13]) / ticks
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        total += times.get(pid, 0.0)
        todo += [child for child, parent in parents.items() if parent == pid]
    return total


class CpuMeter:
    """Wall and CPU seconds of the Spark JVM (with its Python workers) and this driver over a block."""

    def __init__(self, jvm_pid: int) -> None:
        self.jvm_pid = jvm_pid

    def __enter__(self) -> CpuMeter:
        self.wall = time.perf_counter()
        self.cpu = _tree_cpu(self.jvm_pid) + time.process_time()
        self.jvm = _tree_cpu(self.jvm_pid, own_only=True)
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self.wall
        self.cpu = _tree_cpu(self.jvm_pid) + time.process_time() - self.cpu
        self.jvm = _tree_cpu(self.jvm_pid, own_only=True) - self.jvm


def _figures(meter: CpuMeter, records: int, size: int) -> dict[str, float | None]:
    return {"records": records, "bytes": size, "seconds": round(meter.wall, 2),
            "mb_per_s": round(size / meter.wall / 1e6, 1), "records_per_s": round(records / meter.wall),
            "cpu_s": round(meter.cpu, 1), "jvm_cpu_s": round(meter.jvm, 1), "cores": round(meter.cpu / meter.wall, 2),
            "mb_per_cpu_s": round(size / meter.cpu / 1e6, 1), "records_per_cpu_s": round(records / meter.cpu),
            "cpu_s_per_gib": round(meter.cpu / size * (1 << 30), 1) if size else None}


def plain_columnar(store: Path, split_size: int, per_record: bool) -> dict[str, float]:
    """One process decoding every split into export's Arrow batches, columnar or record by record."""
    source = StoreInput.open(store)
    summary = ScanSummary()
    start, cpu = time.perf_counter(), time.process_time()
    for split in source.plan(split_size):
        if per_record:
            batches = decode_split(split, False, summary)
        else:
            batches = export_batches(split, False, summary, 4096, SCHEMA, lambda r: records_batch(r, False))
        for _ in batches:
            pass
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    return {"records": summary.records, "bytes": summary.record_bytes, "seconds": round(seconds, 2),
            "mb_per_s": round(summary.record_bytes / seconds / 1e6, 1),
            "records_per_s": round(summary.records / seconds), "cpu_s": round(cpu, 1)}


def plain_worker_floor(store: Path, split_size: int, job: str) -> dict[str, float]:
    """One process running a job's worker reduction over every split (verify: ``digest_split``,
    reindex: ``dispatch_split``), the floor the Spark job's workers cannot beat per CPU second."""
    source = StoreInput.open(store)
    start, cpu = time.perf_counter(), time.process_time()
    records = 0
    for split in source.plan(split_size):
        if job == "verify":
            digest = digest_split(split)
            records += digest.summary.records
        else:
            records += dispatch_split(split).records
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    return {"records": records, "seconds": round(seconds, 2), "records_per_s": round(records / seconds),
            "cpu_s": round(cpu, 1), "records_per_cpu_s": round(records / cpu)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--gib", type=float, default=2.0, help="commitlog size in GiB (default 2)")
    parser.add_argument("--store", type=Path, default=Path("/tmp/mqstore-bench-pipeline"))
    parser.add_argument("--out", type=Path, default=Path("/tmp/mqstore-bench-pipeline-out"))
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--split-size", type=int, default=64 * 1024 * 1024)
    parser.add_argument("--skip-plain", action="store_true", help="skip the single-process baselines")
    parser.add_argument("--skip-per-record", action="store_true",
                        help="of the single-process baselines, run only the columnar floors (each job's own)")
    parser.add_argument("--jobs", default="export,reindex,verify", help="Spark jobs to time (comma-separated)")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="a Spark setting for the session (repeatable)")
    args = parser.parse_args()
    target = int(args.gib * (1 << 30))
    files = list_commitlog_files(args.store / "commitlog") if (args.store / "commitlog").is_dir() else []
    written = sum(f.size for f in files)
    if written < target * 0.9:
        shutil.rmtree(args.store, ignore_errors=True)
        t = time.perf_counter()
        write_store(args.store, target)
        print(f"wrote the store in {time.perf_counter() - t:.1f} s")
    results: dict[str, object] = {"gib": args.gib, "master": args.master, "split_size": args.split_size}
    jobs = args.jobs.split(",")
    if not args.skip_plain and not args.skip_per_record:
        records, size, seconds = plain_decode(args.store / "commitlog")
        results["plain"] = {"records": records, "bytes": size, "seconds": round(seconds, 2),
                            "mb_per_s": round(size / seconds / 1e6, 1), "records_per_s": round(records / seconds)}
        print("plain decode loop (iter_commitlog):", results["plain"], flush=True)
        results["plain_export_rows"] = plain_columnar(args.store, args.split_size, per_record=True)
        print("one process, export rows, record by record:", results["plain_export_rows"], flush=True)
    if not args.skip_plain:
        results["plain_columnar"] = plain_columnar(args.store, args.split_size, per_record=False)
        print("one process, export rows, columnar:", results["plain_columnar"], flush=True)
        for job in ("reindex", "verify"):
            if job in jobs:
                results[f"plain_{job}"] = plain_worker_floor(args.store, args.split_size, job)
                print(f"one process, {job}'s worker reduction:", results[f"plain_{job}"], flush=True)
    spark = get_session(args.master, conf=dict(item.split("=", 1) for item in args.conf))
    results["conf"] = args.conf
    jvm_pid = spark.sparkContext._gateway.proc.pid  # type: ignore[union-attr]
    if "export" in jobs:
        shutil.rmtree(args.out, ignore_errors=True)
        with CpuMeter(jvm_pid) as meter:
            result = export(spark, args.store, str(args.out / "parquet"), from_offset=0, split_size=args.split_size)
        results["export"] = _figures(meter, result.summary.records, result.summary.record_bytes)
        print("spark export:", results["export"], flush=True)
    if "reindex" in jobs:
        with CpuMeter(jvm_pid) as meter:
            reindexed = reindex(spark, args.store, None, split_size=args.split_size, force=True)  # verify reads them
        results["reindex"] = {**_figures(meter, reindexed.records, 0), "index_files": len(reindexed.index_files),
                              "queues": reindexed.queues}
        print("spark reindex:", results["reindex"], flush=True)
    if "verify" in jobs:
        with CpuMeter(jvm_pid) as meter:
            report = verify(spark, args.store, split_size=args.split_size)
        results["verify"] = {**_figures(meter, report.records, report.record_bytes), "ok": report.ok}
        print("spark verify:", results["verify"], flush=True)
    spark.stop()
    print(json.dumps(results))


if __name__ == "__main__":
    main()
