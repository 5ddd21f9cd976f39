"""Record facts: one lean row per record (no body), what verify and stats reason about.

Each row carries what dispatch makes of the record (tags code, keys) and the index items the online
indexer would put for it, computed by the storage library's own code, so the checks compare the
store's files against exactly what RocketMQ would have built.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from pipeline.columnar import (
    FastRecords,
    decode_slow,
    host_strings,
    keys_lists,
    list_array,
    pc,
    tally,
    walk_split,
)
from pipeline.scan import (
    ScanSummary,
    StoreInput,
    decoded_records,
    splits_frame,
    splits_of_batches,
    summary_accumulator,
)
from pipeline.split_reader import Split
from services.store.formats.index_service import IndexService
from services.store.formats.java_hash import index_key_hash_fast
from services.store.formats.message import (
    KEY_SEPARATOR,
    PROPERTY_DELAY_TIME_LEVEL,
    SCHEDULE_TOPIC,
    TRANSACTION_ROLLBACK_TYPE,
    TRANSACTION_TYPE_MASK,
    MessageRecord,
    tags_code,
)
from services.store.formats.record import DispatchRequest, body_crc, dispatch_request_of
from services.store.rules.timer_message import PROPERTY_TIMER_OUT_MS, TIMER_TOPIC

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
    pa.field("delayed", pa.bool_()),
    pa.field("store_born", pa.bool_()),
]
SCHEMA = pa.schema(_FIELDS)
SPARK_SCHEMA = (
    "commitlog_offset BIGINT, store_size INT, topic STRING, queue_id INT, queue_offset BIGINT, sys_flag INT, "
    "tags_code BIGINT, crc_ok BOOLEAN, body_size INT, born_ms BIGINT, store_ms BIGINT, born_host STRING, "
    "keys ARRAY<STRING>, index_keys ARRAY<STRING>, index_hashes ARRAY<INT>, delayed BOOLEAN, store_born BOOLEAN")
#: Where the store parks delayed (DELAY level) and timer (TIMER_*) messages until they are due.
PARKING_TOPICS = (SCHEDULE_TOPIC, TIMER_TOPIC)
#: Properties a due message keeps when the scheduler re-puts it under its REAL_TOPIC (services/scheduler/timeup.py).
SCHEDULED_PROPERTIES = (PROPERTY_DELAY_TIME_LEVEL, PROPERTY_TIMER_OUT_MS)


def is_scheduled_delivery(topic: str, properties: dict[str, str]) -> bool:
    """A delayed or timer message delivered when due: its store time is its deliver time, so its store
    minus born time is the intended delay, not a latency. The parked copy (under a parking topic) was
    stored when it was sent, and is not one."""
    return topic not in PARKING_TOPICS and any(name in properties for name in SCHEDULED_PROPERTIES)


def _append_facts(columns: dict[str, list[Any]], offset: int, record: MessageRecord,
                  request: DispatchRequest) -> None:
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
    columns["delayed"].append(is_scheduled_delivery(record.topic, record.properties))
    columns["store_born"].append(record.born_host == record.store_host)


def record_facts_per_record(split: Split, summary: ScanSummary) -> pa.RecordBatch:
    """The facts of every record a split owns, record by record (the reference for
    :func:`record_facts`; a split is at most tens of MB of records and these rows are small, so one
    batch a split)."""
    columns: dict[str, list[Any]] = {name: [] for name in SCHEMA.names}
    for offset, record, request in decoded_records(split, summary, dispatch_request_of):
        _append_facts(columns, offset, record, request)
    return pa.RecordBatch.from_pydict(columns, schema=SCHEMA)


def _index_words(fast: FastRecords, uniq: Any, keys: Any) -> tuple[Any, np.ndarray, np.ndarray]:
    """Per record, the words the indexer indexes (its UNIQ_KEY, then its KEYS words) as a list array,
    empty for a rollback record; and the flat words' hashes of ``topic#word`` (IndexFile's key hash)."""
    n = fast.positions.size
    rollback = (fast.fields["sys_flag"] & TRANSACTION_TYPE_MASK) == TRANSACTION_ROLLBACK_TYPE
    keep = ~rollback
    uniq_valid = uniq.is_valid().to_numpy(zero_copy_only=False) & keep
    key_counts = pc.list_value_length(keys).to_numpy(zero_copy_only=False).astype(np.int64) * keep
    per_record = uniq_valid.astype(np.int64) + key_counts
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(per_record, out=offsets[1:])
    key_parents = pc.list_parent_indices(keys).to_numpy()
    key_kept = keep[key_parents]
    key_rank = np.arange(key_parents.size) - (np.cumsum(pc.list_value_length(keys).to_numpy(
        zero_copy_only=False)) - pc.list_value_length(keys).to_numpy(zero_copy_only=False))[key_parents]
    uniq_rows = np.flatnonzero(uniq_valid)
    word_rows = np.concatenate([uniq_rows, key_parents[key_kept]])
    at = np.concatenate([offsets[uniq_rows],
                         (offsets[:-1] + uniq_valid)[key_parents[key_kept]] + key_rank[key_kept]])
    combined = pa.concat_arrays([uniq.filter(pa.array(uniq_valid)),
                                 pc.list_flatten(keys).filter(pa.array(key_kept))])
    order = np.argsort(at, kind="stable")
    words = combined.take(pa.array(order))
    word_topics = fast.topic.take(pa.array(word_rows[order])).to_pylist()
    hashes = np.fromiter((index_key_hash_fast(t + "#" + w) for t, w in zip(word_topics, words.to_pylist(),
                                                                            strict=True)),
                         dtype=np.int32, count=len(words))
    return list_array(pa.array(offsets.astype(np.int32)), words), \
        np.asarray(offsets), hashes


def record_facts(split: Split, summary: ScanSummary) -> pa.RecordBatch:
    """The facts of every record a split owns, columnar (pipeline/columnar.py) for the common layout;
    records of the schedule topic (whose tags code depends on DELAY) and uncommon layouts take the
    per-record path. Rows are in commitlog order, equal to :func:`record_facts_per_record`'s."""
    for view, fast in walk_split(split, summary, False):
        f = fast.fields
        schedule = np.zeros(fast.positions.size, dtype=np.bool_)
        if fast.positions.size:
            schedule = pc.equal(fast.topic, SCHEDULE_TOPIC).to_numpy(zero_copy_only=False)
        slow_positions = sorted(fast.slow + fast.positions[schedule].tolist())
        columns: dict[str, list[Any]] = {name: [] for name in SCHEMA.names}
        decoded = decode_slow(view, split, slow_positions, summary)
        for offset, record in decoded:
            try:
                request = dispatch_request_of(record)
            except ValueError as exc:
                summary.bad_records[offset] = str(exc)
                continue
            _append_facts(columns, offset, record, request)
        slow_table = pa.Table.from_pydict(columns, schema=SCHEMA)
        rows = np.flatnonzero(~schedule)
        table = slow_table
        if rows.size:
            props = fast.properties
            tags = props.lookup("TAGS").take(pa.array(rows))
            encoded = pc.dictionary_encode(tags)
            codes = np.array([tags_code(t) for t in encoded.dictionary.to_pylist()] + [0], dtype=np.int64)
            tag_index = encoded.indices.fill_null(len(encoded.dictionary)).to_numpy()
            keys = keys_lists(props.lookup("KEYS")).take(pa.array(rows))
            uniq = props.lookup("UNIQ_KEY").take(pa.array(rows))
            sub = FastRecords(fast.positions[rows], {k: v[rows] for k, v in f.items()}, fast.body,
                              fast.topic.take(pa.array(rows)), props, [])
            index_keys, offsets, hashes = _index_words(sub, uniq, keys)
            sf = sub.fields
            delayed = pc.and_(pc.invert(pc.is_in(sub.topic, pa.array(PARKING_TOPICS))),
                              pc.or_(*(pc.is_valid(props.lookup(name).take(pa.array(rows)))
                                       for name in SCHEDULED_PROPERTIES)))
            fast_table = pa.Table.from_arrays([
                pa.array(sf["commitlog_offset"], pa.int64()), pa.array(sf["store_size"], pa.int32()), sub.topic,
                pa.array(sf["queue_id"], pa.int32()), pa.array(sf["queue_offset"], pa.int64()),
                pa.array(sf["sys_flag"], pa.int32()), pa.array(codes[tag_index], pa.int64()),
                pa.array(sf["crc_ok"]), pa.array(sf["body_size"], pa.int32()), pa.array(sf["born_ms"], pa.int64()),
                pa.array(sf["store_ms"], pa.int64()), host_strings(sf["born_host"]), keys, index_keys,
                list_array(pa.array(offsets.astype(np.int32)), pa.array(hashes, pa.int32())),
                delayed, pa.array(sf["born_host"] == sf["store_host"]),
            ], schema=SCHEMA)
            table = fast_table if not slow_table.num_rows else pa.concat_tables([fast_table, slow_table])
            if slow_table.num_rows:
                table = table.take(pc.sort_indices(table["commitlog_offset"]))
        good = [(offset, record) for offset, record in decoded if offset not in summary.bad_records]
        tally(split, summary, np.concatenate([fast.positions[rows] + split.file_offset,
                                              np.array([o for o, _ in good], dtype=np.int64)]),
              np.concatenate([f.get("store_size", np.empty(0, np.int64))[rows] if rows.size else
                              np.empty(0, np.int64), np.array([r.store_size for _, r in good], dtype=np.int64)]))
        return table.combine_chunks().to_batches()[0] if table.num_rows else pa.RecordBatch.from_pydict(
            {name: [] for name in SCHEMA.names}, schema=SCHEMA)
    raise AssertionError("walk_split yields once")


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
