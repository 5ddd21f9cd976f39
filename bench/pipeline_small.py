"""Where a small pipeline job's seconds go: one driver process times, in order, the JVM and Spark
session start, the first and second Python task (worker start, then reuse), and each job given, run
through the command line's entry point in that session. Every phase reports wall and CPU seconds of
the process tree (JVM, Python daemon and workers included) and the Spark jobs, stages and tasks it ran.

    .venv/bin/python -m bench.pipeline_small [--store /tmp/mqstore-bench-small] [--mb 24]
        [--master local[*]] [--conf KEY=VALUE ...] [--small | --no-small] [--jobs export,verify,stats]

The store (written once and reused, like ``bench.pipeline``'s) is mqstore's CommitLog with 4 MiB files
(six for 24 MB), 3 topics, 8 queues, bodies of 200 to 1,800 bytes with one KEYS word each; ``reindex``
runs first so verify has a ConsumeQueue and index. ``--small`` (default) gives the session the small-job
settings the command line would choose for this store (pipeline/session.py); ``--no-small`` the
defaults. Compare CPU seconds on a shared machine: the wall time follows its load.
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
from pathlib import Path
from typing import Any

from bench.pipeline import _tree_cpu
from pipeline import cli, session
from pipeline.scan import StoreInput
from services.commitlog.message_store import MessageStore
from services.store.config import load_config
from services.store.formats.message import Message

FILE_SIZE = 4 << 20
BATCH = 256


def write_store(root: Path, target_bytes: int) -> None:
    log = MessageStore(load_config(environ={"MQSTORE_MAPPED_FILE_SIZE_COMMIT_LOG": str(FILE_SIZE)}), root)
    log.start()
    try:
        body = os.urandom(1800)
        i = 0
        while log.max_offset < target_bytes:
            log.put_messages([Message(topic=f"Topic{(i + k) % 3}", queue_id=(i + k) % 8,
                                      body=body[:200 + (i + k) * 37 % 1600],
                                      properties={"KEYS": f"key-{(i + k) % 100_000}"},
                                      born_timestamp=int(time.time() * 1000)) for k in range(BATCH)])
            i += BATCH
    finally:
        log.shutdown()


class Phases:
    """Wall and CPU seconds since the previous mark, and the Spark jobs, stages and tasks run meanwhile."""

    def __init__(self) -> None:
        self.wall, self.cpu, self.next_job = time.monotonic(), _tree_cpu(os.getpid()), 0

    def mark(self, what: str, spark: Any = None) -> None:
        wall, cpu = time.monotonic(), _tree_cpu(os.getpid())
        counts = ""
        if spark is not None:
            tracker = spark.sparkContext.statusTracker()
            jobs = [j for j in tracker.getJobIdsForGroup(None) if j >= self.next_job]
            stages = [s for j in jobs if (info := tracker.getJobInfo(j)) for s in info.stageIds]
            tasks = sum(info.numTasks for s in stages if (info := tracker.getStageInfo(s)))
            self.next_job = max(jobs, default=self.next_job - 1) + 1
            counts = f"  {len(jobs)} jobs, {len(stages)} stages, {tasks} tasks"
        print(f"{what:44s} {wall - self.wall:7.2f} s wall {cpu - self.cpu:6.2f} cpu-s{counts}", flush=True)
        self.wall, self.cpu = wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", type=Path, default=Path("/tmp/mqstore-bench-small"))
    parser.add_argument("--mb", type=float, default=24)
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--small", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--jobs", default="export,verify,stats")
    args = parser.parse_args()
    if not (args.store / "commitlog").is_dir():
        write_store(args.store, int(args.mb * 1e6))
    out = args.store.with_name(args.store.name + "-out")
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    size = StoreInput.open(args.store).data_bytes()
    print(f"store {args.store}: {size} commitlog bytes", flush=True)
    conf = cli.parse_conf(args.conf)
    phases = Phases()
    session.configure(args.master, conf, False, size if args.small else None)
    spark = session.get_session()
    phases.mark("JVM + SparkSession start")
    spark.sparkContext.parallelize([1], 1).map(lambda x: x).count()
    phases.mark("first Python task (daemon + worker start)", spark)
    spark.sparkContext.parallelize([1], 1).map(lambda x: x).count()
    phases.mark("second Python task (worker reused)", spark)
    jobs = {"reindex": ["reindex", str(args.store), "--force"],
            "export": ["export", str(args.store), str(out / "export")],
            "verify": ["verify", str(args.store), "--report", str(out / "verify.json")],
            "stats": ["stats", str(args.store), str(out / "stats")]}
    cli.main(jobs["reindex"])
    phases.mark("(reindex, so verify has a ConsumeQueue)", spark)
    for job in args.jobs.split(","):
        code = cli.main(jobs[job])
        session.configure(args.master, conf, False, size if args.small else None)
        phases.mark(f"{job} (exit {code})", spark)


if __name__ == "__main__":
    main()
