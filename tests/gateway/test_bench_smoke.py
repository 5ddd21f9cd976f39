"""The end-to-end benchmark's harness works: ``python -m bench.gateway --tiny`` starts ``mqstore up``,
drives every kind of client, checks what was stored, stops the system cleanly and prints a row per
case. No timing is asserted: the figures belong in docs/benchmarks.md, not in a test on a shared machine.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
EXPECTED_ROWS = ("send 1x1", "batch64 1x1", "pull raw 1x2", "pull parsed 1x2", "pull records 1x2")


def _median_rows(stdout: str) -> dict[str, dict[str, str]]:
    """The rows of the table that follows "### Medians", by case, as {column: cell}."""
    lines = stdout.splitlines()
    start = lines.index("### Medians")
    header: list[str] = []
    rows: dict[str, dict[str, str]] = {}
    for line in lines[start + 1:]:
        if not line.startswith("|"):
            if header:
                break
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if not header:
            header = cells
        elif not set(line) <= set("|-: "):
            rows[cells[0]] = dict(zip(header, cells, strict=True))
    return rows


def test_bench_gateway_tiny_runs_every_case_and_prints_positive_rates() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.gateway", "--cases", "send,batch,pull", "--duration", "1", "--reps", "1",
         "--tiny", "--quiet"],
        cwd=REPO, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, f"exit {done.returncode}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr[-5000:]}"
    rows = _median_rows(done.stdout)
    assert set(EXPECTED_ROWS) <= set(rows), f"rows {sorted(rows)}\n{done.stdout}"
    for name in EXPECTED_ROWS:
        rate = float(rows[name]["msgs/s"].replace(",", ""))
        assert rate > 0, f"{name}: {rows[name]}"
        assert rows[name]["failed"] == "0", f"{name}: {rows[name]}"
    assert done.stderr.count("mqstore up stopped cleanly") == 3, done.stderr[-3000:]
    assert "### Targets" in done.stdout
