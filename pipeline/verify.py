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

How: the workers reduce each split, ConsumeQueue and index file to a digest (counts, per-queue
offset ranges, and order-free sums of 64-bit hashes of every unit tuple and every (key hash, offset)
pair; see :func:`digest_split`), so nothing but those small results crosses into the JVM. When the
records' digests equal the ConsumeQueues' and the index files', every check above passes, which is a
healthy store's answer in one pass. Any difference (or a damaged body, a queue file out of shape) runs
the detailed checks (Spark joins) that name each problem, so a report's contents never depend on
which pass found them.

Run as ``mqstore pipeline verify STORE`` or ``spark-submit pipeline/verify.py STORE``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import struct
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from pipeline.columnar import pc, sorted_distinct
from pipeline.failures import run_job
from pipeline.records import record_facts, records_frame
from pipeline.scan import ScanSummary, StoreInput
from pipeline.split_reader import DEFAULT_SPLIT_SIZE, Split
from services.store.formats.consume_queue import BLANK_UNIT, CQ_STORE_UNIT_SIZE, JAVA_INT_MAX, is_valid_unit
from services.store.formats.geometry import GeometryOptions, add_geometry_arguments, options_of
from services.store.formats.index_file import (
    HASH_SLOT_SIZE,
    INDEX_ENTRY_SIZE,
    INDEX_HEADER_SIZE,
    INVALID_INDEX,
    IndexFile,
)
from services.store.formats.message import TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE, TRANSACTION_TYPE_MASK

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

JAVA_LONG_MAX = 2**63 - 1
MAX_SAMPLES = 100
_UNIT = struct.Struct(">qiq")  # commitlog offset, size, tags code: a ConsumeQueue unit
_FILE_NAME = re.compile(r"[0-9]{20}")
PROBLEM_SCHEMA = "check STRING, offset BIGINT, detail STRING"
#: The checks the joins run, in the report's order.
CHECKS = ("body-crc", "cq-unit-without-record", "cq-unit-mismatch", "record-not-in-consumequeue", "queue-offset-gap",
          "key-not-in-index")
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


_M64 = (1 << 64) - 1
_UNIT_DTYPE = np.dtype([("offset", ">i8"), ("size", ">i4"), ("tags_code", ">i8")])
_ENTRY_DTYPE = np.dtype([("key_hash", ">i4"), ("phy_offset", ">i8"), ("time_diff", ">i4"), ("prev", ">i4")])


def _mix(values: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser over 64-bit values (wrapping arithmetic): a well-spread hash."""
    z = np.ascontiguousarray(values, dtype=np.int64).view(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return np.asarray(z ^ (z >> np.uint64(31)))


def _topic_hash(topic: str) -> int:
    """A topic's 64-bit hash, the same in every process (``hash()`` is salted per process)."""
    return int.from_bytes(hashlib.blake2b(topic.encode(), digest_size=8).digest(), "little", signed=True)


def unit_hashes(topic_hashes: np.ndarray, queue_id: np.ndarray, queue_offset: np.ndarray, phy_offset: np.ndarray,
                size: np.ndarray, tags_code: np.ndarray) -> np.ndarray:
    """Hashes of (topic, queue id, queue offset, commitlog offset, size, tags code) tuples: what a unit
    says and what its record says must hash alike."""
    h = _mix(topic_hashes)
    for column in (queue_id, queue_offset, phy_offset, size, tags_code):
        h = _mix(h ^ np.asarray(column, dtype=np.int64).view(np.uint64))
    return h


def _pair_digest(key_hash: np.ndarray, offset: np.ndarray) -> tuple[int, int]:
    """(count, hash sum) of the distinct (key hash, commitlog offset) pairs."""
    order = np.lexsort((key_hash, offset))
    key_hash, offset = key_hash[order], offset[order]
    keep = np.ones(key_hash.size, dtype=np.bool_)
    keep[1:] = (key_hash[1:] != key_hash[:-1]) | (offset[1:] != offset[:-1])
    hashes = _mix(_mix(key_hash[keep].astype(np.int64)) ^ offset[keep].astype(np.int64).view(np.uint64))
    return int(keep.sum()), int(hashes.sum(dtype=np.uint64))


@dataclass(frozen=True)
class SplitDigest:
    """One split's records, reduced: what verify compares with the ConsumeQueues and the index."""

    summary: ScanSummary
    bad_crcs: int
    units: tuple[int, int]  # queueable records: (count, hash sum) of their unit tuples
    keys: tuple[int, int]  # (count, hash sum) of the (key hash, offset) pairs the indexer would put
    queues: dict[tuple[str, int], tuple[int, int, int]]  # (records, lowest, highest queue offset) per queue


def digest_split(split: Split) -> SplitDigest:
    """The worker's reduction of a split (record facts, pipeline/records.py, reduced with NumPy)."""
    summary = ScanSummary()
    facts = pa.Table.from_batches([record_facts(split, summary)])
    offsets = facts["commitlog_offset"].to_numpy()
    tx = facts["sys_flag"].to_numpy() & TRANSACTION_TYPE_MASK
    queueable = (tx != TRANSACTION_PREPARED_TYPE) & (tx != TRANSACTION_ROLLBACK_TYPE)
    topics = pc.dictionary_encode(facts["topic"]).combine_chunks()
    topic_hashes = np.array([_topic_hash(t) for t in topics.dictionary.to_pylist()] + [0], dtype=np.int64)
    topic_hashes = topic_hashes[topics.indices.to_numpy()] if offsets.size else np.empty(0, np.int64)
    queue_offsets = facts["queue_offset"].to_numpy()
    hashes = unit_hashes(topic_hashes, facts["queue_id"].to_numpy(), queue_offsets, offsets,
                         facts["store_size"].to_numpy(), facts["tags_code"].to_numpy())[queueable]
    per_queue = facts.filter(pa.array(queueable)).group_by(["topic", "queue_id"]).aggregate(
        [("queue_offset", "count"), ("queue_offset", "min"), ("queue_offset", "max")]).to_pylist()
    flat = pc.list_flatten(facts["index_hashes"]).to_numpy()
    parents = pc.list_parent_indices(facts["index_hashes"]).to_numpy()
    crc_ok = facts["crc_ok"].to_numpy(zero_copy_only=False)
    return SplitDigest(summary, int((~crc_ok).sum()), (int(hashes.size), int(hashes.sum(dtype=np.uint64))),
                       _pair_digest(flat.astype(np.int64), offsets[parents]),
                       {(row["topic"], row["queue_id"]): (row["queue_offset_count"], row["queue_offset_min"],
                                                          row["queue_offset_max"]) for row in per_queue})


def digest_queue(queue: QueueFiles, file_size: int) -> tuple[int, int] | None:
    """(count, hash sum) of a ConsumeQueue's units, read as :func:`queue_units` reads them; None when
    the queue has a fault it would report (a file of another size, out of sequence, a hole)."""
    previous_end: int | None = None
    ended = False
    count = total = 0
    topic_hash = np.int64(_topic_hash(queue.topic))
    for path in queue.paths:
        start = int(Path(path).name)
        data = Path(path).read_bytes()
        if len(data) != file_size or (previous_end is not None and start != previous_end):
            return None
        previous_end = start + len(data)
        units = np.frombuffer(data, dtype=_UNIT_DTYPE, count=len(data) // CQ_STORE_UNIT_SIZE)
        valid = (units["offset"] >= 0) & (units["size"] > 0)
        blank = (units["offset"] == 0) & (units["size"] == JAVA_INT_MAX) & (units["tags_code"] == 0)
        invalid_at = np.flatnonzero(~valid)
        real = valid & ~blank
        if (ended and real.any()) or (invalid_at.size and real[invalid_at[0]:].any()):
            return None  # valid units after the end of the data: a hole
        ended = ended or bool(invalid_at.size)
        rows = np.flatnonzero(real)
        hashes = unit_hashes(np.full(rows.size, topic_hash), np.full(rows.size, queue.queue_id),
                             start // CQ_STORE_UNIT_SIZE + rows, units["offset"][rows], units["size"][rows],
                             units["tags_code"][rows])
        count += rows.size
        total = (total + int(hashes.sum(dtype=np.uint64))) & _M64
    return count, total


def digest_index(path: str, hash_slot_num: int, index_num: int) -> tuple[int, int]:
    """(count, hash sum) of the distinct (key hash, offset) pairs :func:`reachable_entries` yields for
    one index file, computed with NumPy: every slot's chain is walked at once, one link per step, with
    the rules of IndexFile.select_by_hash (a query for every key hash the file's entries hold)."""
    index = IndexFile(Path(path), hash_slot_num, index_num, read_only=True)
    try:
        entry_count, begin_timestamp = index.index_count, index.begin_timestamp
    finally:
        index.close()
    data = np.fromfile(path, dtype=np.uint8)
    slots = data[INDEX_HEADER_SIZE:INDEX_HEADER_SIZE + hash_slot_num * HASH_SLOT_SIZE].view(">i4")
    entries_at = INDEX_HEADER_SIZE + hash_slot_num * HASH_SLOT_SIZE
    entries = data[entries_at:entries_at + index_num * INDEX_ENTRY_SIZE].view(_ENTRY_DTYPE)
    queried = sorted_distinct(entries["key_hash"][1:entry_count])
    last = index_num - 1  # a read-only walk follows entries past the header's count
    slot = np.flatnonzero((slots > INVALID_INDEX) & (slots <= last))
    current = slots[slot].astype(np.int64)
    found_hashes, found_offsets = [], []
    for _ in range(index_num if last > 1 else 0):
        if current.size == 0:
            break
        entry = entries[current]
        key_hash = entry["key_hash"].astype(np.int64)
        time_read = begin_timestamp + entry["time_diff"].astype(np.int64) * 1000
        alive = (entry["time_diff"] >= 0) & (time_read >= 0)
        hit = alive & (key_hash % hash_slot_num == slot) & np.isin(key_hash, queried)
        found_hashes.append(key_hash[hit])
        found_offsets.append(entry["phy_offset"][hit].astype(np.int64))
        prev = entry["prev"].astype(np.int64)
        follow = alive & (prev > INVALID_INDEX) & (prev <= last) & (prev != current)
        current, slot = prev[follow], slot[follow]
    if not found_hashes:
        return 0, 0
    return _pair_digest(np.concatenate(found_hashes), np.concatenate(found_offsets))


def _digest(item: tuple[str, Any], cq_file_size: int, hash_slot_num: int, index_num: int) -> tuple[str, Any]:
    kind, what = item
    if kind == "index":
        return kind, digest_index(what, hash_slot_num, index_num)
    if kind == "queue":
        return kind, digest_queue(what, cq_file_size)
    return kind, digest_split(what)


def quick_verify(spark: SparkSession, inputs: VerifyInputs, split_size: int) -> VerifyReport | None:
    """The report of a store whose records, ConsumeQueues and index agree (one Spark job of worker
    reductions: index files first, the longest tasks), or None where the detailed checks must run."""
    splits = inputs.source.plan(split_size)
    items: list[tuple[str, Any]] = [("index", f) for f in inputs.index_files] + \
        [("queue", q) for q in inputs.queues] + [("split", s) for s in splits]
    digest = partial(_digest, cq_file_size=inputs.cq_file_size, hash_slot_num=inputs.hash_slot_num,
                     index_num=inputs.index_num)
    results = spark.sparkContext.parallelize(items, max(len(items), 1)).map(digest).collect()
    summary = ScanSummary()
    units = keys = index = queue_units_ = (0, 0)
    bad_crcs = 0
    ranges: dict[tuple[str, int], tuple[int, int, int]] = {}

    def add(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
        return a[0] + b[0], (a[1] + b[1]) & _M64

    for kind, result in results:
        if kind == "queue":
            if result is None:
                return None
            queue_units_ = add(queue_units_, result)
        elif kind == "index":
            index = add(index, result)
        else:
            summary.merge(result.summary)
            bad_crcs += result.bad_crcs
            units, keys = add(units, result.units), add(keys, result.keys)
            for key, (n, lo, hi) in result.queues.items():
                m, lo2, hi2 = ranges.get(key, (0, lo, hi))
                ranges[key] = (n + m, min(lo, lo2), max(hi, hi2))
    if bad_crcs or units != queue_units_ or keys != index or any(hi - lo + 1 != n for n, lo, hi in ranges.values()):
        return None
    report = VerifyReport(str(inputs.source.layout.root), summary.records, summary.record_bytes, queue_units_[0],
                          len(inputs.index_files))
    report.counts = dict.fromkeys(CHECKS, 0)
    _add_scan_problems(report, summary, [])
    return report


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
           geometry: GeometryOptions | None = None, detailed: bool = False) -> VerifyReport:
    """The store's report: the workers' digests when they agree, else (or with ``detailed``) the joins."""
    from pyspark.sql import functions as F

    inputs = store if isinstance(store, VerifyInputs) else VerifyInputs.of(StoreInput.open(store, geometry))
    quick = None if detailed else quick_verify(spark, inputs, split_size)
    if quick is not None:
        return quick
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
    for check in CHECKS:
        report.counts[check] = int(counted.get(check, 0))
        if report.counts[check]:
            rows = all_problems.where(F.col("check") == check).orderBy("offset").limit(MAX_SAMPLES).collect()
            report.samples[check] = [{"offset": row["offset"], "detail": row["detail"]} for row in rows]
    _add_scan_problems(report, summary, queue_faults)
    records.unpersist()
    units.unpersist()
    unit_rdd.unpersist()
    return report


def _add_scan_problems(report: VerifyReport, summary: ScanSummary, queue_faults: list[tuple[str, int, str]]) -> None:
    """The problems found while reading: commitlog damage (the split readers') and queue file faults."""
    summary_problems = summary.problems()
    report.counts["commitlog-damage"] = len(summary_problems)
    if summary_problems:
        report.samples["commitlog-damage"] = summary_problems[:MAX_SAMPLES]
    report.counts["consumequeue-files"] = len(queue_faults)
    if queue_faults:
        report.samples["consumequeue-files"] = [{"queue": f"{t}/{q}", "detail": d} for t, q, d in queue_faults]


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
