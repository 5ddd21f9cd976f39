"""``stats`` reduced in the Python workers: each task turns its split's record facts into small partial
aggregates (counts and sums per topic and minute, value counts for the percentiles, key and producer
counts), the driver merges them and writes the tables with pyarrow in Spark's Parquet layout. One Spark
job instead of a job per table and per shuffle; the tables are those of the DataFrame path
(pipeline/stats.py ``stats_tables``), row for row.

Percentiles are nearest-rank (the ``ceil(p * n)``-th smallest value), computed from exact value counts:
what ``percentile_approx`` answers for groups of up to 5,000 values, and within its 0.01 % rank error
beyond.
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.records import SCHEMA, record_facts
from pipeline.scan import ScanSummary
from pipeline.split_reader import Split

TOP_N = 10
PERCENTILES = (0.5, 0.9, 0.99, 0.999)
CHART_CLIP_PERCENTILE = 0.999

_MINUTE = ["topic", "minute_ms"]
_TYPES: dict[str, pa.DataType] = {"string": pa.string(), "int": pa.int32(), "long": pa.int64(),
                                  "timestamp": pa.timestamp("us", tz="UTC")}


def _schema(spec: str) -> pa.Schema:
    """``name type`` pairs, comma-separated; ``type!`` for a column Spark writes as not null."""
    fields: list[pa.Field[Any]] = []
    for item in spec.split(","):
        name, kind = item.split()
        fields.append(pa.field(name, _TYPES[kind.rstrip("!")], nullable=not kind.endswith("!")))
    return pa.schema(fields)


#: The tables as Spark writes them (types and nullability of the DataFrame path's columns).
SCHEMAS: dict[str, pa.Schema] = {
    "per_minute": _schema(
        "topic string, minute timestamp, messages long!, bytes long, body_bytes long, size_min int, size_p50 int, "
        "size_p90 int, size_p99 int, size_max int, latency_p50_ms long, latency_p90_ms long, latency_p99_ms long, "
        "latency_p999_ms long, latency_max_ms long, skewed long, delayed long"),
    "size_histogram": _schema("topic string, bucket int, count long!, size_from long"),
    "top_keys": _schema("topic string, name string, count long!, rank int!"),
    "top_producers": _schema("topic string, name string, count long!, rank int!"),
    "clock_skew": _schema("topic string, born_host string, messages long!, skew_min_ms long, skew_p50_ms long, "
                          "skew_max_ms long, first_store_time timestamp, last_store_time timestamp"),
    "latency_summary": _schema("messages long!, skewed long, delayed long, skew_limit_ms long!, latency_clip_ms long, "
                               "latency_min_ms long, latency_max_ms long"),
}


@dataclass(frozen=True)
class Partials:
    """A split's (or, merged, the store's) statistics before percentiles and ranks: Arrow tables of
    group keys and counts, small next to the records."""

    minutes: pa.Table     # topic, minute_ms, messages, bytes, body_bytes, size_min, size_max, latency_max_ms, ...
    sizes: pa.Table       # topic, minute_ms, value (store size), count
    latencies: pa.Table   # topic, minute_ms, value (latency, skewed and delayed left out), count
    buckets: pa.Table     # topic, bucket, count
    keys: pa.Table        # topic, name, count
    producers: pa.Table   # topic, name (born host without port), count
    skews: pa.Table       # topic, born_host, messages, skew_min_ms, skew_max_ms, first/last store_ms
    skew_values: pa.Table  # topic, born_host, value (born minus store), count


def _table_of(columns: dict[str, Any]) -> pa.Table:
    return pa.table(columns)


def _count(table: pa.Table, keys: list[str]) -> pa.Table:
    return table.group_by(keys, use_threads=False).aggregate([([], "count_all")]).rename_columns(keys + ["count"])


def split_partials(split: Split, skew_limit_ms: int) -> Partials:
    """The task: a split's record facts (columnar decode) reduced to partial aggregates."""
    return facts_partials(pa.Table.from_batches([record_facts(split, ScanSummary())]), skew_limit_ms)


def facts_partials(facts: pa.Table, skew_limit_ms: int) -> Partials:
    """Record facts (pipeline/records.py's schema) reduced to partial aggregates."""
    store_ms = facts["store_ms"].to_numpy()
    raw_latency = store_ms - facts["born_ms"].to_numpy()
    skewed = np.abs(raw_latency) > skew_limit_ms
    delayed = facts["delayed"].to_numpy(zero_copy_only=False)
    latency_ok = ~skewed & ~delayed
    sizes = facts["store_size"].to_numpy()
    # Spark's floor(log2(x)): ln(x) / ln(2) in doubles, not the bit length, so edge sizes fall alike.
    bucket = np.floor(np.log(sizes.astype(np.float64)) / math.log(2)).astype(np.int32)
    base = _table_of({
        "topic": facts["topic"], "minute_ms": pa.array(store_ms - np.mod(store_ms, 60_000)),
        "store_size": facts["store_size"], "body_size": pa.array(facts["body_size"].to_numpy().astype(np.int64)),
        "latency": pa.array(raw_latency, mask=~latency_ok), "skewed": pa.array(skewed.astype(np.int64)),
        "delayed": pa.array(delayed.astype(np.int64)), "bucket": pa.array(bucket)})
    minutes = base.group_by(_MINUTE, use_threads=False).aggregate([
        ([], "count_all"), ("store_size", "sum"), ("body_size", "sum"), ("store_size", "min"),
        ("store_size", "max"), ("latency", "max"), ("skewed", "sum"), ("delayed", "sum")]).rename_columns(
        _MINUTE + ["messages", "bytes", "body_bytes", "size_min", "size_max", "latency_max_ms", "skewed", "delayed"])
    size_values = _count(base.select(_MINUTE + ["store_size"]).rename_columns(_MINUTE + ["value"]), _MINUTE + ["value"])
    with_latency = base.filter(pc.is_valid(base["latency"]))
    latency_values = _count(with_latency.select(_MINUTE + ["latency"]).rename_columns(_MINUTE + ["value"]),
                            _MINUTE + ["value"])
    buckets = _count(base.select(["topic", "bucket"]), ["topic", "bucket"])
    key_lists = facts["keys"].combine_chunks()
    words = _table_of({"topic": facts["topic"].take(pc.list_parent_indices(key_lists)),
                      "name": pc.list_flatten(key_lists)})
    keys = _count(words, ["topic", "name"])
    others = facts.filter(pc.invert(facts["store_born"]))
    producers = _count(_table_of({"topic": others["topic"],
                                 "name": pc.replace_substring_regex(others["born_host"], r":[0-9]+$", "")}),
                       ["topic", "name"])
    skewed_rows = np.flatnonzero(skewed)
    off = _table_of({"topic": facts["topic"].take(skewed_rows), "born_host": facts["born_host"].take(skewed_rows),
                    "skew": pa.array(-raw_latency[skewed_rows]), "store_ms": pa.array(store_ms[skewed_rows])})
    skews = off.group_by(["topic", "born_host"], use_threads=False).aggregate([
        ([], "count_all"), ("skew", "min"), ("skew", "max"), ("store_ms", "min"), ("store_ms", "max")]) \
        .rename_columns(["topic", "born_host", "messages", "skew_min_ms", "skew_max_ms", "first_ms", "last_ms"])
    skew_values = _count(off.select(["topic", "born_host", "skew"]).rename_columns(["topic", "born_host", "value"]),
                         ["topic", "born_host", "value"])
    return Partials(minutes, size_values, latency_values, buckets, keys, producers, skews, skew_values)


def _regroup(tables: list[pa.Table], keys: list[str], how: dict[str, str]) -> pa.Table:
    merged = pa.concat_tables(tables)
    names = list(how)
    aggregations: list[Any] = [(name, how[name]) for name in names]
    return merged.group_by(keys, use_threads=False).aggregate(aggregations) \
        .rename_columns(keys + names)


def merge_partials(parts: list[Partials]) -> Partials:
    """The store's partials from its splits' (a store without splits: those of no records)."""
    if not parts:
        parts = [facts_partials(SCHEMA.empty_table(), 0)]
    summed = {"count": "sum"}

    def values(field: str, keys: list[str]) -> pa.Table:
        return _regroup([getattr(p, field) for p in parts], keys, summed)

    minutes = _regroup([p.minutes for p in parts], _MINUTE, {
        "messages": "sum", "bytes": "sum", "body_bytes": "sum", "size_min": "min", "size_max": "max",
        "latency_max_ms": "max", "skewed": "sum", "delayed": "sum"})
    skews = _regroup([p.skews for p in parts], ["topic", "born_host"], {
        "messages": "sum", "skew_min_ms": "min", "skew_max_ms": "max", "first_ms": "min", "last_ms": "max"})
    return Partials(minutes, values("sizes", _MINUTE + ["value"]), values("latencies", _MINUTE + ["value"]),
                    values("buckets", ["topic", "bucket"]), values("keys", ["topic", "name"]),
                    values("producers", ["topic", "name"]), skews,
                    values("skew_values", ["topic", "born_host", "value"]))


def _percentiles(counts: pa.Table, keys: list[str], percentiles: tuple[float, ...]) -> dict[tuple[Any, ...], list[Any]]:
    """Per group, the nearest-rank value of each percentile (``percentile_approx``'s answer on an exact
    summary: the first value whose cumulative count reaches ``ceil(p * n)``). Vectorised over groups:
    a store has as many as topics times minutes."""
    if not counts.num_rows:
        return {}
    table = counts.sort_by([(key, "ascending") for key in keys + ["value"]])
    columns = [table[key].to_numpy(zero_copy_only=False) for key in keys]
    change = np.zeros(table.num_rows, dtype=np.bool_)
    change[0] = True
    for column in columns:
        change[1:] |= column[1:] != column[:-1]
    starts = np.flatnonzero(change)
    cumulative = np.cumsum(table["count"].to_numpy())
    before = np.where(starts > 0, cumulative[starts - 1], 0)
    totals = np.append(cumulative[starts[1:] - 1], cumulative[-1]) - before
    values = table["value"].to_numpy()
    picked = [values[np.searchsorted(cumulative, before + np.ceil(p * totals).astype(np.int64))].tolist()
              for p in percentiles]
    groups = zip(*(column[starts].tolist() for column in columns), strict=True)
    return {group: [column[i] for column in picked] for i, group in enumerate(groups)}


def _top(counts: pa.Table) -> pd.DataFrame:
    """The ``TOP_N`` names per topic by count (ties by name), ranked from 1."""
    frame = counts.to_pandas().sort_values(["topic", "count", "name"], ascending=[True, False, True], kind="stable")
    frame["rank"] = frame.groupby("topic", dropna=False).cumcount() + 1
    return frame[frame["rank"] <= TOP_N]


def stats_tables(merged: Partials, skew_limit_ms: int) -> dict[str, pa.Table]:
    """The six tables from the merged partials, in the schemas the DataFrame path writes."""
    minutes = merged.minutes.to_pandas()
    size_pct = _percentiles(merged.sizes, _MINUTE, PERCENTILES[:3])
    latency_pct = _percentiles(merged.latencies, _MINUTE, PERCENTILES)
    keys = list(zip(minutes["topic"], minutes["minute_ms"], strict=True))
    nothing: list[Any] = [None] * len(PERCENTILES)
    per_minute: dict[str, Any] = {
        "topic": minutes["topic"], "minute": (minutes["minute_ms"] * 1000).astype("int64"),
        "messages": minutes["messages"], "bytes": minutes["bytes"], "body_bytes": minutes["body_bytes"],
        "size_min": minutes["size_min"]}
    for i, name in enumerate(("size_p50", "size_p90", "size_p99")):
        per_minute[name] = [size_pct[k][i] for k in keys]
    per_minute["size_max"] = minutes["size_max"]
    for i, name in enumerate(("latency_p50_ms", "latency_p90_ms", "latency_p99_ms", "latency_p999_ms")):
        per_minute[name] = [latency_pct.get(k, nothing)[i] for k in keys]
    for name in ("latency_max_ms", "skewed", "delayed"):
        per_minute[name] = minutes[name]
    histogram = merged.buckets.to_pandas()
    histogram["size_from"] = 2 ** histogram["bucket"].astype("int64")
    skews = merged.skews.to_pandas()
    skew_p50 = _percentiles(merged.skew_values, ["topic", "born_host"], (0.5,))
    clock_skew = {
        "topic": skews["topic"], "born_host": skews["born_host"], "messages": skews["messages"],
        "skew_min_ms": skews["skew_min_ms"],
        "skew_p50_ms": [skew_p50[k][0] for k in zip(skews["topic"], skews["born_host"], strict=True)],
        "skew_max_ms": skews["skew_max_ms"], "first_store_time": skews["first_ms"] * 1000,
        "last_store_time": skews["last_ms"] * 1000}
    latencies = merged.latencies.group_by(["value"], use_threads=False).aggregate([("count", "sum")]) \
        .rename_columns(["value", "count"])
    has_latency = latencies.num_rows > 0
    clip = _nearest_rank(latencies, CHART_CLIP_PERCENTILE) if has_latency else None
    summary = {
        "messages": [int(pc.sum(merged.minutes["messages"]).as_py() or 0)],
        "skewed": [pc.sum(merged.minutes["skewed"]).as_py()], "delayed": [pc.sum(merged.minutes["delayed"]).as_py()],
        "skew_limit_ms": [skew_limit_ms], "latency_clip_ms": [clip],
        "latency_min_ms": [pc.min(latencies["value"]).as_py() if has_latency else None],
        "latency_max_ms": [pc.max(latencies["value"]).as_py() if has_latency else None]}
    return {
        "per_minute": _table(per_minute, "per_minute"),
        "size_histogram": _table({name: histogram[name] for name in ("topic", "bucket", "count", "size_from")},
                                 "size_histogram"),
        "top_keys": _table(_top(merged.keys), "top_keys"),
        "top_producers": _table(_top(merged.producers), "top_producers"),
        "clock_skew": _table(clock_skew, "clock_skew"), "latency_summary": _table(summary, "latency_summary")}


def _nearest_rank(counts: pa.Table, percentile: float) -> int:
    """The nearest-rank value of ``percentile`` over value counts (see :func:`_percentiles`)."""
    order = np.argsort(counts["value"].to_numpy(), kind="stable")
    values, cumulative = counts["value"].to_numpy()[order], np.cumsum(counts["count"].to_numpy()[order])
    return int(values[np.searchsorted(cumulative, math.ceil(percentile * int(cumulative[-1])))])


def pandas_frames(tables: dict[str, pa.Table]) -> dict[str, pd.DataFrame]:
    """The tables as ``toPandas`` gives them in a UTC session: timestamps without a zone."""
    frames = {}
    for name, table in tables.items():
        frame = table.to_pandas()
        for field in table.schema:
            if pa.types.is_timestamp(field.type):
                frame[field.name] = frame[field.name].dt.tz_localize(None)
        frames[name] = frame
    return frames


#: Row order of each table (Spark's is its shuffle's; these make reruns and reports stable).
_ORDER: dict[str, list[str]] = {"per_minute": ["minute", "topic"], "size_histogram": ["topic", "bucket"],
                                "top_keys": ["topic", "rank"], "top_producers": ["topic", "rank"],
                                "clock_skew": ["topic", "born_host"], "latency_summary": []}


def _table(columns: Any, name: str) -> pa.Table:
    schema = SCHEMAS[name]
    table = pa.table({field.name: pa.array(list(columns[field.name]), field.type, from_pandas=True)
                      for field in schema}, schema=schema)
    return table.sort_by([(key, "ascending") for key in _ORDER[name]]) if _ORDER[name] else table


def write_spark_table(directory: Path, table: pa.Table) -> None:
    """``table`` as Spark's ``write.mode("overwrite").parquet`` leaves it: the directory replaced by one
    ``part-00000-<uuid>-c000.snappy.parquet`` file and an empty ``_SUCCESS``."""
    if directory.exists():
        for child in directory.iterdir():
            child.unlink()
    directory.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, directory / f"part-00000-{uuid.uuid4()}-c000.snappy.parquet", compression="snappy")
    (directory / "_SUCCESS").touch()
