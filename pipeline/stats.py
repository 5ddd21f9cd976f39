"""``stats``: per topic and minute, message counts, bytes, sizes, store-minus-born latency, top keys
and producers. Written as Parquet tables (for further queries) plus ``report/index.html`` with PNG
charts (for people).

Real stores hold messages from producers whose clocks are wrong (born times years away from the
store's clock): their store-minus-born "latency" says nothing about latency and, left in, makes every
percentile and chart unreadable. A record whose born time is more than ``--skew-limit-ms`` (default
one hour) away from its store time is **clock-skewed**: counted per minute (``skewed``), listed per
producer in the ``clock_skew`` table and the report, and left out of the latency columns. The
latency chart is clipped at the p99.9 of the remaining latencies (``latency_summary``).

A delayed or timer message re-put when due (pipeline/records.py, ``delayed``) was born when it was
sent and stored when it was due: its store-minus-born time is the delay it asked for. Such records are
counted per minute (``delayed``) and left out of the latency columns too. Top producers are born
hosts without the port (a producer's connections each have their own ephemeral port), and leave out
the records the store wrote itself (born at its own address: transaction op records).

For a local OUT the Python workers reduce each split to partial aggregates and the driver writes the
tables (pipeline/stats_partials.py: one Spark job); other outputs, or ``workers=False``, take the
DataFrame path below, which is also the reference the workers' tables are tested against.

Run as ``mqstore pipeline stats STORE OUT`` or ``spark-submit pipeline/stats.py STORE OUT``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.failures import run_job
from pipeline.fs import parse_location
from pipeline.records import records_frame
from pipeline.scan import StoreInput, splits_rdd
from pipeline.split_reader import DEFAULT_SPLIT_SIZE
from pipeline.stats_partials import CHART_CLIP_PERCENTILE, PERCENTILES, TOP_N
from services.store.formats.geometry import GeometryOptions, add_geometry_arguments, options_of

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import DataFrame, SparkSession

SKEW_LIMIT_MS = 3_600_000


@dataclass(frozen=True)
class StatsResult:
    records: int
    tables: dict[str, str]
    report: Path
    skewed: int = 0  # records whose born time is off by more than the skew limit


def stats_tables(records: DataFrame, skew_limit_ms: int = SKEW_LIMIT_MS) -> dict[str, DataFrame]:
    """The statistics as DataFrames, by table name. Latency columns leave clock-skewed and delayed records out."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    raw_latency = F.col("store_ms") - F.col("born_ms")
    skewed = F.abs(raw_latency) > F.lit(skew_limit_ms)
    facts = records.withColumn("minute", F.timestamp_millis(F.expr("store_ms - pmod(store_ms, 60000)"))) \
        .withColumn("skewed", skewed) \
        .withColumn("latency_ms", F.when(~F.col("skewed") & ~F.col("delayed"), raw_latency))
    size_pct = F.percentile_approx("store_size", list(PERCENTILES))
    latency_pct = F.percentile_approx("latency_ms", list(PERCENTILES))
    per_minute = facts.groupBy("topic", "minute").agg(
        F.count("*").alias("messages"), F.sum("store_size").alias("bytes"), F.sum("body_size").alias("body_bytes"),
        F.min("store_size").alias("size_min"), size_pct.alias("size_pct"), F.max("store_size").alias("size_max"),
        latency_pct.alias("latency_pct"), F.max("latency_ms").alias("latency_max_ms"),
        F.sum(F.col("skewed").cast("long")).alias("skewed"), F.sum(F.col("delayed").cast("long")).alias("delayed"),
    ).select("topic", "minute", "messages", "bytes", "body_bytes", "size_min",
             F.col("size_pct")[0].alias("size_p50"), F.col("size_pct")[1].alias("size_p90"),
             F.col("size_pct")[2].alias("size_p99"), "size_max",
             F.col("latency_pct")[0].alias("latency_p50_ms"), F.col("latency_pct")[1].alias("latency_p90_ms"),
             F.col("latency_pct")[2].alias("latency_p99_ms"), F.col("latency_pct")[3].alias("latency_p999_ms"),
             "latency_max_ms", "skewed", "delayed")
    # Sizes in power-of-two buckets: bucket b holds sizes in [2^b, 2^(b+1)).
    size_histogram = facts.groupBy("topic", F.floor(F.log2("store_size")).cast("int").alias("bucket")) \
        .count().withColumn("size_from", F.pow(F.lit(2), F.col("bucket")).cast("long"))
    by_topic = Window.partitionBy("topic").orderBy(F.desc("count"), F.asc("name"))
    top_keys = facts.select("topic", F.explode("keys").alias("name")).groupBy("topic", "name").count() \
        .withColumn("rank", F.row_number().over(by_topic)).where(F.col("rank") <= TOP_N)
    born_ip = F.regexp_replace("born_host", r":[0-9]+$", "")
    top_producers = facts.where(~F.col("store_born")).groupBy("topic", born_ip.alias("name")).count() \
        .withColumn("rank", F.row_number().over(by_topic)).where(F.col("rank") <= TOP_N)
    # skew_ms > 0: the producer's clock is ahead of the store's.
    skew = F.col("born_ms") - F.col("store_ms")
    clock_skew = facts.where("skewed").groupBy("topic", "born_host").agg(
        F.count("*").alias("messages"), F.min(skew).alias("skew_min_ms"), F.percentile_approx(skew, 0.5)
        .alias("skew_p50_ms"), F.max(skew).alias("skew_max_ms"),
        F.timestamp_millis(F.min("store_ms")).alias("first_store_time"),
        F.timestamp_millis(F.max("store_ms")).alias("last_store_time"))
    latency_summary = facts.agg(
        F.count("*").alias("messages"), F.sum(F.col("skewed").cast("long")).alias("skewed"),
        F.sum(F.col("delayed").cast("long")).alias("delayed"), F.lit(skew_limit_ms).cast("long").alias("skew_limit_ms"),
        F.percentile_approx("latency_ms", CHART_CLIP_PERCENTILE).alias("latency_clip_ms"),
        F.min("latency_ms").alias("latency_min_ms"), F.max("latency_ms").alias("latency_max_ms"))
    return {"per_minute": per_minute, "size_histogram": size_histogram, "top_keys": top_keys,
            "top_producers": top_producers, "clock_skew": clock_skew, "latency_summary": latency_summary}


def stats(spark: SparkSession, store: str | Path | StoreInput, output: str | Path,
          split_size: int = DEFAULT_SPLIT_SIZE, geometry: GeometryOptions | None = None,
          skew_limit_ms: int = SKEW_LIMIT_MS, workers: bool = True) -> StatsResult:
    """The tables and the report of a store. ``workers``: reduce in the Python workers where the
    output is local (else, and with False, the DataFrame path)."""
    from pipeline.report import write_report

    out = Path(output)
    source = StoreInput.open(store, geometry)
    local = parse_location(str(output)).local
    if workers and local is not None:
        frames = _worker_tables(spark, source, local, split_size, skew_limit_ms)
        paths = {name: str(local / name) for name in frames}
        out = local
    else:
        paths, frames = _frame_tables(spark, source, out, split_size, skew_limit_ms)
    summary = frames["latency_summary"]
    count = int(summary["messages"].iloc[0]) if len(summary) else 0  # every record, as a count() would say
    report = write_report(out / "report", str(source.layout.root), count, frames)
    skewed = int(frames["latency_summary"]["skewed"].fillna(0).iloc[0]) if len(frames["latency_summary"]) else 0
    return StatsResult(count, paths, report, skewed)


def _worker_tables(spark: SparkSession, source: StoreInput, out: Path, split_size: int,
                   skew_limit_ms: int) -> dict[str, pd.DataFrame]:
    """Each split reduced by its task, merged and written here: the tables as pandas frames."""
    from pipeline.stats_partials import (
        merge_partials,
        pandas_frames,
        split_partials,
        stats_tables,
        write_spark_table,
    )

    reduce = partial(split_partials, skew_limit_ms=skew_limit_ms)
    parts = splits_rdd(spark, source.plan(split_size)).map(reduce).collect()
    tables = stats_tables(merge_partials(parts), skew_limit_ms)
    for name, table in tables.items():
        write_spark_table(out / name, table)
    return pandas_frames(tables)


def _frame_tables(spark: SparkSession, source: StoreInput, out: Path, split_size: int, skew_limit_ms: int
                  ) -> tuple[dict[str, str], dict[str, pd.DataFrame]]:
    records, _ = records_frame(spark, source, split_size)
    records = records.cache()  # decoded by the first table's job, read from memory by the others
    tables = stats_tables(records, skew_limit_ms)
    paths: dict[str, str] = {}
    frames = {}
    for name, frame in tables.items():
        paths[name] = str(out / name)
        frame.write.mode("overwrite").parquet(paths[name])
        # With the schema it was written with: no job reading the files' footers to infer it.
        frames[name] = spark.read.schema(frame.schema).parquet(paths[name]).toPandas()
    records.unpersist()
    return paths, frames


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("store", help="a store root or its commitlog directory")
    parser.add_argument("output", help="output directory: Parquet tables and report/index.html")
    parser.add_argument("--split-size", type=int, default=DEFAULT_SPLIT_SIZE, help="bytes per task")
    parser.add_argument("--skew-limit-ms", type=_positive_ms, default=SKEW_LIMIT_MS,
                        help="a born time further than this from the store time is producer clock skew: "
                             f"reported, and left out of the latency figures (default {SKEW_LIMIT_MS}, one hour)")
    parser.add_argument("--master", default=None, help="Spark master (default local[*])")
    add_geometry_arguments(parser, commitlog=True)


def _positive_ms(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of milliseconds") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} must be a positive number of milliseconds")
    return value


def run(args: argparse.Namespace) -> int:
    return run_job("mqstore pipeline stats", _run, args)


def _run(args: argparse.Namespace) -> int:
    from pipeline.session import get_session

    source = StoreInput.open(args.store, options_of(args))
    source.commitlog_files()  # a store that cannot be read is refused before Spark starts
    result = stats(get_session(args.master), source, args.output, args.split_size,
                   skew_limit_ms=args.skew_limit_ms)
    print(f"{result.records} records; tables {', '.join(sorted(result.tables))} in {args.output}; "
          f"report {result.report}")
    if result.skewed:
        print(f"clock skew: {result.skewed} records born more than {args.skew_limit_ms} ms away from their store "
              f"time (left out of the latency figures; per producer in {Path(args.output) / 'clock_skew'})")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mqstore pipeline stats", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    # Through the package, so workers import the job's functions instead of unpickling __main__'s copies.
    from pipeline.stats import main as package_main

    sys.exit(package_main())
