"""The delayed delivery lateness benchmark (bench/scheduler_lateness.py): its accounting (lost,
duplicated, early, lateness per kind) on made-up deliveries, and a quick run of the whole harness
against a real ``mqstore up``. No timing is asserted: the figures belong in docs/benchmarks.md, not in
a test on a shared machine."""

from __future__ import annotations

import json
import subprocess
import sys
from array import array
from pathlib import Path

from bench.scheduler_lateness import HEADER, analyse, header, lateness_by_second, parse_header

REPO = Path(__file__).resolve().parents[2]


def test_a_body_header_names_its_sender_and_sequence_number() -> None:
    assert len(header(7, 123_456)) == HEADER
    assert parse_header(header(7, 123_456) + b"padding") == (7, 123_456)


def test_lateness_is_counted_once_per_message_and_loss_duplicates_and_early_ones_apart() -> None:
    # sender 0: 4 messages in batches of 2, kinds alternating per batch ("1" then "2")
    due = array("q", [1_000, 1_000, 5_000, 5_000])
    reports = [{"proc": 0, "due": due.tobytes()}]
    pulled = [(header(0, 0), 1_004), (header(0, 1), 1_010),  # level 1: 4 and 10 ms late
              (header(0, 1), 1_900),  # a repeat of seq 1: a duplicate, its lateness not counted
              (header(0, 2), 4_999),  # level 2, 1 ms early
              (b"not-ours-at-all!", 1)]  # seq 3 never delivered: lost
    lateness, lost, duplicates, early, unknown = analyse(reports, pulled, ("1", "2"), batch=2)
    assert lateness == {"1": [4, 10], "2": [-1]}
    assert (lost, duplicates, early, unknown) == (1, 1, 1, 1)


def test_worst_lateness_per_second_of_due_time_per_kind() -> None:
    due = array("q", [10_100, 10_900, 12_000, 12_500])  # batches of 2: kind "1", then kind "2"
    reports = [{"proc": 0, "due": due.tobytes()}]
    pulled = [(header(0, 0), 10_105), (header(0, 1), 10_950), (header(0, 1), 19_000),  # the repeat is ignored
              (header(0, 2), 12_700), (header(0, 3), 12_510)]
    assert lateness_by_second(reports, pulled, ("1", "2"), batch=2) == {
        "1": [50, 0, 0], "2": [0, 0, 700], "all": [50, 0, 700]}


def test_quick_run_delivers_every_message_once_and_reports_lateness() -> None:
    done = subprocess.run([sys.executable, "-m", "bench.scheduler_lateness", "--quick", "--json"],
                          cwd=REPO, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, f"exit {done.returncode}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr[-5000:]}"
    result = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("{")))
    assert result["sent"] == 1000 and result["delivered"] == 1000, result
    assert (result["lost"], result["duplicates"], result["early"]) == (0, 0, 0), result
    rows = {row["kind"]: row for row in result["rows"]}
    assert rows["1"]["delivered"] == rows["timer"]["delivered"] == 500 and rows["all"]["delivered"] == 1000
    assert 0 <= rows["all"]["p50"] <= rows["all"]["p99"] <= rows["all"]["max"]
    assert "mqstore up stopped cleanly" in done.stderr
