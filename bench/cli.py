"""``mqstore bench``: the end-to-end benchmark through the gateway (:mod:`bench.gateway`).

Registered by ``services.cli`` so that a newcomer finds it next to ``mqstore up``. The arguments pass
through unparsed (``mqstore bench --cases batch,pull --reps 1``; ``mqstore bench --help`` shows the
benchmark's own help), and the module is imported only when the command runs, so other commands never
load the benchmark (or the generated protobufs it needs).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import TypeAlias

Subcommands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
PROG = "mqstore bench"
LATENESS = "scheduler-lateness"


def add_bench_command(commands: Subcommands) -> None:
    # No options of its own: with "+" as its only prefix, "--cases ..." reaches bench_args untouched
    # (argparse.REMAINDER alone would leave leading options to the top parser, which rejects them).
    bench = commands.add_parser("bench", add_help=False, prefix_chars="+",
                                help="benchmark the whole system end to end through the gateway "
                                     "(produce, SYNC_FLUSH, Send latency, pull); --help for its options; "
                                     f"'{LATENESS}' first: delayed delivery lateness")
    bench.add_argument("bench_args", nargs=argparse.REMAINDER)
    bench.set_defaults(handler=_bench)


def _bench(args: argparse.Namespace) -> int:
    argv: list[str] = list(args.bench_args)
    if argv[:1] == [LATENESS]:  # delayed delivery on time under load (bench/scheduler_lateness.py)
        from bench.scheduler_lateness import main as lateness_main

        return lateness_main(argv[1:], prog=f"{PROG} {LATENESS}")
    try:
        from bench.gateway import main as bench_main
    except ImportError as exc:
        # An install that cannot import the benchmark's dependencies from here: run it from the
        # checkout this module lives in, where ``python -m bench.gateway`` resolves.
        root = Path(__file__).resolve().parent.parent
        print(f"{PROG}: cannot import bench.gateway ({exc}); "
              f"running `{sys.executable} -m bench.gateway` from {root}", file=sys.stderr)
        return subprocess.call([sys.executable, "-m", "bench.gateway", *argv], cwd=root)
    return bench_main(argv, prog=PROG)
