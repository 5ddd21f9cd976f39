"""The stats job's HTML report: a few PNG charts (matplotlib, no display needed) and small tables.

The per-topic charts show the application topics with the most volume (messages; bytes for the bytes
chart), at most :data:`MAX_TOPICS_IN_CHARTS`: the broker's own topics (system topics such as
SCHEDULE_TOPIC_XXXX and the transaction half topics, and the consumer groups' %RETRY% and %DLQ%
topics) are left out of the charts and listed in the Topics table only. A per-minute line has a point
for every minute of the store's time range and breaks where the topic stored nothing.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import TYPE_CHECKING

from services.store.rules.names import is_group_topic, is_system_topic

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

MAX_TOPICS_IN_CHARTS = 8


def _figure() -> tuple[Figure, Axes]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 3.6), dpi=100)
    ax.grid(True, alpha=0.3)
    return fig, ax


def _save(fig: Figure, path: Path) -> str:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path.name


def topic_kind(topic: str) -> str:
    """``system`` (the broker's flows), ``group`` (a consumer group's retry or dead-letter topic) or
    ``application``."""
    return "system" if is_system_topic(topic) else "group" if is_group_topic(topic) else "application"


def _application(per_minute: pd.DataFrame) -> pd.DataFrame:
    return per_minute[[topic_kind(str(t)) == "application" for t in per_minute["topic"]]]


def _top_topics(per_minute: pd.DataFrame, column: str = "messages") -> list[str]:
    """The application topics with the largest total ``column``, largest first (ties by name)."""
    totals = _application(per_minute).groupby("topic")[column].sum()
    ranked = sorted(totals.items(), key=lambda item: (-item[1], str(item[0])))
    return [str(t) for t, _ in ranked[:MAX_TOPICS_IN_CHARTS]]


def _topics_note(per_minute: pd.DataFrame, shown: list[str], column: str) -> str:
    applications = _application(per_minute)["topic"].nunique()
    return f"top {len(shown)} of {applications} application topics by {column}"


def _minute_series(per_minute: pd.DataFrame, topic: str, column: str) -> pd.Series:
    """``column`` of ``topic`` for every minute from the store's first to its last, NaN where the topic
    stored nothing, so a plotted line breaks there instead of joining across the gap."""
    import pandas as pd

    minutes = pd.date_range(per_minute["minute"].min(), per_minute["minute"].max(), freq="60s")
    rows = per_minute[per_minute["topic"] == topic].set_index("minute")[column]
    return rows.reindex(minutes).astype("float64")


def _legend(ax: Axes, fontsize: int = 8) -> None:
    """Beside the plot, never over it: a legend inside may hide the very gap or spike to be seen."""
    ax.legend(fontsize=fontsize, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)


def _time_axis(ax: Axes) -> None:
    import matplotlib.dates as mdates

    ax.xaxis.set_major_formatter(mdates.DateFormatter("%m-%d %H:%M"))  # type: ignore[no-untyped-call]


def _line_chart(per_minute: pd.DataFrame, column: str, title: str, ylabel: str, path: Path) -> str:
    fig, ax = _figure()
    if per_minute["minute"].nunique() == 1:  # one minute: a line has nothing to show, bars per topic do
        totals = per_minute.groupby("topic")[column].sum().sort_values()
        ax.barh([str(t) for t in totals.index], totals.to_numpy())
        ax.set_title(f"{title} ({per_minute['minute'].iloc[0]:%Y-%m-%d %H:%M} UTC)")
        ax.set_xlabel(ylabel)
        return _save(fig, path)
    _time_axis(ax)
    topics = _top_topics(per_minute, column)
    for topic in topics:
        series = _minute_series(per_minute, topic, column)
        ax.plot(series.index, series.to_numpy(), marker="o", markersize=3, label=topic)
    ax.set_title(f"{title} ({_topics_note(per_minute, topics, column)})")
    ax.set_ylabel(ylabel)
    ax.set_xlabel("store time (UTC, per minute)")
    _legend(ax)
    fig.autofmt_xdate()
    return _save(fig, path)


def _latency_chart(per_minute: pd.DataFrame, summary: pd.DataFrame | None, path: Path) -> str:
    """p50/p99 per minute of store minus born time, clock-skewed and delayed records left out
    (pipeline/stats.py), the axis clipped at the p99.9 of all latencies so one outlier minute does not
    flatten the rest."""
    fig, ax = _figure()
    _time_axis(ax)
    for topic in _top_topics(per_minute):
        p50 = _minute_series(per_minute, topic, "latency_p50_ms")
        p99 = _minute_series(per_minute, topic, "latency_p99_ms")
        line = ax.plot(p50.index, p50.to_numpy(), marker="o", markersize=3, label=f"{topic} p50")[0]
        ax.plot(p99.index, p99.to_numpy(), linestyle="--", color=line.get_color(), label=f"{topic} p99")
    title = "Store minus born time"
    if summary is not None and len(summary) and summary["latency_clip_ms"].notna().iloc[0]:
        clip = float(summary["latency_clip_ms"].iloc[0])
        low = min(float(summary["latency_min_ms"].iloc[0]), 0.0)
        ax.set_ylim(low - 0.05 * (clip - low + 1), clip + 0.05 * (clip - low + 1))
        title += f" (axis clipped at p99.9 = {clip:,.0f} ms"
        left_out = [f"{int(summary[name].iloc[0])} {what}" for name, what in (
            ("skewed", "clock-skewed"), ("delayed", "delayed")) if name in summary and int(summary[name].iloc[0])]
        title += f"; {' and '.join(left_out)} records left out)" if left_out else ")"
    ax.set_title(title)
    ax.set_ylabel("latency (ms)")
    ax.set_xlabel("store time (UTC, per minute)")
    _legend(ax, fontsize=7)
    fig.autofmt_xdate()
    return _save(fig, path)


def _histogram_chart(histogram: pd.DataFrame, topics: list[str], note: str, path: Path) -> str:
    fig, ax = _figure()
    histogram = histogram[histogram["topic"].isin(topics)]
    buckets = sorted(int(b) for b in histogram["bucket"].unique())
    width = 0.8 / max(len(topics), 1)
    for i, topic in enumerate(topics):
        rows = histogram[histogram["topic"] == topic].set_index("bucket")["count"]
        ax.bar([b + i * width for b in buckets], [int(rows.get(b, 0)) for b in buckets], width=width, label=topic)
    ax.set_xticks([b + 0.4 - width / 2 for b in buckets], [_size_label(2 ** b) for b in buckets])
    ax.set_title(f"Stored record sizes ({note})")
    ax.set_xlabel("size from (bytes, power-of-two buckets)")
    ax.set_ylabel("messages")
    ax.set_yscale("log")
    _legend(ax)
    return _save(fig, path)


def _top_chart(top: pd.DataFrame, title: str, path: Path) -> str:
    fig, ax = _figure()
    overall = top.groupby("name")["count"].sum().sort_values().tail(15)
    ax.barh([str(n) for n in overall.index], overall.to_numpy())
    ax.set_title(title)
    ax.set_xlabel("messages")
    return _save(fig, path)


def _size_label(value: int) -> str:
    for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if value >= size:
            return f"{value // size} {unit}"
    return f"{value} B"


def _table(frame: pd.DataFrame, columns: list[str], limit: int = 50) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    rows = "".join("<tr>" + "".join(f"<td>{html.escape(str(row[c]))}</td>" for c in columns) + "</tr>"
                   for _, row in frame.head(limit).iterrows())
    return f"<table><tr>{head}</tr>{rows}</table>"


def write_report(directory: Path, store: str, records: int, frames: dict[str, pd.DataFrame]) -> Path:
    """Write ``directory/index.html`` and its PNG charts; returns the HTML path."""
    directory.mkdir(parents=True, exist_ok=True)
    per_minute = frames["per_minute"]
    charts: list[tuple[str, str]] = []
    if len(per_minute):
        top = _top_topics(per_minute)
        charts += [
            ("Messages per minute", _line_chart(per_minute, "messages", "Messages per minute", "messages",
                                                directory / "messages_per_minute.png")),
            ("Bytes per minute", _line_chart(per_minute, "bytes", "Stored bytes per minute", "bytes",
                                             directory / "bytes_per_minute.png")),
            ("Latency", _latency_chart(per_minute, frames.get("latency_summary"), directory / "latency.png")),
            ("Sizes", _histogram_chart(frames["size_histogram"], top, _topics_note(per_minute, top, "messages"),
                                       directory / "sizes.png")),
        ]
    if len(frames["top_keys"]):
        charts.append(("Top keys", _top_chart(frames["top_keys"], "Top keys (all topics)", directory / "top_keys.png")))
    if len(frames["top_producers"]):
        charts.append(("Top producers", _top_chart(frames["top_producers"],
                                                   "Top producers (born host; the store's own records left out)",
                                                   directory / "top_producers.png")))
    totals = per_minute.groupby("topic").agg(messages=("messages", "sum"), bytes=("bytes", "sum"),
                                             minutes=("minute", "count")).reset_index() \
        .sort_values("messages", ascending=False) if len(per_minute) else per_minute
    if len(totals):
        totals["kind"] = [topic_kind(str(t)) for t in totals["topic"]]
    body = [f"<h1>Store statistics</h1><p>{html.escape(store)}: {records} records.</p>"]
    if len(per_minute):
        body.append("<h2>Topics</h2>" + _table(totals, ["topic", "kind", "messages", "bytes", "minutes"]))
    body += [f'<h2>{html.escape(title)}</h2><img src="{html.escape(name)}" alt="{html.escape(title)}">'
             for title, name in charts]
    skew = frames.get("clock_skew")
    if skew is not None and len(skew):
        limit = int(frames["latency_summary"]["skew_limit_ms"].iloc[0])
        body.append(f"<h2>Clock skew</h2><p>{int(skew['messages'].sum())} records were born more than {limit:,} ms "
                    "away from their store time: the producer's clock is wrong (skew = born minus store time, "
                    "positive when the producer is ahead). They are left out of the latency figures.</p>"
                    + _table(skew.sort_values("messages", ascending=False), [
                        "topic", "born_host", "messages", "skew_min_ms", "skew_p50_ms", "skew_max_ms",
                        "first_store_time", "last_store_time"]))
    if len(per_minute):
        columns = ["topic", "minute", "messages", "bytes", "size_p50", "size_p99", "latency_p50_ms", "latency_p99_ms"]
        body.append("<h2>Per minute</h2>" + _table(per_minute.sort_values(["minute", "topic"]), columns + [
            c for c in ("skewed", "delayed") if c in per_minute.columns]))
    style = ("body{font-family:sans-serif;margin:2em;max-width:1000px}table{border-collapse:collapse;"
             "font-size:13px}td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}img{max-width:100%}")
    page = (f"<!doctype html><html><head><meta charset='utf-8'><title>mqstore stats</title><style>{style}"
            f"</style></head><body>{''.join(body)}</body></html>\n")
    path = directory / "index.html"
    path.write_text(page, encoding="utf-8")
    return path
