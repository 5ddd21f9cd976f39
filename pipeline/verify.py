"""``verify``: is a store consistent? Exits non-zero on any inconsistency and writes a JSON report.

Checks, each over the whole store in parallel:

* the commitlog has no corrupt region or hole, and every record decodes and passes its body CRC;
* every ConsumeQueue unit points at a record with its topic, queue id, queue offset, size and tags
  code, queues have no holes, and every queueable record has its unit (queue offsets have no gaps);
* every key the indexer would index (UNIQ_KEY and KEYS words) resolves through the index files to the
  record: its (hash, offset) is reachable from the hash slot, as a query walks it.

The store is mqstore's (``indexer/consumequeue``, ``indexer/index``) or RocketMQ's (``consumequeue/``,
``index/``), told apart by services.store.formats.store_layout. The geometry (ConsumeQueue file size, the index
files' hashSlotNum and indexNum) comes from ``--config``/``MQSTORE_*`` settings and flags, else from
the files (services.store.formats.geometry), settled at the driver: tasks are given it, never guess it.

Run as ``mqstore pipeline verify STORE`` or ``spark-submit pipeline/verify.py STORE``.
"""

from __future__ import annotations

import argparse
import json
import re
import struct
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.failures import run_job
from pipeline.records import records_frame
from pipeline.scan import StoreInput
from pipeline.split_reader import DEFAULT_SPLIT_SIZE
from services.store.formats.consume_queue import BLANK_UNIT, CQ_STORE_UNIT_SIZE, is_valid_unit
from services.store.formats.geometry import GeometryOptions, add_geometry_arguments, options_of
from services.store.formats.index_file import IndexFile
from services.store.formats.message import TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE, TRANSACTION_TYPE_MASK

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

JAVA_LONG_MAX = 2**63 - 1
MAX_SAMPLES = 100
_UNIT = struct.Struct(">qiq")  # commitlog offset, size, tags code: a ConsumeQueue unit
_FILE_NAME = re.compile(r"[0-9]{20}")
PROBLEM_SCHEMA = "check STRING, offset BIGINT, detail STRING"
CQ_SCHEMA = "topic STRING, queue_id INT, queue_offset BIGINT, phy_offset BIGINT, size INT, tags_code BIGINT"


@dataclass(frozen=True)
class QueueFiles:
    topic: str
    queue_id: int
    paths: tuple[str, ...]


@dataclass
class VerifyReport:
    """Counts per check and up to MAX_SAMPLES problems of each."""

    store: str
    records: int = 0
    record_bytes: int = 0
    cq_units: int = 0
    index_files: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    samples: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not any(self.counts.values())

    def as_json(self) -> dict[str, Any]:
        return {"store": self.store, "ok": self.ok, "records": self.records, "record_bytes": self.record_bytes,
                "cq_units": self.cq_units, "index_files": self.index_files, "problem_counts": self.counts,
                "problems": self.samples}


def list_queues(consumequeue: Path) -> list[QueueFiles]:
    if not consumequeue.is_dir():
        return []
    queues = []
    for topic_dir in sorted(p for p in consumequeue.iterdir() if p.is_dir()):
        for queue_dir in sorted(p for p in topic_dir.iterdir() if p.is_dir() and p.name.isdigit()):
            files = sorted(str(f) for f in queue_dir.iterdir() if _FILE_NAME.fullmatch(f.name))
            queues.append(QueueFiles(topic_dir.name, int(queue_dir.name), tuple(files)))
    return queues


def queue_units(queue: QueueFiles, file_size: int
                ) -> Iterator[tuple[str, int, int, int, int, int] | tuple[str, int, str]]:
    """(topic, queue id, queue offset, commitlog offset, size, tags code) of every unit up to the end of the
    queue's data, then (topic, queue id, problem) for anything wrong: a file that is not
    ``file_size`` (mappedFileSizeConsumeQueue) bytes, a missing file, or valid units after the end of the
    data (a hole). Filler units (fillPreBlank) are skipped."""
    previous_end: int | None = None
    ended_at: int | None = None
    for path in queue.paths:
        start = int(Path(path).name)
        data = Path(path).read_bytes()
        if len(data) != file_size:
            yield queue.topic, queue.queue_id, f"file {Path(path).name} is {len(data)} bytes, not " \
                f"mappedFileSizeConsumeQueue {file_size}"
        if previous_end is not None and start != previous_end:
            yield queue.topic, queue.queue_id, f"file {Path(path).name} does not follow the previous file " \
                f"(expected byte offset {previous_end})"
        previous_end = start + len(data)
        for index, (offset, size, tags_code) in enumerate(_UNIT.iter_unpack(data[:len(data) - len(data) % 20])):
            queue_offset = (start + index * CQ_STORE_UNIT_SIZE) // CQ_STORE_UNIT_SIZE
            if not is_valid_unit(offset, size):
                if ended_at is None:
                    ended_at = queue_offset
                continue
            if data[index * 20:index * 20 + 20] == BLANK_UNIT:
                continue
            if ended_at is not None:
                yield queue.topic, queue.queue_id, f"unit {queue_offset} is valid after the queue's data ended at " \
                    f"{ended_at}: the queue has a hole"
                ended_at = None
            yield queue.topic, queue.queue_id, queue_offset, offset, size, tags_code


def reachable_entries(path: str, hash_slot_num: int, index_num: int) -> Iterator[tuple[int, int]]:
    """(key hash, commitlog offset) of every entry a query can reach, walking each hash's chain with
    the library's own query code (slot, time and chain rules included)."""
    index = IndexFile(Path(path), hash_slot_num, index_num, read_only=True)
    try:
        for key_hash in sorted({entry.key_hash for entry in index.entries()}):
            for offset in set(index.select_by_hash(key_hash, 1 << 30, 0, JAVA_LONG_MAX)):
                yield key_hash, offset
    finally:
        index.close()


def _problems(frame: DataFrame, check: str, offset: str, detail: str) -> DataFrame:
    from pyspark.sql import functions as F

    return frame.select(F.lit(check).alias("check"), F.col(offset).cast("bigint").alias("offset"),
                        F.expr(detail).cast("string").alias("detail"))


@dataclass(frozen=True)
class VerifyInputs:
    """What verify reads, settled before Spark starts: anything that refuses the store (no commitlog,
    geometry that cannot be settled) does so in one line, at once."""

    source: StoreInput
    queues: list[QueueFiles]
    cq_file_size: int
    index_files: list[str]
    hash_slot_num: int
    index_num: int

    @classmethod
    def of(cls, source: StoreInput) -> VerifyInputs:
        layout = source.layout
        source.commitlog_files()
        cq_file_size = source.geometry.cq_file_size(layout.consume_queue_files(), layout.consumequeue)
        files = layout.index_files()
        hash_slot_num, index_num = source.geometry.index_geometry(files)
        return cls(source, list_queues(layout.consumequeue), cq_file_size, [str(f) for f in files], hash_slot_num,
                   index_num)


def verify(spark: SparkSession, store: str | Path | StoreInput | VerifyInputs, split_size: int = DEFAULT_SPLIT_SIZE,
           geometry: GeometryOptions | None = None) -> VerifyReport:
    from pyspark.sql import functions as F

    inputs = store if isinstance(store, VerifyInputs) else VerifyInputs.of(StoreInput.open(store, geometry))
    source, queues, cq_file_size, files = inputs.source, inputs.queues, inputs.cq_file_size, inputs.index_files
    hash_slot_num, index_num = inputs.hash_slot_num, inputs.index_num

    report = VerifyReport(str(source.layout.root))
    records, accumulator = records_frame(spark, source, split_size)
    records = records.cache()
    report.records = records.count()
    summary = accumulator.value
    report.record_bytes = summary.record_bytes
    sc = spark.sparkContext
    problems: list[DataFrame] = []

    problems.append(_problems(records.where(~F.col("crc_ok")), "body-crc", "commitlog_offset",
                              "concat(topic, ' body CRC does not match')"))

    unit_rdd = sc.parallelize(queues, max(len(queues), 1)) \
        .flatMap(lambda queue: queue_units(queue, cq_file_size)).cache()
    units = spark.createDataFrame(unit_rdd.filter(lambda row: len(row) == 6), CQ_SCHEMA).cache()
    report.cq_units = units.count()
    queue_faults = [(str(row[0]), int(row[1]), str(row[2]))
                    for row in unit_rdd.filter(lambda row: len(row) == 3).collect()]

    r = records.alias("r")
    u = units.alias("u")
    joined = u.join(r, F.col("u.phy_offset") == F.col("r.commitlog_offset"), "left")
    problems.append(_problems(joined.where(F.col("r.commitlog_offset").isNull()), "cq-unit-without-record",
                              "u.phy_offset", "concat(u.topic, '/', u.queue_id, ' unit ', u.queue_offset, "
                                              "' points at no record')"))
    mismatch = ("r.commitlog_offset is not null and (r.topic != u.topic or r.queue_id != u.queue_id or "
                "r.queue_offset != u.queue_offset or r.store_size != u.size or r.tags_code != u.tags_code)")
    problems.append(_problems(joined.where(mismatch), "cq-unit-mismatch", "u.phy_offset",
                              "concat(u.topic, '/', u.queue_id, ' unit ', u.queue_offset, ' (size ', u.size, "
                              "', tags ', u.tags_code, ') but the record is ', r.topic, '/', r.queue_id, "
                              "' offset ', r.queue_offset, ' (size ', r.store_size, ', tags ', r.tags_code, ')')"))
    tx = F.col("sys_flag").bitwiseAND(TRANSACTION_TYPE_MASK)
    queueable = records.where(~tx.isin(TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE))
    missing = queueable.join(units, queueable.commitlog_offset == units.phy_offset, "left_anti")
    problems.append(_problems(missing, "record-not-in-consumequeue", "commitlog_offset",
                              "concat(topic, '/', queue_id, ' queue offset ', queue_offset, ' has no unit')"))
    per_queue = queueable.groupBy("topic", "queue_id").agg(
        F.count("*").alias("n"), F.countDistinct("queue_offset").alias("distinct"),
        F.min("queue_offset").alias("lo"), F.max("queue_offset").alias("hi"), F.min("commitlog_offset").alias("at"))
    problems.append(_problems(per_queue.where("n != distinct or hi - lo + 1 != n"), "queue-offset-gap", "at",
                              "concat(topic, '/', queue_id, ': ', n, ' records with queue offsets ', lo, '..', hi, "
                              "' (', distinct, ' distinct)')"))

    report.index_files = len(files)
    entries = spark.createDataFrame(
        sc.parallelize(files, max(len(files), 1)).flatMap(lambda f: reachable_entries(f, hash_slot_num, index_num)),
        "key_hash INT, phy_offset BIGINT").distinct()
    keyed = records.select("commitlog_offset", "topic", F.posexplode("index_hashes").alias("i", "key_hash"),
                           "index_keys")
    unresolved = keyed.join(entries, (keyed.key_hash == entries.key_hash)
                            & (keyed.commitlog_offset == entries.phy_offset), "left_anti")
    problems.append(_problems(unresolved, "key-not-in-index", "commitlog_offset",
                              "concat(topic, '#', element_at(index_keys, i + 1), ' does not resolve to the record')"))

    all_problems = problems[0]
    for frame in problems[1:]:
        all_problems = all_problems.unionByName(frame)
    counted = {row["check"]: row["count"] for row in all_problems.groupBy("check").count().collect()}
    for check in ("body-crc", "cq-unit-without-record", "cq-unit-mismatch", "record-not-in-consumequeue",
                  "queue-offset-gap", "key-not-in-index"):
        report.counts[check] = int(counted.get(check, 0))
        if report.counts[check]:
            rows = all_problems.where(F.col("check") == check).orderBy("offset").limit(MAX_SAMPLES).collect()
            report.samples[check] = [{"offset": row["offset"], "detail": row["detail"]} for row in rows]
    summary_problems = summary.problems()
    report.counts["commitlog-damage"] = len(summary_problems)
    if summary_problems:
        report.samples["commitlog-damage"] = summary_problems[:MAX_SAMPLES]
    report.counts["consumequeue-files"] = len(queue_faults)
    if queue_faults:
        report.samples["consumequeue-files"] = [{"queue": f"{t}/{q}", "detail": d} for t, q, d in queue_faults]
    records.unpersist()
    units.unpersist()
    unit_rdd.unpersist()
    return report


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("store", help="a store root, mqstore's (commitlog/, indexer/consumequeue/, indexer/index/) "
                                      "or RocketMQ's (commitlog/, consumequeue/, index/)")
    parser.add_argument("--report", type=Path, default=Path("verify-report.json"), help="JSON report path")
    parser.add_argument("--split-size", type=int, default=DEFAULT_SPLIT_SIZE, help="bytes per task")
    parser.add_argument("--master", default=None, help="Spark master (default local[*])")
    add_geometry_arguments(parser, commitlog=True, consumequeue=True, index=True)


def run(args: argparse.Namespace) -> int:
    return run_job("mqstore pipeline verify", _run, args)


def _run(args: argparse.Namespace) -> int:
    from pipeline.session import get_session

    inputs = VerifyInputs.of(StoreInput.open(args.store, options_of(args)))
    report = verify(get_session(args.master), inputs, args.split_size)
    args.report.write_text(json.dumps(report.as_json(), indent=2, ensure_ascii=False) + "\n")
    print(f"{report.store}: {report.records} records ({report.record_bytes} bytes), {report.cq_units} "
          f"consume queue units, {report.index_files} index files")
    for check, count in report.counts.items():
        print(f"  {'FAIL' if count else 'ok  '} {check}: {count}")
        for sample in report.samples.get(check, [])[:5]:
            print(f"       at {sample.get('offset', sample.get('queue'))}: "
                  f"{sample.get('detail', sample.get('reason'))}")
    print(f"{'consistent' if report.ok else 'INCONSISTENT'}; report written to {args.report}")
    return 0 if report.ok else 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mqstore pipeline verify", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    # Through the package, so workers import the job's functions instead of unpickling __main__'s copies.
    from pipeline.verify import main as package_main

    sys.exit(package_main())
