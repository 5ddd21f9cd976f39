"""``mqstore pipeline JOB ...``: the Spark jobs behind one command. Each job module is also a
``spark-submit`` script; this only wires their arguments together."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from types import ModuleType


def _jobs() -> dict[str, ModuleType]:
    from pipeline import export, reindex, stats, verify

    return {"export": export, "reindex": reindex, "verify": verify, "stats": stats}


def add_subcommands(parser: argparse.ArgumentParser) -> None:
    """Add one subcommand per job to ``parser`` (each sets ``handler``)."""
    jobs = parser.add_subparsers(dest="job", required=True)
    for name, module in _jobs().items():
        doc = (module.__doc__ or "").strip()
        job = jobs.add_parser(name, help=doc.splitlines()[0] if doc else name, description=doc,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_arguments(job)
        runner: Callable[[argparse.Namespace], int] = module.run
        job.set_defaults(handler=runner)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mqstore pipeline", description=__doc__)
    add_subcommands(parser)
    args = parser.parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = args.handler
    return handler(args)
