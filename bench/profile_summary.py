"""Summarise py-spy folded stacks (``bench --profile DIR``): where the sampled time goes.

    python -m bench.profile_summary DIR/*.folded [--top 25]

Prints, per file, the functions with the most *self* time (the frame on top of the stack) and the
most *inclusive* time (anywhere on the stack, counted once per sample), as shares of all samples.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*)\)$")


def short(frame: str) -> str:
    """``put_messages (services/commitlog/commit_log.py)`` -> ``commit_log.py:put_messages``."""
    match = _FRAME.match(frame.strip())
    if not match:
        return frame.strip()
    name = match["file"].rsplit("/", 1)[-1]
    return f"{name}:{match['func']}"


def summarise(path: Path, top: int) -> None:
    self_time: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [short(f) for f in stack.split(";") if f and not f.startswith(("thread (", "process "))]
        if not frames:
            continue
        total += count
        self_time[frames[-1]] += count
        for frame in set(frames):
            inclusive[frame] += count
    print(f"\n## {path.name}: {total:,} samples holding the GIL\n")
    print("| self % | function | | incl. % | function |")
    print("|---:|---|---|---:|---|")
    selfs, incls = self_time.most_common(top), inclusive.most_common(top)
    for i in range(max(len(selfs), len(incls))):
        left = f"{selfs[i][1] / total * 100:.1f} | `{selfs[i][0]}`" if i < len(selfs) else " | "
        right = f"{incls[i][1] / total * 100:.1f} | `{incls[i][0]}`" if i < len(incls) else " | "
        print(f"| {left} | | {right} |")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile_summary", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args(argv)
    for path in args.files:
        summarise(path, args.top)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
