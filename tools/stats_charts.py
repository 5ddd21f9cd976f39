"""Regenerate the stats report's charts shown in docs/pipeline.md (``make docs-charts``).

Builds the tests' chart store (tests/pipeline/chart_store.py: twenty minutes of an operator's traffic,
written with fixed store times, so every run draws the same charts), runs ``mqstore pipeline stats``
on it and copies the report's PNG charts to docs/images/stats/.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
IMAGES = ROOT / "docs" / "images" / "stats"


def main() -> int:
    sys.path.insert(0, str(ROOT))
    from services.cli import main as mqstore_main
    from tests.pipeline.chart_store import write_chart_store

    with tempfile.TemporaryDirectory(prefix="mqstore-charts-") as scratch:
        store = write_chart_store(Path(scratch) / "store")
        out = Path(scratch) / "stats"
        code = mqstore_main(["pipeline", "stats", str(store.root), str(out), "--master", "local[2]"])
        if code:
            return code
        IMAGES.mkdir(parents=True, exist_ok=True)
        for old in IMAGES.glob("*.png"):
            old.unlink()
        for chart in sorted((out / "report").glob("*.png")):
            shutil.copyfile(chart, IMAGES / chart.name)
            print(IMAGES / chart.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
