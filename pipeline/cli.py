"""``mqstore pipeline JOB ...``: the Spark jobs behind one command. Each job module is also a
``spark-submit`` script; this wires their arguments together and adds what every job takes:

* ``--conf KEY=VALUE`` (repeatable): Spark settings, e.g. ``spark.hadoop.fs.s3a.endpoint=...``;
* ``--progress`` / ``--no-progress``: stages, tasks and commitlog MB/s on stderr (default: when
  stderr is a terminal), pipeline/progress.py;
* ``--json``: the result as one JSON object on stdout (nothing else is printed there), also for a
  failed job (``{"ok": false, "error": ..., "exit_code": ...}``).

Store and output arguments may be local paths or Hadoop URIs (pipeline/fs.py); a malformed URI is
refused in one line, exit 2, before Spark starts.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from types import ModuleType
from typing import Any

from pipeline.failures import run_job
from pipeline.fs import LocationError, local_argument, parse_location

JsonRunner = Callable[[argparse.Namespace], tuple[int, dict[str, Any]]]


def _jobs() -> dict[str, ModuleType]:
    from pipeline import export, reindex, stats, streaming, verify

    return {"export": export, "reindex": reindex, "verify": verify, "stats": stats, "stream": streaming}


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="a Spark setting (repeatable), e.g. spark.hadoop.fs.s3a.endpoint=http://...")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object on stdout")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help="show stages, tasks and MB/s on stderr (default: when stderr is a terminal)")


def add_subcommands(parser: argparse.ArgumentParser) -> None:
    """Add one subcommand per job to ``parser`` (each sets ``handler`` and ``job_module``)."""
    jobs = parser.add_subparsers(dest="job", required=True)
    for name, module in _jobs().items():
        doc = (module.__doc__ or "").strip()
        job = jobs.add_parser(name, help=doc.splitlines()[0] if doc else name, description=doc,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_arguments(job)
        add_common_arguments(job)
        runner: Callable[[argparse.Namespace], int] = module.run
        job.set_defaults(handler=runner, job_module=module)


def parse_conf(pairs: Sequence[str]) -> dict[str, str]:
    conf: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise LocationError(f"--conf {pair!r}: expected KEY=VALUE, e.g. spark.executor.memory=2g")
        conf[key.strip()] = value
    return conf


def _normalize_locations(args: argparse.Namespace) -> None:
    """Check every location argument; turn ``file://`` outputs the job writes locally into paths."""
    if args.job == "stream":  # reads from a gateway, not a store
        parse_location(args.output)
        return
    if parse_location(args.store).is_remote and args.job in ("reindex", "verify"):
        raise LocationError(f"{args.store}: {args.job} maps ConsumeQueue and index files: give a local path or "
                            "file:// URI (mount the store on every node); export and stats read remote stores")
    if args.job == "export":
        parse_location(args.output)
    if args.job == "reindex" and args.output is not None:
        args.output = local_argument(args.output)
        if "://" in args.output:
            raise LocationError(f"{args.output}: reindex writes ConsumeQueue and index files through the local "
                                "file system: give a local path or file:// URI")
    if args.job == "stats":
        args.output = local_argument(args.output)
        if "://" in args.output:
            raise LocationError(f"{args.output}: stats writes its HTML report through the local file system: "
                                "give a local path or file:// URI")


def _input_bytes(args: argparse.Namespace) -> int | None:
    """The commitlog bytes a job over a local store reads (None: a remote store or a stream), which
    decide whether it gets a small job's session (pipeline/session.py). A store that cannot be opened
    is refused here, as the job would before Spark starts."""
    if args.job == "stream" or parse_location(args.store).local is None:
        return None
    from pipeline.scan import StoreInput
    from services.store.formats.geometry import options_of

    return StoreInput.open(args.store, options_of(args)).data_bytes()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mqstore pipeline", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_subcommands(parser)
    args = parser.parse_args(argv)
    prog = f"mqstore pipeline {args.job}"
    started = time.monotonic()
    outcome: dict[str, Any] = {}

    def on_error(message: str, code: int) -> None:
        outcome.update({"ok": False, "exit_code": code, "error": message})

    def prepare(_: argparse.Namespace) -> int:
        from pipeline import session

        progress = args.progress if args.progress is not None else sys.stderr.isatty()
        _normalize_locations(args)
        session.configure(args.master, parse_conf(args.conf), progress, _input_bytes(args))
        return 0

    try:
        code = run_job(prog, prepare, args, on_error)
        if code == 0 and args.json:
            code = run_job(prog, lambda a: _run_json(a, outcome), args, on_error)
        elif code == 0:
            handler: Callable[[argparse.Namespace], int] = args.handler
            code = handler(args)
    finally:
        from pipeline import session
        from pipeline.progress import Progress

        Progress.stop()
        session.configure()  # a caller in this process (a test) gets the plain defaults back
    if args.json:
        outcome.setdefault("ok", code == 0)
        outcome.setdefault("exit_code", code)
        outcome["elapsed_s"] = round(time.monotonic() - started, 3)
        print(json.dumps({"job": args.job, **outcome}, default=str))
    return code


def _run_json(args: argparse.Namespace, outcome: dict[str, Any]) -> int:
    code, result = JSON_RUNNERS[args.job](args)
    outcome.update(result)
    outcome["ok"] = code == 0
    outcome["exit_code"] = code
    return code


# -- --json: each job's library call, its result as a dict ------------------------------------------


def _export_json(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    from pipeline.export import result_json, run_export

    return 0, result_json(run_export(args))


def _reindex_json(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    from pipeline.reindex import ReindexInputs, reindex
    from pipeline.scan import StoreInput
    from pipeline.session import get_session
    from services.store.formats.geometry import options_of

    inputs = ReindexInputs.of(StoreInput.open(args.store, options_of(args)), args.output, args.split_size, args.force)
    result = reindex(get_session(args.master), inputs)
    return 0, {"store": str(inputs.source.layout.root), "records": result.records, "queues": result.queues,
               "cq_units": result.cq_units, "consumequeue": str(inputs.cq_root), "index": str(inputs.index_dir),
               "index_files": [name for name, _ in result.index_files],
               "problems": [asdict(gap) for gap in result.gaps if gap.kind != "zeros"]}


def _verify_json(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    from pipeline.scan import StoreInput
    from pipeline.session import get_session
    from pipeline.verify import VerifyInputs, verify
    from services.store.formats.geometry import options_of

    inputs = VerifyInputs.of(StoreInput.open(args.store, options_of(args)))
    report = verify(get_session(args.master), inputs, args.split_size)
    as_json = report.as_json()
    args.report.write_text(json.dumps(as_json, indent=2, ensure_ascii=False) + "\n")
    return (0 if report.ok else 1), {"report_file": str(args.report), **as_json}


def _stats_json(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    from pipeline.scan import StoreInput
    from pipeline.session import get_session
    from pipeline.stats import stats
    from services.store.formats.geometry import options_of

    source = StoreInput.open(args.store, options_of(args))
    source.commitlog_files()
    result = stats(get_session(args.master), source, args.output, args.split_size)
    return 0, {"store": source.name, "records": result.records, "tables": result.tables, "report": str(result.report)}


def _stream_json(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    from pipeline.streaming import run_json

    return run_json(args)


JSON_RUNNERS: dict[str, JsonRunner] = {"export": _export_json, "reindex": _reindex_json, "verify": _verify_json,
                                       "stats": _stats_json, "stream": _stream_json}
