"""Record facts: one lean row per record (no body), what verify and stats reason about.

Each row carries what dispatch makes of the record (tags code, keys) and the index items the online
indexer would put for it, computed by the storage library's own code, so the checks compare the
store's files against exactly what RocketMQ would have built.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from pipeline.scan import ScanSummary, StoreInput, decoded_records, splits_frame, splits_of_batches, summary_accumulator
from pipeline.split_reader import Split
from services.store.index_service import IndexService
from services.store.message import KEY_SEPARATOR
from services.store.record import body_crc, dispatch_request_of

if TYPE_CHECKING:
    from pyspark import Accumulator
    from pyspark.sql import DataFrame, SparkSession

_FIELDS: list[pa.Field[Any]] = [
    pa.field("commitlog_offset", pa.int64()),
    pa.field("store_size", pa.int32()),
    pa.field("topic", pa.string()),
    pa.field("queue_id", pa.int32()),
    pa.field("queue_offset", pa.int64()),
    pa.field("sys_flag", pa.int32()),
    pa.field("tags_code", pa.int64()),
    pa.field("crc_ok", pa.bool_()),
    pa.field("body_size", pa.int32()),
    pa.field("born_ms", pa.int64()),
    pa.field("store_ms", pa.int64()),
    pa.field("born_host", pa.string()),
    pa.field("keys", pa.list_(pa.string())),
    pa.field("index_keys", pa.list_(pa.string())),
    pa.field("index_hashes", pa.list_(pa.int32())),
]
SCHEMA = pa.schema(_FIELDS)
SPARK_SCHEMA = (
    "commitlog_offset BIGINT, store_size INT, topic STRING, queue_id INT, queue_offset BIGINT, sys_flag INT, "
    "tags_code BIGINT, crc_ok BOOLEAN, body_size INT, born_ms BIGINT, store_ms BIGINT, born_host STRING, "
    "keys ARRAY<STRING>, index_keys ARRAY<STRING>, index_hashes ARRAY<INT>")


def record_facts(split: Split, summary: ScanSummary) -> pa.RecordBatch:
    """The facts of every record a split owns (a split is at most tens of MB of records, and these rows
    are small, so one batch a split)."""
    columns: dict[str, list[Any]] = {name: [] for name in SCHEMA.names}
    for offset, record, request in decoded_records(split, summary, dispatch_request_of):
        words = ([request.uniq_key] if request.uniq_key is not None else []) + \
            [w for w in (request.keys or "").split(KEY_SEPARATOR) if w]
        items = IndexService.collect_items((request,), 0) or []
        columns["commitlog_offset"].append(offset)
        columns["store_size"].append(record.store_size)
        columns["topic"].append(record.topic)
        columns["queue_id"].append(record.queue_id)
        columns["queue_offset"].append(record.queue_offset)
        columns["sys_flag"].append(record.sys_flag)
        columns["tags_code"].append(request.tags_code)
        columns["crc_ok"].append(body_crc(record.body) == record.body_crc)
        columns["body_size"].append(len(record.body))
        columns["born_ms"].append(record.born_timestamp)
        columns["store_ms"].append(record.store_timestamp)
        columns["born_host"].append(record.born_host)
        columns["keys"].append([w for w in (request.keys or "").split(KEY_SEPARATOR) if w])
        columns["index_keys"].append(words if items else [])
        columns["index_hashes"].append([item[0] for item in items])
    return pa.RecordBatch.from_pydict(columns, schema=SCHEMA)


def _facts(accumulator: Accumulator[ScanSummary]) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    def facts(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for split in splits_of_batches(batches):
            summary = ScanSummary()
            yield record_facts(split, summary)
            accumulator.add(summary)
    return facts


def records_frame(spark: SparkSession, store: StoreInput, split_size: int
                  ) -> tuple[DataFrame, Accumulator[ScanSummary]]:
    """A DataFrame of record facts and the accumulator its scan fills (once an action ran)."""
    accumulator = summary_accumulator(spark)
    frame = splits_frame(spark, store.plan(split_size)).mapInArrow(_facts(accumulator), SPARK_SCHEMA)
    return frame, accumulator
