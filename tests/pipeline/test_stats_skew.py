"""stats on real data: producers with wrong clocks are reported and kept out of the latency figures."""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow.parquet as pq
from pyspark.sql import SparkSession

from pipeline.stats import stats
from services.commitlog.message_store import MessageStore
from services.store.config import load_config
from services.store.formats.message import Message

YEAR_MS = 365 * 86_400_000


def write_skewed_store(root: Path) -> None:
    """200 messages born a few ms before they are stored, 10 from a producer whose clock is three
    years behind and 5 from one two days ahead."""
    log = MessageStore(load_config(environ={}, mapped_file_size_commit_log=64 * 1024), root)
    log.start()
    try:
        for i in range(215):
            now = int(time.time() * 1000)
            born, host = (now - 3 * YEAR_MS, "10.0.0.9:4001") if i % 20 == 7 and i < 200 else \
                (now + 2 * 86_400_000, "10.0.0.8:4002") if i >= 210 else (now - i % 5, "10.0.0.1:4000")
            log.put_messages([Message(topic=("Orders", "Audit")[i % 2], queue_id=0, body=b"x" * 50,
                                      properties={"KEYS": f"k{i}"}, born_timestamp=born, born_host=host)])
    finally:
        log.shutdown()


def test_clock_skew_is_reported_and_left_out_of_latency(spark: SparkSession, tmp_path: Path) -> None:
    store = tmp_path / "store"
    write_skewed_store(store)
    result = stats(spark, store, tmp_path / "out", split_size=16 * 1024)
    assert result.records == 215
    assert result.skewed == 15
    rows = pq.read_table(tmp_path / "out" / "clock_skew").to_pylist()  # per topic and producer
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["born_host"]] = counts.get(row["born_host"], 0) + row["messages"]
    assert counts == {"10.0.0.9:4001": 10, "10.0.0.8:4002": 5}
    assert all(row["skew_max_ms"] < -2 * YEAR_MS for row in rows if row["born_host"] == "10.0.0.9:4001")
    assert all(row["skew_min_ms"] > 86_400_000 for row in rows if row["born_host"] == "10.0.0.8:4002")
    per_minute = pq.read_table(tmp_path / "out" / "per_minute").to_pylist()
    assert sum(row["messages"] for row in per_minute) == 215
    assert sum(row["skewed"] for row in per_minute) == 15
    # Without the skewed records, latency is what the store measured: well under a minute.
    assert all(-1000 <= row["latency_p50_ms"] <= row["latency_p99_ms"] <= row["latency_p999_ms"]
               <= row["latency_max_ms"] < 60_000 for row in per_minute)
    summary = pq.read_table(tmp_path / "out" / "latency_summary").to_pylist()[0]
    assert summary["skewed"] == 15 and summary["skew_limit_ms"] == 3_600_000
    assert 0 <= summary["latency_clip_ms"] < 60_000
    page = (tmp_path / "out" / "report" / "index.html").read_text()
    assert "Clock skew" in page and "10.0.0.9:4001" in page and "10.0.0.8:4002" in page
    assert (tmp_path / "out" / "report" / "latency.png").read_bytes().startswith(b"\x89PNG")


def test_skew_limit_is_a_setting(spark: SparkSession, tmp_path: Path) -> None:
    """A limit above the skew counts nothing as skewed: the latencies then span years."""
    store = tmp_path / "store"
    write_skewed_store(store)
    result = stats(spark, store, tmp_path / "out", split_size=16 * 1024, skew_limit_ms=10 * YEAR_MS)
    assert result.skewed == 0
    per_minute = pq.read_table(tmp_path / "out" / "per_minute").to_pylist()
    assert max(row["latency_max_ms"] for row in per_minute) > 2 * YEAR_MS
