"""stats reduced in the Python workers writes the DataFrame path's tables, row for row, in the same schema."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
from pyspark.sql import SparkSession

from pipeline.stats import stats
from pipeline.stats_partials import merge_partials, stats_tables
from tests.conftest import StoreFactory
from tests.pipeline.test_stats_skew import write_skewed_store

TABLES = ("clock_skew", "latency_summary", "per_minute", "size_histogram", "top_keys", "top_producers")


def _rows(directory: Path) -> tuple[str, list[tuple[object, ...]]]:
    table = pq.read_table(directory)
    rows = [tuple(row.values()) for row in table.to_pylist()]
    return table.schema.remove_metadata().to_string(), sorted(rows, key=repr)


def _assert_same_tables(spark: SparkSession, store: Path, tmp_path: Path, split_size: int) -> None:
    new = stats(spark, store, tmp_path / "workers", split_size=split_size)
    old = stats(spark, store, tmp_path / "frames", split_size=split_size, workers=False)
    assert (new.records, new.skewed) == (old.records, old.skewed)
    assert sorted(new.tables) == sorted(TABLES)
    for name in TABLES:
        assert _rows(Path(new.tables[name])) == _rows(Path(old.tables[name])), name
        assert (Path(new.tables[name]) / "_SUCCESS").exists()
    # The same report, but for the order of rows that tie (Spark's is its shuffle's).
    new_page = (tmp_path / "workers" / "report" / "index.html").read_text()
    old_page = (tmp_path / "frames" / "report" / "index.html").read_text()
    assert sorted(new_page.split("<tr>")) == sorted(old_page.split("<tr>"))


def test_worker_tables_match_on_a_clock_skewed_store(spark: SparkSession, tmp_path: Path) -> None:
    """Several splits (merged by the driver), skewed producers, keys that tie for the top ranks."""
    store = tmp_path / "store"
    write_skewed_store(store)
    _assert_same_tables(spark, store, tmp_path, 16 * 1024)


def test_worker_tables_match_on_the_fixture_store(spark: SparkSession, pristine_store: StoreFactory,
                                                  tmp_path: Path) -> None:
    _assert_same_tables(spark, pristine_store("normal-raw"), tmp_path, 200_000)



def test_a_store_without_splits_has_the_tables_of_no_records() -> None:
    """As Spark aggregates no rows: empty groupings, one summary row counting 0 with null sums."""
    tables = stats_tables(merge_partials([]), 1000)
    assert {name: tables[name].num_rows for name in TABLES} == {
        "clock_skew": 0, "latency_summary": 1, "per_minute": 0, "size_histogram": 0, "top_keys": 0, "top_producers": 0}
    assert tables["latency_summary"].to_pylist() == [{
        "messages": 0, "skewed": None, "delayed": None, "skew_limit_ms": 1000, "latency_clip_ms": None,
        "latency_min_ms": None, "latency_max_ms": None}]
