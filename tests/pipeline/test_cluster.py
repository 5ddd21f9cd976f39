"""The jobs on a real Spark standalone cluster: a master and two workers on loopback (pipeline/cluster.py),
each job given to ``mqstore pipeline JOB --master spark://...`` with ``file://`` URIs, its tasks
run by executors on both workers, its output equal to the ``local[*]`` output: byte for byte for
ConsumeQueue and index files, row for row for Parquet.

The module starts one cluster, and one driver process runs the five jobs through the command line's
entry point, one after another in one application (tests/pipeline/cluster_jobs.py): a driver and two
executors started for each job were most of this module's time. Each test checks its own job's result.

Which executor ran which task comes from Spark's event log (``spark.eventLog.*``: SparkListenerTaskEnd
events, their stage's job, the job's :data:`JOB_PROPERTY`), and which worker an executor lived on from
the workers' work directories (``WORK_DIR/<app id>/<executor id>/``), so nothing is hooked into Spark.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from pipeline.cluster import StandaloneCluster
from pipeline.export import export
from pipeline.fs import REMOTE_FILE_URIS_ENV
from pipeline.reindex import reindex
from pipeline.stats import stats
from pipeline.verify import verify
from services.store.formats.geometry import GeometryOptions
from tests.geometry import SMALL
from tests.pipeline.cluster_jobs import JOB_PROPERTY
from tests.pipeline.services_store import ServicesStore

# Starting JVMs (master, two workers, a driver and two executors) on a shared 2-core machine is slow, and
# the first test waits for all five jobs.
pytestmark = pytest.mark.timeout(1200)

SPLIT_SIZE = 64 * 1024  # the services store's files: one task a file, a few dozen
SMALL_SPLIT = 16 * 1024  # the 400-message store: 16 KiB files, one task a file (8)
GEOMETRY = {"cq_file_size": SMALL.cq_file_size, "hash_slot_num": SMALL.hash_slot_num, "index_num": SMALL.index_num}
# One executor of one core on each worker; jobs start once both registered (standalone would start
# with the first), so the tasks of even a short job spread over both.
JOB_CONF = {"spark.executor.memory": "512m", "spark.executor.cores": "1", "spark.cores.max": "2",
            "spark.driver.memory": "1g", "spark.sql.shuffle.partitions": "4",
            "spark.scheduler.minRegisteredResourcesRatio": "1.0"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    with StandaloneCluster(tmp_path_factory.mktemp("spark-cluster"), workers=2, worker_cores=1,
                           worker_memory="1g") as running:
        yield running


@dataclass(frozen=True)
class Submitted:
    code: int
    result: dict[str, Any]
    stderr: str
    tasks_by_worker: dict[int, int]  # worker number -> tasks its executors ran


@dataclass(frozen=True)
class Job:
    """``mqstore pipeline JOB ARGS`` as one test gives it to the cluster."""

    name: str
    args: list[str]
    split_size: int
    env: dict[str, str] = field(default_factory=dict)


def submit_all(cluster: StandaloneCluster, work: Path, jobs: list[Job]) -> dict[str, Submitted]:
    """Run the jobs with ``--master <cluster> --json`` in one driver process (cluster_jobs.py), in order."""
    events = work / "events"
    events.mkdir()
    conf = {**JOB_CONF, "spark.eventLog.enabled": "true", "spark.eventLog.dir": events.as_uri(),
            "spark.eventLog.compress": "false"}
    plan = [{"name": job.name, "env": job.env,
             "argv": [*job.args, "--master", cluster.master_url, "--json", "--split-size", str(job.split_size),
                      *(f"--conf={k}={v}" for k, v in conf.items())]} for job in jobs]
    (work / "plan.json").write_text(json.dumps(plan))
    done = subprocess.run([sys.executable, "-m", "tests.pipeline.cluster_jobs", str(work / "plan.json")],
                          env=cluster.env(), capture_output=True, text=True, timeout=1100, check=False)
    assert done.stdout.strip(), f"the driver printed nothing on stdout; stderr:\n{done.stderr[-4000:]}"
    ran = {step["name"]: step for step in map(json.loads, done.stdout.strip().splitlines())}
    tasks = tasks_by_worker(cluster, events, first=jobs[0].name)
    return {job.name: Submitted(ran[job.name]["code"], ran[job.name]["result"],
                                ran[job.name]["stderr"] + done.stderr[-4000:], tasks.get(job.name, {}))
            if job.name in ran else Submitted(-1, {}, f"the driver exited {done.returncode}:\n{done.stderr[-4000:]}",
                                              {}) for job in jobs}


def tasks_by_worker(cluster: StandaloneCluster, events: Path, first: str) -> dict[str, dict[int, int]]:
    """Tasks per job and worker, from the event log (task -> stage -> job -> its JOB_PROPERTY, none for
    the first job; task -> executor) and the work dirs (executor -> worker)."""
    # Spark 4 rolls event logs: eventlog_v2_<app id>/events_<n>_<app id> (and an appstatus marker).
    logs = sorted(p for p in events.rglob("*") if p.is_file() and p.name.startswith("events_"))
    assert logs, f"no event log under {events}"
    app_id = ""
    job_of_stage: dict[int, str] = {}
    per_executor: dict[tuple[str, str], int] = {}
    for line in (line for log in logs for line in log.read_text().splitlines()):
        event = json.loads(line)
        if event["Event"] == "SparkListenerApplicationStart":
            app_id = event["App ID"]
        elif event["Event"] == "SparkListenerJobStart":
            name = (event.get("Properties") or {}).get(JOB_PROPERTY, first)
            job_of_stage.update(dict.fromkeys(event["Stage IDs"], name))
        elif event["Event"] == "SparkListenerTaskEnd" and event["Task End Reason"]["Reason"] == "Success":
            key = (job_of_stage[event["Stage ID"]], event["Task Info"]["Executor ID"])
            per_executor[key] = per_executor.get(key, 0) + 1
    assert app_id, f"no application start in {logs}"
    counts: dict[str, dict[int, int]] = {}
    for (name, executor), tasks in per_executor.items():
        (worker,) = [n for n in range(cluster.workers) if (cluster.work_dir(n) / app_id / executor).is_dir()]
        counts.setdefault(name, {})[worker] = counts.setdefault(name, {}).get(worker, 0) + tasks
    return counts


def assert_on_both_workers(submitted: Submitted) -> None:
    assert submitted.code == 0, submitted.stderr[-4000:]
    assert sorted(submitted.tasks_by_worker) == [0, 1], submitted.tasks_by_worker
    assert min(submitted.tasks_by_worker.values()) > 0


def files_under(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def parquet_rows(path: Path, key: list[str]) -> list[dict[str, Any]]:
    table = pq.read_table(path, partitioning="hive")
    return sorted(table.to_pylist(), key=lambda row: [str(row[k]) for k in key])


@pytest.fixture(scope="module")
def indexed_store(spark: SparkSession, mqstore_store: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the 400-message store with ConsumeQueue and index files (small geometry) built locally."""
    root = tmp_path_factory.mktemp("indexed") / "store"
    shutil.copytree(mqstore_store, root)
    reindex(spark, root, split_size=SMALL_SPLIT, **GEOMETRY)
    return root


@dataclass(frozen=True)
class ClusterRun:
    """Where the jobs wrote (``out/<job>``, ``out/verify-report.json``) and how each went."""

    out: Path
    jobs: dict[str, Submitted]


@pytest.fixture(scope="module")
def cluster_run(cluster: StandaloneCluster, services_store: ServicesStore, mqstore_store: Path, indexed_store: Path,
                tmp_path_factory: pytest.TempPathFactory) -> ClusterRun:
    """The five jobs on the cluster, each as its test below gives it."""
    work = tmp_path_factory.mktemp("cluster-jobs")
    out = work / "out"
    jobs = [
        Job("export", ["export", services_store.root.as_uri(), (out / "export").as_uri()], SPLIT_SIZE),
        Job("export-remote", ["export", mqstore_store.as_uri(), (out / "export-remote").as_uri()], 8192,
            {REMOTE_FILE_URIS_ENV: "1"}),
        Job("reindex", ["reindex", mqstore_store.as_uri(), "--output", (out / "reindex").as_uri(),
                        *SMALL.reindex_args()], SMALL_SPLIT),
        Job("verify", ["verify", indexed_store.as_uri(), "--report", str(out / "verify-report.json"),
                       *SMALL.reindex_args()], SMALL_SPLIT),
        Job("stats", ["stats", mqstore_store.as_uri(), (out / "stats").as_uri()], SMALL_SPLIT),
    ]
    return ClusterRun(out, submit_all(cluster, work, jobs))


def test_export_on_the_cluster(cluster_run: ClusterRun, spark: SparkSession, services_store: ServicesStore,
                               tmp_path: Path) -> None:
    local = tmp_path / "local"
    export(spark, services_store.root, str(local), split_size=SPLIT_SIZE)
    out = cluster_run.out / "export"
    submitted = cluster_run.jobs["export"]
    assert_on_both_workers(submitted)
    assert submitted.result["records"] == services_store.messages and submitted.result["problems"] == []
    assert parquet_rows(out, ["commitlog_offset"]) == parquet_rows(local, ["commitlog_offset"])
    state = json.loads((out / "_mqstore_export_state.json").read_text())
    assert state["next_offset"] == submitted.result["next_offset"] > 0


def test_export_reads_a_remote_store_on_the_cluster(cluster_run: ClusterRun, spark: SparkSession,
                                                    mqstore_store: Path, tmp_path: Path) -> None:
    """The remote route: the driver lists through Hadoop's FileSystem, each executor fetches its files."""
    local = tmp_path / "local"
    export(spark, mqstore_store, str(local), split_size=8192)
    out = cluster_run.out / "export-remote"
    submitted = cluster_run.jobs["export-remote"]
    assert_on_both_workers(submitted)
    assert submitted.result["records"] == 400
    assert parquet_rows(out, ["commitlog_offset"]) == parquet_rows(local, ["commitlog_offset"])
    state = json.loads((out / "_mqstore_export_state.json").read_text())
    assert state["commitlog"] == (mqstore_store / "commitlog").as_uri()


def test_reindex_on_the_cluster(cluster_run: ClusterRun, spark: SparkSession, mqstore_store: Path,
                                tmp_path: Path) -> None:
    local = tmp_path / "local"
    reindex(spark, mqstore_store, local, split_size=SMALL_SPLIT, **GEOMETRY)
    submitted = cluster_run.jobs["reindex"]
    assert_on_both_workers(submitted)
    assert submitted.result["records"] == 400
    built = files_under(cluster_run.out / "reindex")
    assert built == files_under(local)
    assert len([name for name in built if name.startswith("index/")]) > 1, "several index files"


def test_verify_on_the_cluster(cluster_run: ClusterRun, spark: SparkSession, indexed_store: Path) -> None:
    local = verify(spark, indexed_store, SMALL_SPLIT, GeometryOptions(None, None, **GEOMETRY))
    submitted = cluster_run.jobs["verify"]
    assert_on_both_workers(submitted)
    result = submitted.result
    assert result["ok"] and local.ok
    expected = local.as_json()
    for key in ("records", "record_bytes", "cq_units", "index_files", "problem_counts"):
        assert result[key] == expected[key], key
    assert json.loads((cluster_run.out / "verify-report.json").read_text())["records"] == 400


def test_stats_on_the_cluster(cluster_run: ClusterRun, spark: SparkSession, mqstore_store: Path,
                              tmp_path: Path) -> None:
    local = tmp_path / "local"
    stats(spark, mqstore_store, local, SMALL_SPLIT)
    out = cluster_run.out / "stats"
    submitted = cluster_run.jobs["stats"]
    assert_on_both_workers(submitted)
    assert submitted.result["records"] == 400
    for table, key in (("per_minute", ["topic", "minute"]), ("size_histogram", ["topic", "bucket"]),
                       ("top_keys", ["topic", "rank"]), ("top_producers", ["topic", "rank"])):
        assert exact(parquet_rows(out / table, key)) == exact(parquet_rows(local / table, key)), table
    assert (out / "report" / "index.html").is_file()


def exact(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows without percentile_approx's columns: its sketches are merged in task completion order,
    which differs between runs (counts, sums, minima and maxima do not)."""
    return [{k: v for k, v in row.items() if not re.search(r"_p\d+(_ms)?$", k)} for row in rows]
