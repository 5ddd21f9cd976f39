"""One place that builds the SparkSession, so every job and test gets the same settings.

Why each setting: Python workers must run the interpreter that has ``services`` and ``pyarrow``
installed (Spark otherwise picks ``python3`` from PATH); timestamps are written as UTC microseconds so
Parquet readers agree on the instants; the UI and INFO logs are noise for batch jobs.

A small job (``SMALL_JOB_BYTES`` of commitlog or less, on a local master) is mostly fixed cost: the
driver JVM's start and the first compilation of Spark's planner and generated code, a few CPU seconds
that C2, the optimising JIT, only adds to. Its JVM compiles with C1 alone (``-XX:TieredStopAtLevel=1``:
measured about a third less CPU for the session's start and a first SQL aggregation, docs/benchmarks.md)
and its shuffles go to two partitions. A large job keeps C2, whose code is faster once warm.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

LOG4J_CONFIG = Path(__file__).with_name("log4j2.properties")

DEFAULT_CONF: dict[str, str] = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "8",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.driver.memory": "4g",
    "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile=file:{LOG4J_CONFIG}",
    "spark.executor.extraJavaOptions": f"-Dlog4j2.configurationFile=file:{LOG4J_CONFIG}",
}

#: Up to this much commitlog a job is small (see the module's docstring).
SMALL_JOB_BYTES = 256 * 1024 * 1024
SMALL_JOB_CONF: dict[str, str] = {"spark.sql.shuffle.partitions": "2"}
SMALL_JOB_DRIVER_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1"


@dataclass
class SessionDefaults:
    """What ``mqstore pipeline`` settles from its own options before a job runs (a job only says
    ``get_session(args.master)``): the master, ``--conf`` settings, whether to show progress on
    stderr (pipeline/progress.py), and the commitlog bytes the job reads (None: unknown), which
    decide a small job's settings."""

    master: str | None = None
    conf: dict[str, str] = field(default_factory=dict)
    progress: bool = False
    input_bytes: int | None = None


DEFAULTS = SessionDefaults()


def configure(master: str | None = None, conf: dict[str, str] | None = None, progress: bool = False,
              input_bytes: int | None = None) -> None:
    """Set the defaults of the next session this process creates (see :class:`SessionDefaults`)."""
    DEFAULTS.master = master
    DEFAULTS.conf = dict(conf or {})
    DEFAULTS.progress = progress
    DEFAULTS.input_bytes = input_bytes


def settings(master: str | None, input_bytes: int | None, conf: dict[str, str] | None = None) -> dict[str, str]:
    """A new session's settings: ``DEFAULT_CONF``, a small job's on a local master (``master`` None
    is local unless spark-submit chose), then ``conf``, which wins."""
    merged = dict(DEFAULT_CONF)
    if input_bytes is not None and input_bytes <= SMALL_JOB_BYTES:
        merged.update(SMALL_JOB_CONF)
        local = master.startswith("local") if master is not None else not _submitted()
        if local:
            key = "spark.driver.extraJavaOptions"
            merged[key] = f"{merged[key]} {SMALL_JOB_DRIVER_JAVA_OPTIONS}"
    merged.update(conf or {})
    return merged


def get_session(master: str | None = None, app_name: str = "mqstore-pipeline",
                conf: dict[str, str] | None = None) -> SparkSession:
    """The active session, or a new one. ``master`` defaults to the configured one, else ``local[*]``
    unless spark-submit set one. Settings (:func:`settings`): ``DEFAULT_CONF``, a small job's, then
    ``--conf`` (configured), then ``conf``."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return _with_progress(active)
    builder = SparkSession.builder.appName(app_name)
    master = master or DEFAULTS.master
    for key, value in settings(master, DEFAULTS.input_bytes, {**DEFAULTS.conf, **(conf or {})}).items():
        builder = builder.config(key, value)
    if master is not None:
        builder = builder.master(master)
    elif "spark.master" not in os.environ.get("PYSPARK_SUBMIT_ARGS", "") and not _submitted():
        builder = builder.master("local[*]")
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return _with_progress(session)


def _with_progress(session: SparkSession) -> SparkSession:
    if DEFAULTS.progress:
        from pipeline.progress import Progress

        Progress.start(session)
    return session


def _submitted() -> bool:
    """True under spark-submit, which already chose the master."""
    return "SPARK_SUBMIT" in os.environ or os.environ.get("SPARK_ENV_LOADED") == "1"
