"""The stats report's charts on a store shaped like an operator's (tests/pipeline/chart_store.py): the
biggest application topics, gaps where nothing was stored, latency without intended delays, producers
by host without the store itself. One stats run for the module; the figures are caught before saving."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from matplotlib.figure import Figure
from pyspark.sql import SparkSession

from pipeline import report
from pipeline.records import record_facts, record_facts_per_record
from pipeline.scan import ScanSummary
from pipeline.split_reader import plan_splits
from pipeline.stats import stats
from services.store.formats.commitlog_walk import list_commitlog_files
from tests.pipeline.chart_store import (
    FILE_SIZE,
    MINUTES,
    PRODUCER_HOSTS,
    QUIET,
    TOPICS,
    ChartStore,
    write_chart_store,
)

APPLICATION_TOPICS = set(TOPICS)


@dataclass(frozen=True)
class ChartRun:
    store: ChartStore
    out: Path
    figures: dict[str, Figure]


@pytest.fixture(scope="module")
def chart_run(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChartRun]:
    directory = tmp_path_factory.mktemp("charts")
    store = write_chart_store(directory / "store")
    figures: dict[str, Figure] = {}

    def keep(fig: Figure, path: Path) -> str:
        figures[path.name] = fig
        return path.name

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(report, "_save", keep)
        stats(spark, store.root, directory / "out", split_size=1 << 20)
    yield ChartRun(store, directory / "out", figures)


def _legend(fig: Figure) -> list[str]:
    legend = fig.axes[0].get_legend()
    return [t.get_text() for t in legend.get_texts()] if legend else []


def _top(store: ChartStore, n: int = report.MAX_TOPICS_IN_CHARTS) -> set[str]:
    ranked = sorted(APPLICATION_TOPICS, key=lambda t: -store.messages[t])
    return set(ranked[:n])


def test_topic_charts_show_the_biggest_application_topics(chart_run: ChartRun) -> None:
    top = _top(chart_run.store)
    assert "TradeEvents" in top and "Accounts" not in top
    assert set(_legend(chart_run.figures["messages_per_minute.png"])) == top
    assert set(_legend(chart_run.figures["sizes.png"])) == top
    latency_topics = {label.rsplit(" ", 1)[0] for label in _legend(chart_run.figures["latency.png"])}
    assert latency_topics == top


def test_per_minute_lines_break_where_nothing_was_stored(chart_run: ChartRun) -> None:
    lines = {line.get_label(): line for line in chart_run.figures["messages_per_minute.png"].axes[0].get_lines()}
    trades = [float(y) for y in lines["TradeEvents"].get_ydata()]
    assert len(trades) == MINUTES
    assert [i for i, y in enumerate(trades) if math.isnan(y)] == list(QUIET)


def test_latency_leaves_out_scheduled_deliveries(chart_run: ChartRun) -> None:
    store = chart_run.store
    per_minute = pq.read_table(chart_run.out / "per_minute").to_pylist()
    assert sum(row["delayed"] for row in per_minute) == store.delayed > 0
    assert max(row["latency_max_ms"] for row in per_minute) == store.max_latency_ms < 1000
    summary = pq.read_table(chart_run.out / "latency_summary").to_pylist()[0]
    assert summary["delayed"] == store.delayed
    fig = chart_run.figures["latency.png"]
    highest = max(float(y) for line in fig.axes[0].get_lines() for y in line.get_ydata() if not math.isnan(y))
    assert highest < 1000
    assert f"{store.delayed} delayed" in fig.axes[0].get_title()


def test_top_producers_are_hosts_without_the_store(chart_run: ChartRun) -> None:
    rows = pq.read_table(chart_run.out / "top_producers").to_pylist()
    per_host: dict[str, int] = {}
    for row in rows:
        per_host[row["name"]] = per_host.get(row["name"], 0) + row["count"]
    assert per_host == chart_run.store.per_host
    fig = chart_run.figures["top_producers.png"]
    fig.canvas.draw()
    assert {t.get_text() for t in fig.axes[0].get_yticklabels()} == set(PRODUCER_HOSTS)


def test_both_decoders_tell_delayed_and_store_born_records_alike(chart_run: ChartRun) -> None:
    """The columnar facts (a property lookup) and the per-record ones (decoded properties) agree."""
    commitlog = chart_run.store.root / "commitlog"
    splits = plan_splits(commitlog, FILE_SIZE, files=list_commitlog_files(commitlog, FILE_SIZE))
    columnar = pa.Table.from_batches([record_facts(split, ScanSummary()) for split in splits])
    reference = pa.Table.from_batches([record_facts_per_record(split, ScanSummary()) for split in splits])
    for name in ("delayed", "store_born"):
        assert columnar[name].combine_chunks().equals(reference[name].combine_chunks()), name
    assert pc.sum(columnar["delayed"]).as_py() == chart_run.store.delayed
    assert pc.sum(columnar["store_born"]).as_py() == chart_run.store.store_born
