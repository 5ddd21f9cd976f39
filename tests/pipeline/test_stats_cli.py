"""stats: Parquet tables and an HTML report with PNG charts; the jobs through ``mqstore pipeline``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from pyspark.sql import SparkSession

from services.cli import main as mqstore_main
from tests.conftest import StoreFactory

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _spark_jobs(spark: SparkSession) -> int:
    return len(spark.sparkContext.statusTracker().getJobIdsForGroup(None))


def test_stats_tables_and_report(spark: SparkSession, pristine_store: StoreFactory, tmp_path: Path,
                                 dump_rows: Callable[..., list[dict[str, Any]]]) -> None:
    out = tmp_path / "stats"
    jobs_before = _spark_jobs(spark)
    code = mqstore_main(["pipeline", "stats", str(pristine_store("normal-raw")), str(out), "--split-size", "1048576"])
    assert code == 0
    # A small store's stats is fixed cost, every Spark job a scheduling round and a plan: the records are
    # decoded once (their count is in the tables) and each table is read back with the schema it was
    # written with (no job reading Parquet footers): one write and one read per table with the write's
    # shuffles, nothing else.
    assert _spark_jobs(spark) - jobs_before <= 22
    msgs = dump_rows("normal", "msg")
    per_minute = pq.read_table(out / "per_minute").to_pylist()
    assert sum(row["messages"] for row in per_minute) == 3000
    assert sum(row["bytes"] for row in per_minute) == sum(m["storeSize"] for m in msgs)
    by_topic: dict[str, int] = {}
    for m in msgs:
        by_topic[m["topic"]] = by_topic.get(m["topic"], 0) + 1
    counted: dict[str, int] = {}
    for row in per_minute:
        counted[row["topic"]] = counted.get(row["topic"], 0) + row["messages"]
        assert row["size_min"] <= row["size_p50"] <= row["size_p99"] <= row["size_max"]
        # The fixture's producer clock was about 3 years behind the broker's: every record is clock skew,
        # so no latency is made of them.
        assert row["skewed"] == row["messages"]
        assert row["latency_p50_ms"] is None and row["latency_max_ms"] is None
    assert counted == by_topic
    skew = pq.read_table(out / "clock_skew").to_pylist()
    assert {row["born_host"] for row in skew} == {"127.0.0.1:50000"}
    assert sum(row["messages"] for row in skew) == 3000
    assert all(-96_000_000_000 < row["skew_min_ms"] <= row["skew_max_ms"] < -95_000_000_000 for row in skew)
    top_keys = pq.read_table(out / "top_keys").to_pylist()
    assert all(row["rank"] <= 10 for row in top_keys)
    producers = pq.read_table(out / "top_producers").to_pylist()
    assert {row["name"] for row in producers} == {"127.0.0.1"}  # born hosts without their ports
    page = (out / "report" / "index.html").read_text()
    images = sorted((out / "report").glob("*.png"))
    assert len(images) == 6 and all(p.read_bytes().startswith(PNG_MAGIC) for p in images)
    assert all(f'src="{p.name}"' in page for p in images)


def test_export_and_verify_through_the_cli(spark: SparkSession, mqstore_store: Path, tmp_path: Path) -> None:
    assert mqstore_main(["pipeline", "export", str(mqstore_store), str(tmp_path / "out"), "--split-size", "8192"]) == 0
    assert len(pq.read_table(tmp_path / "out", partitioning="hive")) == 400
    # the commitlog alone: nothing is in a consume queue or the index, and verify says so
    assert mqstore_main(["pipeline", "verify", str(mqstore_store), "--report", str(tmp_path / "r.json")]) == 1

