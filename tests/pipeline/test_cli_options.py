"""What every job takes through ``mqstore pipeline``: locations as paths or URIs (a bad one is one line,
exit 2), ``--json`` (one object on stdout, failures too), ``--conf``, and progress on stderr."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from pipeline.fs import LocationError, parse_location
from pipeline.progress import Progress
from services.cli import main as mqstore_main
from tests.conftest import StoreFactory


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = mqstore_main(["pipeline", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize(("text", "local", "remote"), [
    ("/data/store", "/data/store", False),
    ("relative/store", "relative/store", False),
    ("file:///data/store", "/data/store", False),
    ("file:/data/store", "/data/store", False),
    ("file://localhost/data/store", "/data/store", False),
    ("hdfs://namenode:8020/mq/store", None, True),
    ("hdfs:///mq/store", None, True),
    ("s3a://bucket/archive/store", None, True),
])
def test_locations(text: str, local: str | None, remote: bool) -> None:
    location = parse_location(text, remote_file_uris=False)
    assert location.is_remote == remote
    assert (str(location.local) if location.local is not None else None) == local


@pytest.mark.parametrize(("text", "says"), [
    ("file://otherhost/data", "not on host 'otherhost'"),
    ("file:relative/data", "needs an absolute path"),
    ("s3a:bucket/data", "expected s3a://authority/path"),
    ("s3a:///data", "name a bucket or host"),
    ("hdfs://nn/data?x=1", "no ?query"),
])
def test_bad_locations(text: str, says: str) -> None:
    with pytest.raises(LocationError, match=says.replace("?", r"\?")):
        parse_location(text)


def test_a_bad_uri_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, err = run_cli(capsys, "export", "file://otherhost/store", str(tmp_path / "out"))
    assert code == 2 and out == ""
    assert err.strip().splitlines() == ["mqstore pipeline export: error: file://otherhost/store: a file URI names a "
                                        "path on this machine (file:///path), not on host 'otherhost'"]
    code, out, err = run_cli(capsys, "stats", str(tmp_path), "s3a://bucket/stats", "--json")
    assert code == 2 and len(err.strip().splitlines()) == 1
    result = json.loads(out)
    assert result["job"] == "stats" and not result["ok"] and result["exit_code"] == 2
    assert "stats writes its HTML report through the local file system" in result["error"]
    code, out, err = run_cli(capsys, "verify", str(tmp_path), "--conf", "spark.executor.memory")
    assert code == 2 and "expected KEY=VALUE" in err
    code, out, err = run_cli(capsys, "reindex", "s3a://bucket/store", "--force")
    assert code == 2 and "reindex maps ConsumeQueue and index files: give a local path" in err


def test_a_scheme_no_file_system_serves(spark: SparkSession, capsys: pytest.CaptureFixture[str],
                                        tmp_path: Path) -> None:
    code, out, err = run_cli(capsys, "export", "nosuchfs://bucket/store", str(tmp_path / "out"), "--json")
    assert code == 2
    assert json.loads(out)["error"] == err.strip().split("error: ", 1)[1]
    assert 'No FileSystem for scheme "nosuchfs"' in err and len(err.strip().splitlines()) == 1


def test_file_uris_for_store_and_output(spark: SparkSession, mqstore_store: Path, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    code, stdout, err = run_cli(capsys, "export", mqstore_store.as_uri(), out.as_uri(), "--split-size", "8192",
                                "--json", "--progress")
    assert code == 0, err
    result = json.loads(stdout)
    assert result["ok"] and result["records"] == 400 and result["expired"] is None and result["problems"] == []
    assert result["next_offset"] == json.loads((out / "_mqstore_export_state.json").read_text())["next_offset"]
    rows = pq.read_table(out, partitioning="hive").to_pylist()
    assert len(rows) == 400
    # the Kafka-named columns: timestamp is the store time, key the KEYS property as stored
    assert all(row["timestamp"] == row["store_timestamp"] for row in rows)
    assert all(row["key"] == dict(row["properties"]).get("KEYS") for row in rows)
    assert sum(row["key"] is not None for row in rows) == 200
    assert "tasks done" in err and "MB/s" in err  # --progress into a pipe: plain lines


def test_progress_shows_stages_tasks_and_rate(spark: SparkSession) -> None:
    stream = io.StringIO()
    Progress.expect(64_000_000, 8)
    Progress.start(spark, stream, interval_s=0.05)
    try:
        spark.sparkContext.parallelize(range(8), 8).map(lambda x: sum(range(200_000)) + x).collect()
    finally:
        Progress.stop()
        Progress.expect(0, 0)
    last = stream.getvalue().strip().splitlines()[-1]
    assert "8 tasks done" in last and "commitlog 64.0/64.0 MB" in last and "MB/s" in last


SMALL = 24 * 1024 * 1024


def test_small_job_settings() -> None:
    """A small local job's time is the JVM's start and its first queries: the driver JVM compiles with
    C1 only and shuffles go to two partitions; a large job, an unknown size or a cluster keeps the
    defaults, and ``--conf`` wins over both."""
    from pipeline import session

    small = session.settings("local[*]", SMALL)
    assert small["spark.driver.extraJavaOptions"].endswith(" -XX:TieredStopAtLevel=1")
    assert small["spark.sql.shuffle.partitions"] == "2"
    assert session.settings("local[*]", 2 << 30) == session.settings("local[*]", None) == session.DEFAULT_CONF
    assert "TieredStopAtLevel" not in session.settings("spark://host:7077", SMALL)["spark.driver.extraJavaOptions"]
    assert session.settings("local[2]", SMALL, {"spark.sql.shuffle.partitions": "5"})[
        "spark.sql.shuffle.partitions"] == "5"


def test_the_command_line_sizes_the_job_by_the_store(pristine_store: StoreFactory, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The commitlog bytes up to the last record (not the preallocated files' size) decide a small job,
    before Spark starts."""
    from pipeline import session, stats

    seen: list[int | None] = []
    configure = session.configure

    def spy(*args: object, **kwargs: object) -> None:
        configure(*args, **kwargs)  # type: ignore[arg-type]
        seen.append(session.DEFAULTS.input_bytes)

    monkeypatch.setattr(session, "configure", spy)
    monkeypatch.setattr(stats, "run", lambda args: 0)
    assert mqstore_main(["pipeline", "stats", str(pristine_store("normal-raw")), str(tmp_path / "out")]) == 0
    assert seen[0] == 3008717  # the last record's end; the third 1 MiB file's zeros are not counted
