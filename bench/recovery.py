"""CommitLog recovery time: a clean restart (normal recovery) and a crash restart (abnormal recovery).

    python -m bench.recovery                          # a 2 GiB store of ~650 B records, 1 GiB files, 3 reps
    python -m bench.recovery --size-gib 1 --reps 1
    python -m bench.recovery --store DIR              # reuse a store written by --keep-store

The store is written once through the engine (``put_messages`` batches, ASYNC_FLUSH) under
<repo>/.bench-tmp and stopped cleanly, so every file but the last is full. Then, per rep:

* ``normal``: a clean restart: ``MessageStore.start()`` (normal recovery walks the last three files).
* ``abnormal``: the abort file is put back and the checkpoint zeroed (stale: the walk starts at the
  first file), with the queue offset snapshot kept: the restart after a crash.
* ``abnormal-no-snapshot``: the same without ``config/queue_offsets.json``: the queue offset table is
  rebuilt from the whole log as well (also timed alone: ``queue table rebuild s``).

Each rep times the recovery walk alone (``recover_normally``/``recover_abnormally`` on a freshly
loaded MappedFileQueue) and the whole ``MessageStore.start()`` (mapping, walk, truncation, queue offset
table, services). The figure to compare with the target (2 s per GiB scanned) is ``s/GiB``: the
walk's time divided by the bytes it walked. The page cache is warm unless ``--drop-caches``.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import shutil
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bench.report import CpuMeter, progress, wait_quiet
from bench.workload import CLUSTER, QUEUES, SCRATCH, TOPIC, drop_caches, print_machine, scratch_dir
from services.commitlog.message_store import MessageStore
from services.commitlog.recovery import RecoveryResult, recover_abnormally, recover_normally
from services.commitlog.topic_queue_table import replay_queue_offsets
from services.store.config import ASYNC_FLUSH, MessageStoreConfig, load_config
from services.store.formats.checkpoint import StoreCheckpoint
from services.store.formats.mapped_file_queue import MappedFileQueue
from services.store.formats.message import Message, parse_delay_levels

GIB = 1024 * 1024 * 1024
# 91 fixed bytes + topic (9) + properties "UNIQ_KEY\x01<32 hex>\x02CLUSTER\x01DefaultCluster" (64) + body.
BODY_SIZE = 486
RECORD_SIZE = 91 + len(TOPIC) + 64 + BODY_SIZE
assert RECORD_SIZE == 650
BATCH = 256


@dataclass
class Timing:
    case: str
    rep: int
    walk_s: float
    walk_cpu_s: float
    rebuild_s: float
    start_s: float
    scanned_bytes: int
    records: int
    cpu_other: float

    @property
    def s_per_gib(self) -> float:
        return self.walk_s / (self.scanned_bytes / GIB) if self.scanned_bytes else float("nan")


def store_config(file_size: int) -> MessageStoreConfig:
    return load_config(environ={}, mapped_file_size_commit_log=file_size, flush_disk_type=ASYNC_FLUSH)


def write_store(root: Path, total_bytes: int, file_size: int) -> int:
    """Fill ``root`` with ~``total_bytes`` of RECORD_SIZE records, stopped cleanly. Returns the record count."""
    rng = random.Random(7)
    bodies = [rng.randbytes(BODY_SIZE) for _ in range(1024)]
    prefix = f"7F000001{os.getpid() & 0xFFFF:04X}{rng.getrandbits(32):08X}"
    born = int(time.time() * 1000)
    log = MessageStore(store_config(file_size), root)
    log.start()
    count = 0
    started = time.monotonic()
    try:
        while log.max_offset < total_bytes:
            batch = [Message(TOPIC, i % QUEUES, bodies[i % len(bodies)],
                             properties={"UNIQ_KEY": f"{prefix}{i:012X}", "CLUSTER": CLUSTER},
                             born_timestamp=born, born_host="127.0.0.1:50000")
                     for i in range(count, count + BATCH)]
            log.put_messages(batch)
            count += BATCH
            if count % (BATCH * 2000) == 0:
                progress(f"  wrote {log.max_offset / GIB:.2f} GiB ({count:,} records)")
    finally:
        log.shutdown()
    progress(f"wrote {count:,} records ({total_bytes / GIB:.2f} GiB) in {time.monotonic() - started:.1f}s")
    return count


def _zero_checkpoint(root: Path) -> None:
    checkpoint = StoreCheckpoint(root / "checkpoint")
    checkpoint.physic_msg_timestamp = checkpoint.logics_msg_timestamp = checkpoint.index_msg_timestamp = 0
    checkpoint.close()


def _walk(root: Path, config: MessageStoreConfig, abnormal: bool,
          rebuild: bool) -> tuple[float, float, RecoveryResult, float]:
    """Time the recovery walk alone over a freshly loaded queue: (wall s, CPU s, result), then with
    ``rebuild`` the queue offset table rebuilt from the whole walked log (wall s, else NaN)."""
    mfq = MappedFileQueue(root / "commitlog", config.mapped_file_size_commit_log, preallocate=False)
    mfq.load()
    delays = parse_delay_levels(config.message_delay_level)
    try:
        started, cpu = time.perf_counter(), time.thread_time()
        if abnormal:
            checkpoint = StoreCheckpoint(root / "checkpoint")
            try:
                result = recover_abnormally(mfq, checkpoint, config.check_crc_on_recover, False, delays)
            finally:
                checkpoint.close()
        else:
            result = recover_normally(mfq, config.check_crc_on_recover, delays)
        elapsed, cpu = time.perf_counter() - started, time.thread_time() - cpu
        rebuild_s = float("nan")
        if rebuild:
            started = time.perf_counter()
            replay_queue_offsets(mfq, mfq.min_offset, result.end, {})
            rebuild_s = time.perf_counter() - started
    finally:
        mfq.shutdown()
    return elapsed, cpu, result, rebuild_s


def _start(root: Path, config: MessageStoreConfig) -> float:
    log = MessageStore(config, root)
    started = time.perf_counter()
    log.start()
    elapsed = time.perf_counter() - started
    log.shutdown()
    return elapsed


def run_case(case: str, rep: int, root: Path, config: MessageStoreConfig, records: int,
             cold: bool, quiet_s: float) -> Timing:
    abnormal = case != "normal"
    if abnormal:
        (root / "abort").touch()
        _zero_checkpoint(root)
    snapshot = root / "config" / "queue_offsets.json"
    if case == "abnormal-no-snapshot":
        for path in (snapshot, snapshot.with_name(snapshot.name + ".bak")):
            path.unlink(missing_ok=True)
    wait_quiet(quiet_s)
    if cold:
        drop_caches()
    meter = CpuMeter()
    walk_s, walk_cpu_s, result, rebuild_s = _walk(root, config, abnormal, case == "abnormal-no-snapshot")
    if cold:
        drop_caches()
    start_s = _start(root, config)
    other = meter.stop()["cpuOther"]
    return Timing(case, rep, walk_s, walk_cpu_s, rebuild_s, start_s, result.scanned_bytes, result.records, other)


def print_results(timings: list[Timing]) -> None:
    print("\n| case | rep | scanned GiB | records | walk s | walk CPU s | s/GiB | queue table rebuild s | "
          "start() s | cpu other |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for t in timings:
        rebuild = "-" if t.rebuild_s != t.rebuild_s else f"{t.rebuild_s:.2f}"
        print(f"| {t.case} | {t.rep} | {t.scanned_bytes / GIB:.2f} | {t.records:,} | {t.walk_s:.2f} | "
              f"{t.walk_cpu_s:.2f} | {t.s_per_gib:.2f} | {rebuild} | {t.start_s:.2f} | {t.cpu_other:.2f} |")
    print("\n| case | reps | median walk s/GiB | median walk CPU s/GiB | median start() s |")
    print("|---|---:|---:|---:|---:|")
    for case in dict.fromkeys(t.case for t in timings):
        reps = [t for t in timings if t.case == case]
        gib = [t.scanned_bytes / GIB for t in reps]
        print(f"| {case} | {len(reps)} | {statistics.median(t.s_per_gib for t in reps):.2f} | "
              f"{statistics.median(t.walk_cpu_s / g for t, g in zip(reps, gib, strict=True)):.2f} | "
              f"{statistics.median(t.start_s for t in reps):.2f} |")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.recovery", description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-gib", type=float, default=2.0, help="data to write (default 2 GiB)")
    parser.add_argument("--file-size-mib", type=int, default=1024, help="commitlog file size (default 1024)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--cases", default="normal,abnormal,abnormal-no-snapshot")
    parser.add_argument("--store", type=Path, help="an existing store (kept) instead of writing one")
    parser.add_argument("--keep-store", action="store_true")
    parser.add_argument("--drop-caches", action="store_true", help="cold page cache before each timing (root)")
    parser.add_argument("--wait-quiet", type=float, default=30.0, metavar="SECONDS")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    file_size = args.file_size_mib * 1024 * 1024
    config = store_config(file_size)
    cases = args.cases.split(",")
    print_machine()
    timings: list[Timing] = []
    if args.store is not None:
        for rep in range(1, args.reps + 1):
            for case in cases:
                timings.append(run_case(case, rep, args.store, config, 0, args.drop_caches, args.wait_quiet))
                progress(f"{case} rep {rep}: walk {timings[-1].walk_s:.2f}s, start {timings[-1].start_s:.2f}s")
        print_results(timings)
        return 0
    free = shutil.disk_usage(SCRATCH.parent).free
    if free < args.size_gib * GIB * 1.5 + file_size:
        parser.error(f"{free / GIB:.1f} GiB free under {SCRATCH.parent}: too little for a {args.size_gib} GiB store")
    with scratch_dir("recovery-", keep=args.keep_store) as root:
        records = write_store(root, int(args.size_gib * GIB), file_size)
        for rep in range(1, args.reps + 1):
            for case in cases:
                timings.append(run_case(case, rep, root, config, records, args.drop_caches, args.wait_quiet))
                progress(f"{case} rep {rep}: walk {timings[-1].walk_s:.2f}s, start {timings[-1].start_s:.2f}s")
    print_results(timings)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
