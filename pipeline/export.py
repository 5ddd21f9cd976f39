"""``export``: commitlog -> Parquet, one row per message, partitioned by topic and store date.

Workers decode their split into Arrow record batches (columns are built per batch, so no row objects
cross into the JVM) and Spark writes them. Incremental: a state file remembers where the last export
ended, and a rerun starts there (``--from-offset`` overrides it). The schema is in docs/pipeline.md.

Run as ``mqstore pipeline export STORE OUT`` or ``spark-submit pipeline/export.py STORE OUT``.
"""

from __future__ import annotations

import argparse
import json
import sys
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from pipeline.scan import (
    ScanSummary,
    commitlog_dir,
    decoded_records,
    no_conversion,
    plan,
    splits_frame,
    splits_of_batches,
    summary_accumulator,
)
from pipeline.split_reader import DEFAULT_SPLIT_SIZE, Split
from services.store.message import COMPRESSED_FLAG, KEY_SEPARATOR
from services.store.message_id import make_message_id
from services.store.record import body_crc

if TYPE_CHECKING:
    from pyspark import Accumulator
    from pyspark.sql import SparkSession

STATE_FILE_NAME = "_mqstore_export_state.json"
BATCH_ROWS = 4096
MS_PER_DAY = 86_400_000
# sysFlag bits 8..10 name the compression type (RocketMQ 5 MessageSysFlag); 0 is a 4.x client's zlib.
COMPRESSION_TYPE_SHIFT = 8
COMPRESSION_TYPE_MASK = 0x7
ZLIB_TYPES = (0, 3)

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


def decompress_body(body: bytes, sys_flag: int) -> tuple[bytes, bool]:
    """(body, whether it was inflated). Only zlib is inflated; LZ4/ZSTD bodies are kept as stored."""
    if not sys_flag & COMPRESSED_FLAG:
        return body, False
    if (sys_flag >> COMPRESSION_TYPE_SHIFT) & COMPRESSION_TYPE_MASK not in ZLIB_TYPES:
        return body, False
    try:
        return zlib.decompress(body), True
    except zlib.error:
        return body, False


class _Columns:
    """Column lists of one Arrow batch."""

    def __init__(self) -> None:
        self.values: dict[str, list[Any]] = {name: [] for name in SCHEMA.names}

    def __len__(self) -> int:
        return len(self.values["topic"])

    def batch(self) -> pa.RecordBatch:
        batch = pa.RecordBatch.from_pydict(self.values, schema=SCHEMA)
        self.values = {name: [] for name in SCHEMA.names}
        return batch


def decode_split(split: Split, decompress: bool, summary: ScanSummary,
                 batch_rows: int = BATCH_ROWS) -> Iterator[pa.RecordBatch]:
    """Arrow batches of every record the split owns; gaps and undecodable records go to ``summary``."""
    columns = _Columns()
    v = columns.values
    for _, record, _ in decoded_records(split, summary, no_conversion):
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
        if len(columns) >= batch_rows:
            yield columns.batch()
    if len(columns):
        yield columns.batch()


def _decoder(decompress: bool, accumulator: Accumulator[ScanSummary]
             ) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    def decode(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for split in splits_of_batches(batches):
            summary = ScanSummary()
            yield from decode_split(split, decompress, summary)
            accumulator.add(summary)
    return decode


@dataclass
class ExportResult:
    from_offset: int
    next_offset: int
    summary: ScanSummary
    splits: int


def read_state(path: Path) -> dict[str, Any]:
    try:
        state: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    return state


def export(spark: SparkSession, store: str | Path, output: str, *, from_offset: int | None = None,
           state_file: Path | None = None, split_size: int = DEFAULT_SPLIT_SIZE,
           decompress: bool = False) -> ExportResult:
    """Export every record from ``from_offset`` (default: where the state file says the last export
    ended, else 0) to Parquet under ``output``, appending; then record the new end in the state file."""
    state_path = state_file if state_file is not None else Path(output) / STATE_FILE_NAME
    state = read_state(state_path)
    start = from_offset if from_offset is not None else int(state.get("next_offset", 0))
    splits = plan(store, split_size, start)
    accumulator = summary_accumulator(spark)
    frame = splits_frame(spark, splits).mapInArrow(_decoder(decompress, accumulator), SPARK_SCHEMA)
    frame.write.mode("append").partitionBy(*PARTITION_COLUMNS).parquet(output)
    summary = accumulator.value
    next_offset = max(summary.max_end, start)
    state_path.parent.mkdir(parents=True, exist_ok=True)
    state_path.write_text(json.dumps({
        "commitlog": str(commitlog_dir(store).resolve()), "next_offset": next_offset,
        "exported_records": int(state.get("exported_records", 0)) + summary.records,
        "updated": datetime.now(UTC).isoformat(timespec="seconds"),
    }, indent=2) + "\n")
    return ExportResult(start, next_offset, summary, len(splits))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("store", help="a store root or its commitlog directory")
    parser.add_argument("output", help="Parquet output directory (appended to)")
    parser.add_argument("--from-offset", type=int, default=None,
                        help="start at this commitlog offset (default: where the last export ended)")
    parser.add_argument("--state-file", type=Path, default=None,
                        help=f"incremental state (default OUTPUT/{STATE_FILE_NAME})")
    parser.add_argument("--decompress", action="store_true", help="inflate zlib-compressed bodies")
    parser.add_argument("--split-size", type=int, default=DEFAULT_SPLIT_SIZE, help="bytes per task")
    parser.add_argument("--master", default=None, help="Spark master (default local[*])")


def run(args: argparse.Namespace) -> int:
    from pipeline.session import get_session

    result = export(get_session(args.master), args.store, args.output, from_offset=args.from_offset,
                    state_file=args.state_file, split_size=args.split_size, decompress=args.decompress)
    summary = result.summary
    print(f"exported {summary.records} records ({summary.record_bytes} bytes) from offset {result.from_offset} "
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
