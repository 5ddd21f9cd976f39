"""One driver for several ``mqstore pipeline`` jobs on a cluster: ``python -m tests.pipeline.cluster_jobs PLAN``.

PLAN is a JSON list of ``{"name": ..., "argv": [JOB, ARGS..., "--master", "spark://...", "--json", ...],
"env": {...}}``. Each job goes through the command line's own entry point (``pipeline.cli.main``, what
``mqstore pipeline`` calls), one after another in this process: the first creates the session from its
``--master`` and ``--conf``, the others run in that application, on the executors it already has
(a driver and two executors started per job were most of the cluster tests' time). ``env`` is set for
the job only. Before each job after the first, the Spark local property :data:`JOB_PROPERTY` names it,
so the event log tells which job ran which task (a Spark job without it belongs to the first).

Prints one JSON line per job: ``{"name", "code", "result" (the job's --json object), "stderr"}``.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
from pathlib import Path
from typing import Any

JOB_PROPERTY = "mqstore.tests.job"


def run_job(step: dict[str, Any]) -> dict[str, Any]:
    from pyspark.sql import SparkSession

    from pipeline.cli import main as pipeline_main

    active = SparkSession.getActiveSession()
    if active is not None:
        active.sparkContext.setLocalProperty(JOB_PROPERTY, step["name"])
    saved = {key: os.environ.get(key) for key in step.get("env", {})}
    os.environ.update(step.get("env", {}))
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = pipeline_main(step["argv"])
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    lines = out.getvalue().strip().splitlines()
    return {"name": step["name"], "code": code, "result": json.loads(lines[-1]) if lines else {},
            "stderr": err.getvalue()}


def main(argv: list[str]) -> int:
    for step in json.loads(Path(argv[0]).read_text()):
        print(json.dumps(run_job(step)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
