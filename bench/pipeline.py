"""Pipeline throughput: export (decode + Parquet write) and reindex over a commitlog of 1 KiB messages,
against a plain single-process Python decode loop over the same files.

    .venv/bin/python -m bench.pipeline [--gib 2] [--store /tmp/mqstore-bench-pipeline] [--master local[*]]

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

from pipeline.export import export
from pipeline.reindex import reindex
from pipeline.session import get_session
from services.commitlog.commit_log import CommitLog
from services.store.commitlog_files import RecordEntry, iter_commitlog, list_commitlog_files
from services.store.config import load_config
from services.store.message import Message

BODY_SIZE = 1024
BATCH = 512


def write_store(root: Path, target_bytes: int) -> None:
    """Fill a store with 1 KiB messages until the commitlog holds ``target_bytes``."""
    log = CommitLog(load_config(environ={}), root)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--gib", type=float, default=2.0, help="commitlog size in GiB (default 2)")
    parser.add_argument("--store", type=Path, default=Path("/tmp/mqstore-bench-pipeline"))
    parser.add_argument("--out", type=Path, default=Path("/tmp/mqstore-bench-pipeline-out"))
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--split-size", type=int, default=64 * 1024 * 1024)
    parser.add_argument("--skip-plain", action="store_true", help="skip the single-process baseline")
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
    if not args.skip_plain:
        records, size, seconds = plain_decode(args.store / "commitlog")
        results["plain"] = {"records": records, "bytes": size, "seconds": round(seconds, 2),
                            "mb_per_s": round(size / seconds / 1e6, 1), "records_per_s": round(records / seconds)}
        print("plain decode loop:", results["plain"])
    spark = get_session(args.master)
    shutil.rmtree(args.out, ignore_errors=True)
    t = time.perf_counter()
    result = export(spark, args.store, str(args.out / "parquet"), from_offset=0, split_size=args.split_size)
    seconds = time.perf_counter() - t
    size = result.summary.record_bytes
    results["export"] = {"records": result.summary.records, "bytes": size, "seconds": round(seconds, 2),
                         "mb_per_s": round(size / seconds / 1e6, 1),
                         "records_per_s": round(result.summary.records / seconds)}
    print("spark export:", results["export"])
    t = time.perf_counter()
    reindexed = reindex(spark, args.store, args.out / "reindex", split_size=args.split_size, force=True)
    seconds = time.perf_counter() - t
    results["reindex"] = {"records": reindexed.records, "seconds": round(seconds, 2),
                          "records_per_s": round(reindexed.records / seconds),
                          "index_files": len(reindexed.index_files), "queues": reindexed.queues}
    print("spark reindex:", results["reindex"])
    print(json.dumps(results))


if __name__ == "__main__":
    main()
