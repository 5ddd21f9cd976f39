"""Shared statistics and output of the benchmarks: one RepResult per repetition, a markdown table
with every rep and the median of each case, and (``--json``) one JSON line per case.

Units: MB = 10^6 bytes (as in the RocketMQ anchor), latencies in microseconds.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from array import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from services.store.config import MessageStoreConfig

MB = 1_000_000
KNOWN_SETTINGS = {f.name for f in dataclasses.fields(MessageStoreConfig)}


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of already sorted values (q in 0..100); NaN for no values."""
    if not sorted_values:
        return float("nan")
    rank = max(0, min(len(sorted_values) - 1, int(round(q / 100 * len(sorted_values) + 0.5)) - 1))
    return float(sorted_values[rank])


def merge_latencies(parts: Iterable[array[int]]) -> array[int]:
    merged: array[int] = array("q")
    for part in parts:
        merged.extend(part)
    return merged


@dataclass
class RepResult:
    """One repetition of one case.

    ``latencies_ns`` holds one sample per call (a put_message, a put_messages batch, an RPC, or for a
    stream one message from send to ack); ``msgs_per_call`` is the batch size, so a per-message figure
    is the call latency divided by it (the amortised cost of a message in a batch).
    """

    case: str
    rep: int
    msgs: int
    seconds: float
    stored_bytes: int
    body_bytes: int
    latencies_ns: array[int] = field(default_factory=lambda: array("q"), repr=False)
    msgs_per_call: int = 1
    failed: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        ordered = sorted(self.latencies_ns)
        self.calls = len(ordered)
        self.call_p50_us = percentile(ordered, 50) / 1000
        self.call_p99_us = percentile(ordered, 99) / 1000
        self.call_max_us = (float(ordered[-1]) / 1000) if ordered else float("nan")

    @property
    def msgs_per_s(self) -> float:
        return self.msgs / self.seconds if self.seconds > 0 else 0.0

    @property
    def stored_mb_per_s(self) -> float:
        return self.stored_bytes / MB / self.seconds if self.seconds > 0 else 0.0

    @property
    def body_mb_per_s(self) -> float:
        return self.body_bytes / MB / self.seconds if self.seconds > 0 else 0.0

    @property
    def msg_p50_us(self) -> float:
        return self.call_p50_us / self.msgs_per_call

    @property
    def msg_p99_us(self) -> float:
        return self.call_p99_us / self.msgs_per_call

    def as_dict(self) -> dict[str, Any]:
        return {
            "case": self.case, "rep": self.rep, "ok": self.msgs, "failed": self.failed,
            "seconds": round(self.seconds, 4), "msgsPerSec": round(self.msgs_per_s, 1),
            "storedMBPerSec": round(self.stored_mb_per_s, 2), "bodyMBPerSec": round(self.body_mb_per_s, 2),
            "avgStoredMsgBytes": round(self.stored_bytes / self.msgs, 1) if self.msgs else 0,
            "calls": self.calls, "msgsPerCall": self.msgs_per_call,
            "callP50Us": round(self.call_p50_us, 1), "callP99Us": round(self.call_p99_us, 1),
            "callMaxUs": round(self.call_max_us, 1),
            "msgP50Us": round(self.msg_p50_us, 2), "msgP99Us": round(self.msg_p99_us, 2),
            **self.extra,
        }


# (header, getter, format) of the table's columns.
Column = tuple[str, Callable[[RepResult], Any], str]

BASE_COLUMNS: list[Column] = [
    ("msgs", lambda r: r.msgs, "{:,}"),
    ("secs", lambda r: r.seconds, "{:.2f}"),
    ("msgs/s", lambda r: r.msgs_per_s, "{:,.0f}"),
    ("stored MB/s", lambda r: r.stored_mb_per_s, "{:.1f}"),
    ("body MB/s", lambda r: r.body_mb_per_s, "{:.1f}"),
    ("call p50 µs", lambda r: r.call_p50_us, "{:.1f}"),
    ("call p99 µs", lambda r: r.call_p99_us, "{:.1f}"),
    ("msg p50 µs", lambda r: r.msg_p50_us, "{:.2f}"),
    ("msg p99 µs", lambda r: r.msg_p99_us, "{:.2f}"),
    ("cpu ours", lambda r: r.extra.get("cpuOurs"), "{:.2f}"),
    ("cpu other", lambda r: r.extra.get("cpuOther"), "{:.2f}"),
]


def _fmt(fmt: str, value: Any) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return "-"
    try:
        return fmt.format(value)
    except (ValueError, TypeError):
        return str(value)


def median_of(results: Sequence[RepResult], getter: Callable[[RepResult], Any]) -> Any:
    values = [getter(r) for r in results]
    numbers = [v for v in values if isinstance(v, int | float) and v == v]
    return statistics.median(numbers) if numbers else None


def group_by_case(results: Sequence[RepResult]) -> dict[str, list[RepResult]]:
    cases: dict[str, list[RepResult]] = {}
    for r in results:
        cases.setdefault(r.case, []).append(r)
    return cases


def print_table(title: str, results: Sequence[RepResult], extra: Sequence[Column] = (),
                file: Any = None) -> None:
    """Every rep, then a **median** row per case (each column's median over the reps)."""
    out = file or sys.stdout
    columns = [*BASE_COLUMNS, *extra]
    header = ["case", "rep", *[c[0] for c in columns]]
    rows: list[list[str]] = []
    for case, reps in group_by_case(results).items():
        for r in reps:
            rows.append([case, str(r.rep), *[_fmt(fmt, get(r)) for _, get, fmt in columns]])
        if len(reps) > 1:
            rows.append([f"**{case}**", "**median**",
                         *[f"**{_fmt(fmt, median_of(reps, get))}**" for _, get, fmt in columns]])
    print(f"\n### {title}\n", file=out)
    print("| " + " | ".join(header) + " |", file=out)
    print("|" + "|".join("---" if i < 2 else "---:" for i in range(len(header))) + "|", file=out)
    for row in rows:
        print("| " + " | ".join(row) + " |", file=out)
    out.flush()


def print_summary(results: Sequence[RepResult], extra: Sequence[Column] = ()) -> None:
    """The median table alone: one row per case."""
    columns = [*BASE_COLUMNS, *extra]
    print("\n| case | reps | " + " | ".join(c[0] for c in columns) + " |")
    print("|---|---:|" + "|".join("---:" for _ in columns) + "|")
    for case, reps in group_by_case(results).items():
        cells = [_fmt(fmt, median_of(reps, get)) for _, get, fmt in columns]
        print(f"| {case} | {len(reps)} | " + " | ".join(cells) + " |")
    sys.stdout.flush()


def emit_json(bench: str, results: Sequence[RepResult], config: dict[str, Any]) -> None:
    """One line per case: its reps, the median of each numeric field, and the run's settings."""
    for case, reps in group_by_case(results).items():
        rows = [r.as_dict() for r in reps]
        medians = {k: statistics.median(vals) for k in rows[0]
                   if (vals := [row[k] for row in rows if isinstance(row.get(k), int | float)
                                and not isinstance(row.get(k), bool)]) and k != "rep"}
        print(json.dumps({"bench": bench, "case": case, "config": config, "median": medians, "reps": rows}))
    sys.stdout.flush()


_TICKS = os.sysconf("SC_CLK_TCK")


def _system_ticks() -> tuple[int, int]:
    """(busy, steal) clock ticks of all CPUs since boot, from /proc/stat."""
    with open("/proc/stat") as handle:
        fields = [int(v) for v in handle.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return user + nice + system + irq + softirq, steal


def _process_ticks(pid: int | str) -> int:
    """utime + stime of a process (all its threads); 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rpartition(")")[2].split()
    except OSError:
        return 0
    return int(fields[11]) + int(fields[12])


class CpuMeter:
    """CPU used during a rep, in cores: by the benchmark's own processes, and by everything else on the
    machine. A benchmark on a shared 2-vCPU machine is only as good as ``other`` is small."""

    def __init__(self, pids: Sequence[int] = (), include_self: bool = True) -> None:
        self.pids: list[int | str] = ["self", *pids] if include_self else list(pids)
        self._start = self._sample()

    def _sample(self) -> tuple[float, int, int, int]:
        busy, steal = _system_ticks()
        return time.monotonic(), busy, steal, sum(_process_ticks(p) for p in self.pids)

    def stop(self) -> dict[str, float]:
        t1, busy1, steal1, ours1 = self._sample()
        t0, busy0, steal0, ours0 = self._start
        span = max(t1 - t0, 1e-9) * _TICKS
        ours = (ours1 - ours0) / span
        return {"cpuOurs": round(ours, 2), "cpuOther": round(max(0.0, (busy1 - busy0) / span - ours), 2),
                "cpuSteal": round((steal1 - steal0) / span, 2)}


def wait_quiet(max_wait_s: float, limit_cores: float = 0.15) -> float:
    """Wait (up to ``max_wait_s``) for a second in which the rest of the machine uses less than
    ``limit_cores``; returns the last measured load (cores)."""
    deadline = time.monotonic() + max_wait_s
    load = 0.0
    while True:
        meter = CpuMeter()
        time.sleep(1.0)
        load = meter.stop()["cpuOther"]
        if load < limit_cores or time.monotonic() >= deadline:
            if load >= limit_cores:
                progress(f"warning: the machine is busy ({load:.2f} cores used by other processes)")
            return load


def progress(message: str) -> None:
    """Progress lines go to stderr so that stdout stays the table (and JSON)."""
    print(message, file=sys.stderr, flush=True)


def add_common_args(parser: argparse.ArgumentParser, *, reps: int = 3) -> None:
    parser.add_argument("--reps", type=int, default=reps, help=f"repetitions per case (default {reps})")
    parser.add_argument("--json", action="store_true", help="also print one JSON line per case")
    parser.add_argument("--drop-caches", action="store_true",
                        help="sync and drop the page cache before each rep (needs root; as the RocketMQ anchor did)")
    parser.add_argument("--keep-store", action="store_true", help="keep the store directories (for inspection)")
    parser.add_argument("--profile", metavar="DIR",
                        help="sample the measured process with py-spy (GIL holders only) into DIR/<case>-<rep>.folded")
    parser.add_argument("--wait-quiet", type=float, default=60.0, metavar="SECONDS",
                        help="before each rep wait up to this long for other processes to go idle (default 60)")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="any other store setting, e.g. --set flushIntervalCommitLog=1000 (repeatable)")


def parse_settings(parser: argparse.ArgumentParser, items: Sequence[str]) -> dict[str, str]:
    """``--set`` items -> MQSTORE_* environment entries (load_config checks names and values)."""
    settings: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            parser.error(f"--set {item!r}: use NAME=VALUE")
        snake = re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", name).lower()
        if snake not in KNOWN_SETTINGS:  # load_config would silently skip an unknown MQSTORE_ variable
            parser.error(f"--set {item!r}: unknown setting (see services/store/config.py)")
        settings[f"MQSTORE_{snake.upper()}"] = value
    return settings


class PySpy:
    """Samples a process with py-spy (if installed: ``pip install py-spy``, not a project dependency)
    into a folded-stacks file for ``python -m bench.profile_summary``. Only samples that hold the GIL
    are kept (``--gil``): in a GIL-bound process that is where the Python time goes."""

    def __init__(self, pid: int, output: Path, rate: int = 250) -> None:
        exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        if not Path(exe).exists():
            raise SystemExit("py-spy is not installed: .venv/bin/pip install py-spy (for local use only)")
        output.parent.mkdir(parents=True, exist_ok=True)
        self.output = output
        self.proc = subprocess.Popen([exe, "record", "--pid", str(pid), "--output", str(output), "--format", "raw",
                                      "--rate", str(rate), "--nolineno", "--gil", "--threads"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(0.5)  # attach before the clock starts

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGINT)  # py-spy writes its file on SIGINT
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        progress(f"profile written to {self.output}")


def profiler(directory: str | None, pid: int, name: str) -> PySpy | None:
    if not directory:
        return None
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", name)
    return PySpy(pid, Path(directory) / f"{safe}.folded")
