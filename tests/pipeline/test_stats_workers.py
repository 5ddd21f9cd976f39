"""stats reduced in the Python workers writes the DataFrame path's tables, row for row, in the same schema."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
from pyspark.sql import SparkSession

from pipeline.stats import stats
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

