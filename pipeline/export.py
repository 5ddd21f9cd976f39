"""``export``: commitlog -> Parquet, one row per message, partitioned by topic and store date.

Workers decode their split into Arrow record batches, column by column (pipeline/columnar.py: no
per-record Python objects for the common record layout) and write the Parquet files themselves with
pyarrow (:func:`write_split`): the JVM only schedules splits and collects file names, because turning
Arrow batches into Spark rows and encoding Parquet there cost several times the decode. Each task
commits its files atomically (a temporary name per attempt, fsync, rename to a name fixed by the split),
so a killed task leaves no partial file and a retried one writes its rows once. Outputs that are not
local paths (``hdfs://``, ``s3a://``) are written by Spark from the same batches.

Incremental: a state file remembers where the last export ended, and a rerun starts there
(``--from-offset`` overrides it). The schema is in docs/pipeline.md.

Every record is written exactly once, or the export fails: the run is written into a staging
directory (``OUT/_mqstore_export_staging-<run>``, which Parquet readers skip), the driver reads the
written Parquet back and compares its rows (count, distinct commitlog offsets, their sum) with what
the tasks decoded, and only then moves the files into ``OUT``. The state file names a run that is
being moved, so an export interrupted there is finished by the next one instead of written twice.

STORE and OUT may be local paths or Hadoop URIs (``file:///data/store``, ``s3a://bucket/archive``;
pipeline/fs.py). The state file lives in OUT (through Hadoop's FileSystem for a URI) unless
``--state-file`` names a local file. A store whose oldest files expired before they were exported is
still exported from its oldest file, and the commitlog range lost is reported (``expired``).

Run as ``mqstore pipeline export STORE OUT`` or ``spark-submit pipeline/export.py STORE OUT``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from mqstore.client.compression import consumer_body
from pipeline.columnar import export_batches, pc, sorted_distinct
from pipeline.failures import JobError, run_job
from pipeline.fs import HadoopFiles, parse_location
from pipeline.scan import (
    ScanSummary,
    StoreInput,
    decoded_records,
    no_conversion,
    splits_frame,
    splits_of_batches,
    splits_rdd,
    summary_accumulator,
)
from pipeline.split_reader import DEFAULT_SPLIT_SIZE, Split
from services.store.formats.geometry import GeometryOptions, add_geometry_arguments, options_of
from services.store.formats.message import COMPRESSED_FLAG, KEY_SEPARATOR, MessageRecord
from services.store.formats.message_id import make_message_id
from services.store.formats.record import body_crc
from services.store.store_root import fsync_dir, make_dirs, write_atomically

if TYPE_CHECKING:
    from pyspark import Accumulator
    from pyspark.sql import DataFrame, SparkSession

STATE_FILE_NAME = "_mqstore_export_state.json"
STAGING_PREFIX = "_mqstore_export_staging-"
BATCH_ROWS = 4096
MS_PER_DAY = 86_400_000

_FIELDS: list[pa.Field[Any]] = [
    pa.field("topic", pa.string()),
    pa.field("queue_id", pa.int32()),
    pa.field("queue_offset", pa.int64()),
    pa.field("commitlog_offset", pa.int64()),
    pa.field("store_size", pa.int32()),
    pa.field("msg_id", pa.string()),
    pa.field("uniq_key", pa.string()),
    pa.field("keys", pa.list_(pa.string())),
    pa.field("tags", pa.string()),
    pa.field("properties", pa.map_(pa.string(), pa.string())),
    pa.field("body", pa.binary()),
    pa.field("body_decompressed", pa.bool_()),
    pa.field("body_crc", pa.int32()),
    pa.field("body_crc_ok", pa.bool_()),
    pa.field("flag", pa.int32()),
    pa.field("sys_flag", pa.int32()),
    pa.field("born_timestamp", pa.timestamp("us", tz="UTC")),
    pa.field("store_timestamp", pa.timestamp("us", tz="UTC")),
    pa.field("born_host", pa.string()),
    pa.field("store_host", pa.string()),
    pa.field("reconsume_times", pa.int32()),
    pa.field("prepared_transaction_offset", pa.int64()),
    pa.field("store_date", pa.date32()),
]
SCHEMA = pa.schema(_FIELDS)
SPARK_SCHEMA = (
    "topic STRING, queue_id INT, queue_offset BIGINT, commitlog_offset BIGINT, store_size INT, msg_id STRING, "
    "uniq_key STRING, keys ARRAY<STRING>, tags STRING, properties MAP<STRING, STRING>, body BINARY, "
    "body_decompressed BOOLEAN, body_crc INT, body_crc_ok BOOLEAN, flag INT, sys_flag INT, "
    "born_timestamp TIMESTAMP, store_timestamp TIMESTAMP, born_host STRING, store_host STRING, "
    "reconsume_times INT, prepared_transaction_offset BIGINT, store_date DATE")
PARTITION_COLUMNS = ("topic", "store_date")
#: Columns named as Spark's Kafka source and Kafka Connect name them, derived in the JVM from the
#: decoded ones (the decoders never see them): ``timestamp`` is the store time (Kafka's
#: LogAppendTime), ``key`` the KEYS property as stored (the message key; ``keys`` has its words).
KAFKA_COLUMNS = (("timestamp", "store_timestamp"), ("key", "properties['KEYS']"))
#: The rows of the Kafka-shaped view (:func:`kafka_view`): records that took a queue offset. PREPARED
#: (0x4) and ROLLBACK (0xC) records take none (their QUEUEOFFSET is 0, as RocketMQ writes them) and are
#: in no ConsumeQueue; they are exported, but in the view they would repeat (topic, partition, offset).
KAFKA_VIEW_FILTER = "(sys_flag & 12) NOT IN (4, 12)"
#: The view's columns, as Spark's Kafka source names them.
KAFKA_VIEW_COLUMNS = ("topic", "queue_id AS partition", "queue_offset AS offset", "timestamp", "1 AS timestampType",
                      "CAST(key AS BINARY) AS key", "body AS value",
                      "transform(map_entries(properties), e -> struct(e.key AS key, CAST(e.value AS BINARY) AS value))"
                      " AS headers")


def decompress_body(body: bytes, sys_flag: int) -> tuple[bytes, bool]:
    """(body, whether it was inflated), by the consumers' rule (``mqstore.client.compression``): whole
    zlib streams up to 64 MiB inflated; LZ4/ZSTD and bodies that do not inflate kept as stored."""
    inflated, still_compressed = consumer_body(body, sys_flag)
    return inflated, bool(sys_flag & COMPRESSED_FLAG) and not still_compressed


class _Columns:
    """Column lists of one Arrow batch. The lists are emptied in place after each batch (Arrow has
    copied them), never replaced: the decoder appends through references to them, and a replaced
    list would take the rows after the first batch nowhere."""

    def __init__(self) -> None:
        self.values: dict[str, list[Any]] = {name: [] for name in SCHEMA.names}

    def __len__(self) -> int:
        return len(self.values["topic"])

    def batch(self) -> pa.RecordBatch:
        batch = pa.RecordBatch.from_pydict(self.values, schema=SCHEMA)
        for column in self.values.values():
            column.clear()
        return batch


def _append_row(v: dict[str, list[Any]], record: MessageRecord, decompress: bool) -> None:
    props = record.properties
    keys = props.get("KEYS")
    body, inflated = decompress_body(record.body, record.sys_flag) if decompress else (record.body, False)
    v["topic"].append(record.topic)
    v["queue_id"].append(record.queue_id)
    v["queue_offset"].append(record.queue_offset)
    v["commitlog_offset"].append(record.commitlog_offset)
    v["store_size"].append(record.store_size)
    v["msg_id"].append(make_message_id(record.store_host, record.commitlog_offset))
    v["uniq_key"].append(props.get("UNIQ_KEY"))
    v["keys"].append([k for k in keys.split(KEY_SEPARATOR) if k] if keys else [])
    v["tags"].append(props.get("TAGS"))
    v["properties"].append(list(props.items()))
    v["body"].append(body)
    v["body_decompressed"].append(inflated)
    v["body_crc"].append(record.body_crc)
    v["body_crc_ok"].append(body_crc(record.body) == record.body_crc)
    v["flag"].append(record.flag)
    v["sys_flag"].append(record.sys_flag)
    v["born_timestamp"].append(record.born_timestamp * 1000)
    v["store_timestamp"].append(record.store_timestamp * 1000)
    v["born_host"].append(record.born_host)
    v["store_host"].append(record.store_host)
    v["reconsume_times"].append(record.reconsume_times)
    v["prepared_transaction_offset"].append(record.prepared_transaction_offset)
    v["store_date"].append(record.store_timestamp // MS_PER_DAY)


def records_batch(records: Iterable[MessageRecord], decompress: bool) -> pa.RecordBatch:
    """The rows of records decoded one by one: the columnar decoder's fallback for uncommon records."""
    columns = _Columns()
    for record in records:
        _append_row(columns.values, record, decompress)
    return columns.batch()


def decode_split(split: Split, decompress: bool, summary: ScanSummary,
                 batch_rows: int = BATCH_ROWS) -> Iterator[pa.RecordBatch]:
    """Arrow batches of every record the split owns, decoded record by record (the reference the
    columnar decoder, pipeline/columnar.py, is tested against); gaps and undecodable records go to
    ``summary``."""
    columns = _Columns()
    for _, record, _ in decoded_records(split, summary, no_conversion):
        _append_row(columns.values, record, decompress)
        if len(columns) >= batch_rows:
            yield columns.batch()
    if len(columns):
        yield columns.batch()


def _decoder(decompress: bool, accumulator: Accumulator[ScanSummary], batch_rows: int
             ) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    def slow_rows(records: list[MessageRecord]) -> pa.RecordBatch:
        return records_batch(records, decompress)

    def decode(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for split in splits_of_batches(batches):
            summary = ScanSummary()
            yield from export_batches(split, decompress, summary, batch_rows, SCHEMA, slow_rows)
            accumulator.add(summary)
    return decode


#: Test hook: a worker whose environment sets this exits (``os._exit``) once it has written this many
#: bytes of a temporary Parquet file, as a task killed mid-write would (tests/pipeline/test_export_files.py).
CRASH_AFTER_BYTES_ENV = "MQSTORE_EXPORT_CRASH_AFTER_BYTES"
#: Columns of a few distinct values (worth Parquet's dictionary encoding); bodies, ids, keys and
#: property maps are written plain, where a dictionary attempt cost more CPU than the whole write.
DICTIONARY_COLUMNS = ("topic", "tags", "born_host", "store_host")
#: Characters Spark escapes (%XX) in a partition directory's value (ExternalCatalogUtils.escapePathName),
#: so the worker-written directories are the ones Spark's own writer made and its reader unescapes.
_SPARK_ESCAPED = frozenset([chr(c) for c in range(1, 32)] + list('"#%\'*/:=?\\\x7f{[]^'))
#: What Spark names the directory of a null or empty partition value.
_HIVE_DEFAULT_PARTITION = "__HIVE_DEFAULT_PARTITION__"
_EPOCH = date(1970, 1, 1)
#: pyarrow's stubs type ``where`` and ``use_dictionary`` narrower than the function takes (a file-like
#: object, a list of column names).
_write_table: Any = pq.write_table


@dataclass(frozen=True)
class SplitFiles:
    """What one task wrote: its split's tally (and problems) and its committed files, by path
    relative to the staging directory, with their rows."""

    summary: ScanSummary
    files: tuple[tuple[str, int], ...]


def partition_value(value: str) -> str:
    """A partition directory's value as Spark writes it: special characters as %XX."""
    if not value:
        return _HIVE_DEFAULT_PARTITION
    return "".join(f"%{ord(c):02X}" if c in _SPARK_ESCAPED else c for c in value)


def file_table(rows: pa.Table) -> pa.Table:
    """The columns a Parquet file holds, in Spark's order: the record's (partition columns left to the
    directory names), then :data:`KAFKA_COLUMNS`."""
    columns = [rows[name] for name in SCHEMA.names if name not in PARTITION_COLUMNS]
    names = [name for name in SCHEMA.names if name not in PARTITION_COLUMNS]
    key = pc.map_lookup(rows["properties"], "KEYS", "first")
    return pa.Table.from_arrays([*columns, rows["store_timestamp"], key], names=[*names, "timestamp", "key"])


def partitions(rows: pa.Table) -> Iterator[tuple[str, pa.Table]]:
    """(``topic=.../store_date=...`` directory, its rows in commitlog order) for each partition."""
    topics = pc.dictionary_encode(rows["topic"]).combine_chunks()
    days = rows["store_date"].cast(pa.int32()).to_numpy().astype(np.int64)
    group = topics.indices.to_numpy().astype(np.int64) << 32 | (days - days.min())
    keys, first, inverse = np.unique(group, return_index=True, return_inverse=True)
    names = topics.dictionary.to_pylist()
    for k in range(keys.size):
        row = int(first[k])
        day = _EPOCH + timedelta(days=int(days[row]))
        directory = f"topic={partition_value(names[topics.indices[row].as_py()])}/store_date={day.isoformat()}"
        yield directory, rows if keys.size == 1 else rows.take(np.flatnonzero(inverse == k))


class _CrashingSink:
    """A file that ends the process after ``limit`` bytes (:data:`CRASH_AFTER_BYTES_ENV`)."""

    def __init__(self, handle: BinaryIO, limit: int) -> None:
        self.handle, self.limit, self.written = handle, limit, 0

    @property
    def closed(self) -> bool:
        return self.handle.closed

    def write(self, data: bytes) -> int:
        room = self.limit - self.written
        if len(data) >= room:
            self.handle.write(bytes(data)[:room])
            self.handle.flush()
            os._exit(17)
        self.written += len(data)
        return self.handle.write(data)

    def flush(self) -> None:
        self.handle.flush()


def _attempt_id() -> str:
    """This task attempt's id (Spark's, unique per attempt in the application), and the process's."""
    from pyspark import TaskContext

    context = TaskContext.get()
    return f"{context.taskAttemptId() if context is not None else uuid.uuid4().hex}-{os.getpid()}"


def commit_file(path: Path, table: pa.Table) -> None:
    """Write ``table`` to ``path`` so that it is there whole or not at all: a temporary name of this
    attempt (dot-prefixed, which Parquet readers and the driver's move skip), fsync, rename, fsync
    the directory. Another attempt of the same split writes the same rows under the same name."""
    make_dirs(path.parent)
    temp = path.with_name(f".{path.name}.{_attempt_id()}.tmp")
    crash_after = int(os.environ.get(CRASH_AFTER_BYTES_ENV, "0") or 0)
    try:
        with open(temp, "wb") as handle:
            sink = _CrashingSink(handle, crash_after) if crash_after > 0 else handle
            _write_table(table, sink, compression="snappy", use_dictionary=list(DICTIONARY_COLUMNS),
                           row_group_size=1 << 20)
            handle.flush()
            os.fsync(handle.fileno())
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    os.replace(temp, path)
    fsync_dir(path.parent)


def split_file_name(split: Split, run: str) -> str:
    """The file a split's rows of one partition go to: fixed by the run and the split, so every attempt
    of the task writes the same names (Spark's ``part-NNNNN-<job uuid>.c000`` shape)."""
    return f"part-{split.index:05d}-{run}.c000.snappy.parquet"


def write_split(split: Split, staging: str, run: str, decompress: bool, batch_rows: int = BATCH_ROWS) -> SplitFiles:
    """The task: decode a split (columnar) and commit one Parquet file per partition it has rows of."""
    summary = ScanSummary()
    batches = list(export_batches(split, decompress, summary, batch_rows, SCHEMA,
                                  partial(records_batch, decompress=decompress)))
    files: list[tuple[str, int]] = []
    if batches:
        rows = pa.Table.from_batches(batches, SCHEMA)
        for directory, part in partitions(rows):
            relative = f"{directory}/{split_file_name(split, run)}"
            commit_file(Path(staging) / relative, file_table(part))
            files.append((relative, part.num_rows))
    return SplitFiles(summary, tuple(files))


def write_in_workers(spark: SparkSession, splits: list[Split], staging: Path, run: str, decompress: bool,
                     batch_rows: int) -> ScanSummary:
    """Every split written by its task into ``staging`` (a local directory every worker sees); the
    merged summary of what they decoded."""
    make_dirs(staging)
    written = splits_rdd(spark, splits).map(
        partial(write_split, staging=str(staging), run=run, decompress=decompress, batch_rows=batch_rows)).collect()
    summary = ScanSummary()
    for task in written:
        summary.merge(task.summary)
    return summary


class ExportError(JobError):
    """What was written differs from what was decoded: the export is refused, OUT is left as it was."""


@dataclass(frozen=True)
class ExportResult:
    from_offset: int
    next_offset: int
    summary: ScanSummary  # what the tasks decoded
    splits: int
    written: int  # rows of this run, read back from the Parquet it wrote
    resumed: int = 0  # rows of an interrupted earlier run, moved into place first
    expired: tuple[int, int] | None = None  # [from, to) of commitlog deleted before it was exported
    output: str = ""


@dataclass(frozen=True)
class WrittenRows:
    """What a Parquet directory holds, read back: rows, distinct commitlog offsets, their sum."""

    rows: int
    distinct_offsets: int
    offset_sum: int


def read_state(path: Path) -> dict[str, Any]:
    try:
        state: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    return state


class StateFile:
    """The incremental state: a local file (written with fsync and rename), or a file under a remote
    OUT written through Hadoop's FileSystem."""

    def __init__(self, local: Path | None, remote: tuple[HadoopFiles, str] | None = None) -> None:
        self.local, self.remote = local, remote

    @classmethod
    def of(cls, spark: SparkSession, output: str, state_file: Path | None) -> StateFile:
        if state_file is not None:
            return cls(state_file)
        location = parse_location(output, remote_file_uris=False)
        if location.local is not None:
            return cls(location.local / STATE_FILE_NAME)
        return cls(None, (HadoopFiles(spark, output), _child(output, STATE_FILE_NAME)))

    def __str__(self) -> str:
        return str(self.local) if self.local is not None else str(self.remote[1] if self.remote else "")

    def read(self) -> dict[str, Any]:
        if self.local is not None:
            return read_state(self.local)
        assert self.remote is not None
        text = self.remote[0].read_text(self.remote[1])
        state: dict[str, Any] = json.loads(text) if text else {}
        return state

    def write(self, state: dict[str, Any]) -> None:
        state["updated"] = datetime.now(UTC).isoformat(timespec="seconds")
        content = json.dumps(state, indent=2) + "\n"
        if self.local is not None:
            write_atomically(self.local, content.encode())
        else:
            assert self.remote is not None
            self.remote[0].write_text(self.remote[1], content)


def read_state_checked(state_file: StateFile, source: StoreInput) -> dict[str, Any]:
    """The state, refused (with what to do) if it records exports of another store's commitlog."""
    state = state_file.read()
    recorded = state.get("commitlog")
    if recorded and recorded != source.commitlog_name and "next_offset" in state:
        raise ExportError(f"{state_file} records exports of {recorded}, not {source.commitlog_name}: "
                          "give another OUT or --state-file (or --from-offset to start over)")
    return state


def _child(output: str, name: str) -> str:
    return output.rstrip("/") + "/" + name


def written_rows(spark: SparkSession, path: str) -> WrittenRows:
    """Count what the Parquet files under ``path`` hold (the files, not any task's tally)."""
    from pyspark.sql import functions as F

    frame = spark.read.schema(SPARK_SCHEMA).parquet(path)
    row = frame.agg(F.count(F.lit(1)), F.countDistinct("commitlog_offset"),
                    F.sum(F.col("commitlog_offset").cast("decimal(38,0)"))).first()
    assert row is not None
    return WrittenRows(int(row[0]), int(row[1]), int(row[2] or 0))


def written_rows_local(path: Path) -> WrittenRows:
    """:func:`written_rows` of a local directory, read by the driver with pyarrow (the commitlog offset
    column of every Parquet file under ``path``; files whose names start with ``.`` or ``_`` are
    skipped, as Spark's reader skips them)."""
    import pyarrow.dataset as ds

    if not path.is_dir():
        return WrittenRows(0, 0, 0)
    column = pa.schema([pa.field("commitlog_offset", pa.int64())])  # given: a run that wrote no file has none
    offsets = ds.dataset(path, schema=column, format="parquet", ignore_prefixes=[".", "_"]).to_table()[
        "commitlog_offset"].to_numpy()
    return WrittenRows(int(offsets.size), int(sorted_distinct(offsets).size), sum(offsets.tolist()))


def with_kafka_columns(frame: DataFrame) -> DataFrame:
    """``frame`` with :data:`KAFKA_COLUMNS` added before the partition columns (computed by Spark)."""
    from pyspark.sql import functions as F

    columns = [c for c in frame.columns if c not in PARTITION_COLUMNS]
    derived = [F.expr(expression).alias(name) for name, expression in KAFKA_COLUMNS]
    return frame.select(*columns, *derived, *PARTITION_COLUMNS)


def kafka_view(exported: DataFrame) -> DataFrame:
    """The Kafka-shaped view of exported rows (docs/pipeline.md): one row per (topic, partition, offset),
    the records a consumer of the queues reads."""
    return exported.where(KAFKA_VIEW_FILTER).selectExpr(*KAFKA_VIEW_COLUMNS)


def check_written(written: WrittenRows, summary: ScanSummary) -> None:
    """ExportError unless the rows written are exactly the records decoded, each once."""
    if written.rows != summary.records:
        raise ExportError(f"wrote {written.rows} rows but decoded {summary.records} records: "
                          f"{summary.records - written.rows} missing; nothing was exported")
    if written.distinct_offsets != written.rows:
        raise ExportError(f"wrote {written.rows} rows but only {written.distinct_offsets} distinct commitlog "
                          "offsets (a record written twice); nothing was exported")
    if written.offset_sum != summary.offset_sum:
        raise ExportError("the commitlog offsets written differ from the records decoded; nothing was exported")


class _HadoopFiles(HadoopFiles):
    """The output's file system (any Hadoop-compatible URI) through the JVM: list, rename, delete."""

    def move_tree(self, source: str, target: str) -> int:
        """Move every data file under ``source`` to the same relative path under ``target`` (one
        atomic rename each; a file already moved is simply no longer under ``source``), then delete
        ``source``. Returns the number of files moved."""
        src = self.fs.makeQualified(self.path(source))
        dst = self.fs.makeQualified(self.path(target))
        listing = self.fs.listFiles(src, True)
        files = []
        while listing.hasNext():
            files.append(listing.next().getPath())
        moved = 0
        for path in files:
            relative = src.toUri().relativize(path.toUri())
            if any(part.startswith(("_", ".")) for part in str(relative.getPath()).split("/")):
                continue  # _SUCCESS, checksum files
            destination = self._path_class(dst, self._path_class(relative))
            if self.fs.exists(destination):
                raise ExportError(f"{destination} exists already: refusing to overwrite exported rows")
            self.fs.mkdirs(destination.getParent())
            if not self.fs.rename(path, destination):
                raise ExportError(f"could not move {path} to {destination}")
            moved += 1
        self.fs.delete(src, True)
        return moved


def _finish_pending(spark: SparkSession, output: str, state_path: StateFile, state: dict[str, Any]) -> int:
    """Complete a run whose rows were checked but not all moved into ``output`` (the last export
    stopped there), and drop the staging directories of runs that stopped before their check (their
    rows were never exported). Returns the completed run's row count (0 if there was none)."""
    files = _HadoopFiles(spark, output)
    pending = state.get("pending")
    for name in files.children(output):
        if name.startswith(STAGING_PREFIX) and (not pending or name != pending["staging"]):
            files.delete(_child(output, name))
    if not pending:
        return 0
    staging = _child(output, str(pending["staging"]))
    if files.exists(staging):
        files.move_tree(staging, output)
    records = int(pending["records"])
    state.pop("pending")
    state["next_offset"] = int(pending["next_offset"])
    state["exported_records"] = int(state.get("exported_records", 0)) + records
    state_path.write(state)
    return records


def export(spark: SparkSession, store: str | Path | StoreInput, output: str, *, from_offset: int | None = None,
           state_file: Path | None = None, split_size: int = DEFAULT_SPLIT_SIZE, decompress: bool = False,
           geometry: GeometryOptions | None = None, batch_rows: int = BATCH_ROWS) -> ExportResult:
    """Export every record from ``from_offset`` (default: where the state file says the last export
    ended, else 0) to Parquet under ``output``, appending; then record the new end in the state file.
    Raises ExportError (and leaves ``output`` as it was) if the rows written are not the records
    decoded. ``batch_rows`` bounds the rows of one Arrow batch (a task's memory)."""
    source = StoreInput.open(store, geometry, spark=spark)
    state_path = StateFile.of(spark, output, state_file)
    state = read_state_checked(state_path, source)
    resumed = _finish_pending(spark, output, state_path, state)
    start = from_offset if from_offset is not None else int(state.get("next_offset", 0))
    files = source.commitlog_files()
    expired = None
    if files and start < files[0].start_offset:
        # Deleted (expired) before an export reached them: nothing there can be exported any more.
        expired = (start, files[0].start_offset) if start > 0 or "next_offset" in state else None
        start = files[0].start_offset
    splits = source.plan(split_size, start)
    run = STAGING_PREFIX + uuid.uuid4().hex
    staging = _child(output, run)
    out_files = _HadoopFiles(spark, output)
    accumulator = summary_accumulator(spark)
    local_output = parse_location(output, remote_file_uris=False).local
    try:
        if local_output is not None:
            summary = write_in_workers(spark, splits, local_output / run, run.removeprefix(STAGING_PREFIX),
                                       decompress, batch_rows)
        else:
            frame = splits_frame(spark, splits).mapInArrow(_decoder(decompress, accumulator, batch_rows),
                                                           SPARK_SCHEMA)
            frame = with_kafka_columns(frame)
            frame.write.mode("errorifexists").partitionBy(*PARTITION_COLUMNS).parquet(staging)
            summary = accumulator.value
        written = written_rows_local(local_output / run) if local_output is not None else written_rows(spark, staging)
        check_written(written, summary)
    except BaseException:
        out_files.delete(staging)
        raise
    next_offset = max(summary.max_end, start)
    state.update({"commitlog": source.commitlog_name,
                  "pending": {"staging": run, "next_offset": next_offset, "records": written.rows}})
    state_path.write(state)
    out_files.move_tree(staging, output)
    state.pop("pending")
    state["next_offset"] = next_offset
    state["exported_records"] = int(state.get("exported_records", 0)) + written.rows
    state_path.write(state)
    return ExportResult(start, next_offset, summary, len(splits), written.rows, resumed, expired, output)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("store", help="a store root or its commitlog directory: a path or a URI "
                                      "(file:///..., hdfs://..., s3a://...)")
    parser.add_argument("output", help="Parquet output directory (appended to): a path or a URI")
    parser.add_argument("--from-offset", type=int, default=None,
                        help="start at this commitlog offset (default: where the last export ended)")
    parser.add_argument("--state-file", type=Path, default=None,
                        help=f"incremental state (default OUTPUT/{STATE_FILE_NAME})")
    parser.add_argument("--decompress", action="store_true", help="inflate zlib-compressed bodies")
    parser.add_argument("--split-size", type=int, default=DEFAULT_SPLIT_SIZE, help="bytes per task")
    parser.add_argument("--master", default=None, help="Spark master (default local[*])")
    add_geometry_arguments(parser, commitlog=True)


def run(args: argparse.Namespace) -> int:
    return run_job("mqstore pipeline export", _run, args)


def run_export(args: argparse.Namespace) -> ExportResult:
    """The job: refuses a malformed location or unreadable local store before Spark starts."""
    from pipeline.session import get_session

    parse_location(args.output)
    if parse_location(args.store).is_remote:
        spark = get_session(args.master)
        source = StoreInput.open(args.store, options_of(args), spark=spark)
    else:
        source = StoreInput.open(args.store, options_of(args))
        source.commitlog_files()  # a store that cannot be read is refused before Spark starts
        spark = get_session(args.master)
    return export(spark, source, args.output, from_offset=args.from_offset, state_file=args.state_file,
                  split_size=args.split_size, decompress=args.decompress)


def result_json(result: ExportResult) -> dict[str, Any]:
    """``--json``: what ran, what was written, where the next export starts, what was wrong."""
    summary = result.summary
    return {"output": result.output, "from_offset": result.from_offset, "next_offset": result.next_offset,
            "records": result.written, "record_bytes": summary.record_bytes, "splits": result.splits,
            "resumed_records": result.resumed,
            "expired": {"from_offset": result.expired[0], "to_offset": result.expired[1]} if result.expired else None,
            "problems": summary.problems()}


def _run(args: argparse.Namespace) -> int:
    result = run_export(args)
    summary = result.summary
    if result.expired:
        print(f"warning: commitlog {result.expired[0]}..{result.expired[1]} was deleted (expired) before it was "
              "exported: its records are lost to this export", file=sys.stderr)
    if result.resumed:
        print(f"finished an interrupted export first: {result.resumed} records moved into place")
    print(f"exported {result.written} records ({summary.record_bytes} bytes) from offset {result.from_offset} "
          f"in {result.splits} splits; next export starts at {result.next_offset}")
    for problem in summary.problems():
        print(f"problem at offset {problem['offset']}: {problem['kind']}: {problem['reason']}", file=sys.stderr)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mqstore pipeline export", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    # Through the package, so workers import the job's functions instead of unpickling __main__'s copies.
    from pipeline.export import main as package_main

    sys.exit(package_main())
