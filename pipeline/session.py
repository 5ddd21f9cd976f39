"""One place that builds the SparkSession, so every job and test gets the same settings.

Why each setting: Python workers must run the interpreter that has ``services`` and ``pyarrow``
installed (Spark otherwise picks ``python3`` from PATH); timestamps are written as UTC microseconds so
Parquet readers agree on the instants; the UI and INFO logs are noise for batch jobs.
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


@dataclass
class SessionDefaults:
    """What ``mqstore pipeline`` settles from its own options before a job runs (a job only says
    ``get_session(args.master)``): the master, ``--conf`` settings, and whether to show progress on
    stderr (pipeline/progress.py)."""

    master: str | None = None
    conf: dict[str, str] = field(default_factory=dict)
    progress: bool = False


DEFAULTS = SessionDefaults()


def configure(master: str | None = None, conf: dict[str, str] | None = None, progress: bool = False) -> None:
    """Set the defaults of the next session this process creates (see :class:`SessionDefaults`)."""
    DEFAULTS.master = master
    DEFAULTS.conf = dict(conf or {})
    DEFAULTS.progress = progress


def get_session(master: str | None = None, app_name: str = "mqstore-pipeline",
                conf: dict[str, str] | None = None) -> SparkSession:
    """The active session, or a new one. ``master`` defaults to the configured one, else ``local[*]``
    unless spark-submit set one. Settings: ``DEFAULT_CONF``, then ``--conf`` (configured), then ``conf``."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return _with_progress(active)
    builder = SparkSession.builder.appName(app_name)
    settings = dict(DEFAULT_CONF)
    settings.update(DEFAULTS.conf)
    settings.update(conf or {})
    master = master or DEFAULTS.master
    for key, value in settings.items():
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
