"""The side-by-side table of ``make bench-peers`` (bench/peers.py): rows, goals, ratios, verdicts.

Kept apart from the harness so that the arithmetic (which figure a ratio divides, when a goal is met)
is tested without starting any server (tests/bench/test_peers_table.py). A row has one headline
metric: a rate (msgs/s or calls/s, higher is better) or a latency (p50/p99 in ms, lower is better);
its ratios are mqstore's headline figure over the peer's, so 1.0× means "as fast" for rates and
"as slow" for latencies.

Each row also stands against the floor of the stack (bench/peer_floor.py, a bare grpc.aio echo): a
per-call row against the unary echo at the same calls in flight (its p50 as a multiple of the echo's,
its rate as a fraction), a streamed or batched row against the streaming echo of the same bytes.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Metric = Literal["rate", "latency", "seconds"]


@dataclass(frozen=True)
class Measure:
    """One system's figure for a row, as measured (medians over the reps when there were several).

    ``failed`` counts operations that did not succeed (rejected, errors): they are never part of
    ``rate``, and a row with failures is not met whatever its rate.
    """

    rate: float | None = None  # operations (messages) per second
    p50_ms: float | None = None
    p99_ms: float | None = None
    seconds: float | None = None  # for "seconds" rows (recovery: s per GiB)
    mode: str = ""  # what ran, e.g. "SendBatch 256 (messages)" or "XADD pipelined 256"
    failed: int = 0
    ops: int = 0
    cpu_other: float | None = None  # cores used by processes not of the benchmark while it ran

    @classmethod
    def median(cls, reps: Sequence[Measure]) -> Measure:
        """Each field's median over the reps (mode of the first; failures summed)."""
        if not reps:
            raise ValueError("no reps to take the median of")

        def med(name: str) -> float | None:
            values = [v for r in reps if (v := getattr(r, name)) is not None and not math.isnan(v)]
            return statistics.median(values) if values else None

        return cls(rate=med("rate"), p50_ms=med("p50_ms"), p99_ms=med("p99_ms"), seconds=med("seconds"),
                   mode=reps[0].mode, failed=sum(r.failed for r in reps), ops=sum(r.ops for r in reps),
                   cpu_other=med("cpu_other"))


@dataclass(frozen=True)
class Goal:
    """The issue's goal for mqstore on one row; every given bound must hold."""

    min_rate: float | None = None
    min_vs_redis: float | None = None  # mqstore rate / Redis rate
    max_p50_ms: float | None = None
    max_p99_ms: float | None = None
    max_seconds: float | None = None
    max_vs_floor_p50: float | None = None  # mqstore p50 / the floor's p50 at the same calls in flight
    min_vs_floor_rate: float | None = None  # mqstore rate / the floor's rate
    text: str = ""

    def describe(self) -> str:
        if self.text:
            return self.text
        parts = []
        if self.min_vs_redis is not None:
            parts.append(f"≥ {self.min_vs_redis:g}× Redis")
        if self.min_rate is not None:
            parts.append(f"≥ {fmt_rate(self.min_rate)}/s")
        if self.max_p50_ms is not None:
            parts.append(f"p50 ≤ {self.max_p50_ms:g} ms")
        if self.max_p99_ms is not None:
            parts.append(f"p99 ≤ {self.max_p99_ms:g} ms")
        if self.max_seconds is not None:
            parts.append(f"≤ {self.max_seconds:g} s")
        if self.max_vs_floor_p50 is not None:
            parts.append(f"p50 ≤ {self.max_vs_floor_p50:g}× floor")
        if self.min_vs_floor_rate is not None:
            parts.append(f"≥ {self.min_vs_floor_rate:g}× floor rate")
        return ", ".join(parts) or "report"


@dataclass
class Row:
    """One line of the table: an operation, each system's figure, and mqstore's goal."""

    key: str  # for --only and JSON: e.g. "produce-batch256"
    group: str  # the --only name that selects it: produce, durable, latency, pull, get, key, time, engine, recovery
    operation: str
    metric: Metric
    goal: Goal
    mqstore: Measure | None = None
    redis: Measure | None = None
    nats: Measure | None = None
    floor_case: str | None = None  # which floor measurement (FLOOR_CASES) this row stands against
    floor: Measure | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def is_floor(self) -> bool:
        """The floor's own rows: their figure is in ``floor``, and they have no goal."""
        return self.group == "floor"

    def headline(self, measure: Measure | None) -> float | None:
        if measure is None:
            return None
        value = {"rate": measure.rate, "latency": measure.p50_ms, "seconds": measure.seconds}[self.metric]
        return None if value is None or math.isnan(value) else value

    def ratio(self, peer: Measure | None) -> float | None:
        """mqstore's headline figure over the peer's (None when either is missing or the peer's is 0)."""
        ours, theirs = self.headline(self.mqstore), self.headline(peer)
        if ours is None or theirs is None or theirs == 0:
            return None
        return ours / theirs

    def vs_floor(self) -> tuple[float | None, float | None]:
        """(mqstore p50 / floor p50, mqstore rate / floor rate); None where either figure is missing."""
        m, f = self.mqstore, self.floor
        if m is None or f is None or self.is_floor:
            return None, None
        p50 = m.p50_ms / f.p50_ms if m.p50_ms and f.p50_ms else None
        rate = m.rate / f.rate if m.rate and f.rate else None
        return p50, rate

    def verdict(self) -> tuple[bool | None, str]:
        """(met, why): None when mqstore was not measured or the goal needs a peer figure that is missing."""
        if self.is_floor:
            return None, "the floor"
        m = self.mqstore
        if m is None:
            return None, "not run"
        misses: list[str] = []
        goal = self.goal
        if m.failed:
            misses.append(f"{m.failed:,} failed")
        if goal.min_rate is not None:
            if m.rate is None:
                return None, "no rate"
            if m.rate < goal.min_rate:
                misses.append(f"{m.rate / goal.min_rate:.0%} of the rate")
        if goal.min_vs_redis is not None:
            ratio = self.ratio(self.redis) if self.metric == "rate" else None
            if ratio is None:
                return None, "no Redis figure"
            if ratio < goal.min_vs_redis:
                misses.append(f"{ratio:.2f}× Redis")
        if goal.max_p50_ms is not None:
            if m.p50_ms is None:
                return None, "no latency"
            if m.p50_ms > goal.max_p50_ms:
                misses.append(f"p50 {m.p50_ms:.2f} ms")
        if goal.max_p99_ms is not None:
            if m.p99_ms is None:
                return None, "no latency"
            if m.p99_ms > goal.max_p99_ms:
                misses.append(f"p99 {m.p99_ms:.2f} ms")
        if goal.max_seconds is not None:
            if m.seconds is None:
                return None, "no figure"
            if m.seconds > goal.max_seconds:
                misses.append(f"{m.seconds:.2f} s")
        if goal.max_vs_floor_p50 is not None or goal.min_vs_floor_rate is not None:
            p50, rate = self.vs_floor()
            if (goal.max_vs_floor_p50 is not None and p50 is None) or \
                    (goal.min_vs_floor_rate is not None and rate is None):
                return None, "no floor figure"
            if goal.max_vs_floor_p50 is not None and p50 is not None and p50 > goal.max_vs_floor_p50:
                misses.append(f"p50 {p50:.1f}× floor")
            if goal.min_vs_floor_rate is not None and rate is not None and rate < goal.min_vs_floor_rate:
                misses.append(f"{rate:.2f}× floor rate")
        return (not misses), "; ".join(misses)

    def as_dict(self) -> dict[str, Any]:
        met, why = self.verdict()
        p50, rate = self.vs_floor()
        return {"key": self.key, "group": self.group, "operation": self.operation, "metric": self.metric,
                "goal": self.goal.describe(), "met": met, "why": why,
                "ratioRedis": _round(self.ratio(self.redis)), "ratioNats": _round(self.ratio(self.nats)),
                "floorCase": self.floor_case, "p50VsFloor": _round(p50), "rateVsFloor": _round(rate),
                **{name: (asdict(m) if m is not None else None)
                   for name, m in (("mqstore", self.mqstore), ("redis", self.redis), ("nats", self.nats),
                                   ("floor", self.floor))},
                "notes": self.notes}


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def fmt_rate(value: float) -> str:
    if value >= 10_000:
        return f"{value / 1000:,.0f}k"
    if value >= 1000:
        return f"{value / 1000:.1f}k"
    return f"{value:,.0f}"


def fmt_measure(row: Row, m: Measure | None) -> str:
    if m is None:
        return "—"
    if row.metric == "seconds":
        text = "—" if m.seconds is None else f"{m.seconds:.2f} s"
    elif row.metric == "latency":
        text = "—" if m.p50_ms is None else f"p50 {m.p50_ms:.2f} / p99 {(m.p99_ms or float('nan')):.2f} ms"
        if m.rate:
            text += f" ({fmt_rate(m.rate)}/s)"
    else:
        text = "—" if m.rate is None else f"{fmt_rate(m.rate)}/s"
        if m.p99_ms is not None and row.goal.max_p99_ms is not None:
            text += f" (p50 {m.p50_ms or 0:.2f} / p99 {m.p99_ms:.2f} ms)"
    if m.mode:
        text += f" [{m.mode}]"
    if m.failed:
        text += f" **{m.failed:,} failed**"
    return text


def fmt_ratio(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}×"


def fmt_vs_floor(row: Row) -> str:
    """A per-call row: its p50 as a multiple of the unary floor's (and its rate as a fraction where it
    has a rate goal); a streamed row: its rate as a fraction of the streaming floor's."""
    p50, rate = row.vs_floor()
    parts = []
    if p50 is not None and (row.metric == "latency" or row.goal.max_vs_floor_p50 is not None):
        parts.append(f"{p50:.1f}× p50")
    if rate is not None and row.metric == "rate":
        parts.append(f"{rate:.2f}× rate")
    return ", ".join(parts) or "—"


def render(rows: Sequence[Row]) -> str:
    """The one markdown table: operation, the three systems, the ratios, the goal, met or not."""
    lines = ["| operation | mqstore | Redis Streams | NATS JetStream | grpc.aio floor | mqstore/Redis | mqstore/NATS "
             "| mqstore/floor | goal | met? |",
             "|---|---|---|---|---|---:|---:|---:|---|---|"]
    for row in rows:
        met, why = row.verdict()
        verdict = "—" if met is None else ("**met**" if met else f"**not met** ({why})")
        if met is None and why not in ("not run", "the floor"):
            verdict = f"— ({why})"
        cells = [row.operation, fmt_measure(row, row.mqstore), fmt_measure(row, row.redis),
                 fmt_measure(row, row.nats), fmt_measure(row, row.floor), fmt_ratio(row.ratio(row.redis)),
                 fmt_ratio(row.ratio(row.nats)), fmt_vs_floor(row), row.goal.describe(), verdict]
        lines.append("| " + " | ".join(cells) + " |")
    others = sorted(m.cpu_other for row in rows for m in (row.mqstore, row.redis, row.nats, row.floor)
                    if m is not None and m.cpu_other is not None)
    if others:
        lines += ["", f"Cores used by other processes during the cases: median {statistics.median(others):.2f}, "
                      f"max {others[-1]:.2f} (of {os.cpu_count()}; above ~0.2 the figures are not a quiet run's)."]
    notes = [f"- {row.operation}: {note}" for row in rows for note in row.notes]
    if notes:
        lines += ["", "Notes:", *notes]
    return "\n".join(lines)


def to_json(rows: Sequence[Row], config: dict[str, Any]) -> str:
    return json.dumps({"bench": "peers", "config": config, "rows": [r.as_dict() for r in rows]})


# -- the rows of the table, in the issues' order ----------------------------------------------------------
GROUPS = ("produce", "durable", "latency", "pull", "get", "key", "time", "engine", "recovery", "floor")
# The floor measurements (bench/peers.py floor_rows): calls in flight and shape of each.
FLOOR_CASES = ("unary-1", "unary-n", "unary-64", "stream")
# A per-call operation is held to the unary floor at the same calls in flight: its p50 within 1.3× the
# echo's and its rate at least 0.7× (issue 27), besides the older absolute goals where a row had them.
PER_CALL = {"max_vs_floor_p50": 1.3, "min_vs_floor_rate": 0.7}


def issue_rows() -> list[Row]:
    """Every row of the table with its goal (figures filled in by the harness)."""
    return [
        Row("produce-batch256", "produce", "produce, async, batched: SendBatch 256", "rate", Goal(min_vs_redis=1.0),
            floor_case="stream"),
        Row("produce-batch64", "produce", "produce, async, batched: SendBatch 64", "rate", Goal(min_vs_redis=1.0),
            floor_case="stream"),
        Row("produce-stream", "produce", "produce, async, batched: streamed", "rate", Goal(min_vs_redis=1.0),
            floor_case="stream"),
        Row("durable-batch64", "durable", "produce, durable, 64 producers: SendBatch 64", "rate",
            Goal(min_vs_redis=1.0), floor_case="stream"),
        Row("durable-send", "durable", "produce, durable, 64 producers: one message per Send", "rate",
            Goal(min_rate=10_000), floor_case="unary-64"),
        Row("send-latency", "latency", "one Send, async, latency", "latency",
            Goal(max_p50_ms=0.5, max_p99_ms=1.0, **PER_CALL), floor_case="unary-1"),
        Row("send-n", "latency", "one Send, async, with concurrency", "rate", Goal(**PER_CALL), floor_case="unary-n"),
        Row("pull", "pull", "pull / read a range", "rate", Goal(min_rate=250_000, min_vs_redis=0.6),
            floor_case="stream"),
        Row("get-1", "get", "get one message by id, one in flight", "latency",
            Goal(max_p50_ms=0.4, max_p99_ms=1.0, **PER_CALL), floor_case="unary-1"),
        Row("get-n", "get", "get one message by id, with concurrency", "rate", Goal(min_rate=10_000, **PER_CALL),
            floor_case="unary-n"),
        Row("key-1", "key", "query by key, 1M keys indexed, one in flight", "latency",
            Goal(max_p99_ms=2.0, **PER_CALL), floor_case="unary-1"),
        Row("key-n", "key", "query by key, 1M keys indexed, with concurrency", "rate",
            Goal(min_rate=10_000, **PER_CALL), floor_case="unary-n"),
        Row("time", "time", "offset by time", "rate", Goal(min_rate=10_000, **PER_CALL), floor_case="unary-n"),
        Row("engine-single", "engine", "engine in-process append, single", "rate", Goal(min_rate=150_000)),
        Row("engine-batch", "engine", "engine in-process append, batch 64", "rate", Goal(min_rate=250_000)),
        Row("recovery", "recovery", "crash recovery per GiB (abnormal, 2 GiB commitlog)", "seconds",
            Goal(max_seconds=2.0, text="≤ 2 s per GiB scanned")),
        Row("floor-unary", "floor", "floor: bare grpc.aio unary echo, 1 KiB each way, one in flight", "latency",
            Goal(text="the stack's floor"), floor_case="unary-1"),
        Row("floor-unary-n", "floor", "floor: bare grpc.aio unary echo, with concurrency", "rate",
            Goal(text="the stack's floor"), floor_case="unary-n"),
        Row("floor-stream", "floor", "floor: bare grpc.aio streaming echo, 64 KiB frames, 16 unanswered, 2 streams",
            "rate", Goal(text="the stack's floor"), floor_case="stream"),
    ]


def select(rows: Sequence[Row], only: str | None) -> list[Row]:
    """``--only``: a comma list of groups (produce, get, ...) or row keys (get-1, ...)."""
    if not only:
        return list(rows)
    wanted = {w.strip() for w in only.split(",") if w.strip()}
    known = {r.group for r in rows} | {r.key for r in rows}
    if unknown := sorted(wanted - known):
        raise ValueError(f"unknown rows {unknown}: use groups {', '.join(GROUPS)} or row keys "
                         f"{', '.join(r.key for r in rows)}")
    return [r for r in rows if r.group in wanted or r.key in wanted]
