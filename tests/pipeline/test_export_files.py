"""export's Parquet files, written by the Python workers: row for row what a direct decode of the
commitlog gives (damaged stores included), and committed atomically (a task killed mid-write leaves
no partial file; a rerun writes every row once)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from pipeline.export import (
    CRASH_AFTER_BYTES_ENV,
    STAGING_PREFIX,
    decode_split,
    export,
    partition_value,
    write_split,
)
from pipeline.scan import ScanSummary, StoreInput
from services.store.formats.commitlog_walk import list_commitlog_files
from tests.conftest import StoreFactory

_PARTITIONING = ds.partitioning(pa.schema([("topic", pa.string()), ("store_date", pa.date32())]), flavor="hive")


def exported_rows(out: Path) -> list[dict[str, Any]]:
    """The rows under ``out`` by commitlog offset; the Kafka columns checked against the ones they derive
    from, then dropped."""
    rows = sorted(pq.read_table(out, partitioning=_PARTITIONING).to_pylist(), key=lambda r: r["commitlog_offset"])
    for row in rows:
        assert row.pop("timestamp") == row["store_timestamp"]
        assert row.pop("key") == dict(row["properties"]).get("KEYS")
    return rows


def decoded_rows(store: Path, split_size: int) -> tuple[list[dict[str, Any]], ScanSummary]:
    """Every record's row decoded record by record straight from the commitlog, and the problems found."""
    summary = ScanSummary()
    rows = [row for split in StoreInput.open(store).plan(split_size)
            for batch in decode_split(split, False, summary) for row in batch.to_pylist()]
    return sorted(rows, key=lambda r: r["commitlog_offset"]), summary


def damage(store: Path) -> None:
    """Three kinds of damage to the fixture's first file: a flipped body byte (record 11699: a row with
    body_crc_ok false), a flipped properties byte (record 4813: not UTF-8, so not a row but a problem)
    and the header of record 12574 overwritten with garbage (a corrupt region: no row, a problem)."""
    first = list_commitlog_files(store / "commitlog")[0].path
    with open(first, "r+b") as handle:
        for at in (5_000, 11_800):
            handle.seek(at)
            byte = handle.read(1)
            handle.seek(at)
            handle.write(bytes([byte[0] ^ 0xFF]))
        handle.seek(12_574)
        handle.write(b"\xee" * 24)


def test_worker_files_hold_the_directly_decoded_rows(spark: SparkSession, fixture_store: StoreFactory,
                                                     tmp_path: Path) -> None:
    """Every column of every row, against the per-record decoder over the same splits, on a damaged
    store: a row whose body fails its CRC is exported (body_crc_ok false), a garbled record is not (a
    problem, as the decoder reports it)."""
    store = fixture_store("normal-raw")
    damage(store)
    out = tmp_path / "out"
    result = export(spark, store, str(out), split_size=700_000)
    expected, summary = decoded_rows(store, 700_000)
    rows = exported_rows(out)
    assert [r["commitlog_offset"] for r in rows] == [r["commitlog_offset"] for r in expected]
    assert rows == expected
    assert result.summary.problems() == summary.problems() != []
    assert len([row for row in rows if not row["body_crc_ok"]]) == 1
    files = sorted(out.rglob("*.parquet"))
    assert files and all(f.name.startswith("part-") and ".tmp" not in f.name for f in files)
    assert not [p for p in out.rglob("*") if p.name.startswith((".", STAGING_PREFIX))]


def test_partition_values_are_escaped_as_spark_does() -> None:
    assert partition_value("%RETRY%group_a") == "%25RETRY%25group_a"
    assert partition_value("a/b=c:d") == "a%2Fb%3Dc%3Ad"
    assert partition_value("Topic-Long-Name_with.chars|x") == "Topic-Long-Name_with.chars|x"


def test_a_task_killed_mid_write_leaves_no_partial_file(fixture_store: StoreFactory, tmp_path: Path) -> None:
    """The task itself: a worker that dies after 3000 bytes of its file leaves only its temporary file
    (which readers skip); the retry commits the rows, and a second attempt writes the same file again."""
    store = fixture_store("normal-raw")
    split = StoreInput.open(store).plan(400_000)[0]
    staging = tmp_path / "staging"
    fields = (split.index, split.path, split.file_offset, split.file_size, split.start, split.end)
    code = ("from pipeline.export import write_split; from pipeline.split_reader import Split; "
            f"write_split(Split(*{fields}), {str(staging)!r}, 'run1', False)")
    killed = subprocess.run([sys.executable, "-c", code], env={**os.environ, CRASH_AFTER_BYTES_ENV: "3000"},
                            capture_output=True, timeout=60, check=False)
    assert killed.returncode == 17, killed.stderr.decode()
    left = [p for p in staging.rglob("*") if p.is_file()]
    assert len(left) == 1 and left[0].name.startswith(".part-") and left[0].stat().st_size == 3000
    assert pq.read_table(staging, partitioning=_PARTITIONING).num_rows == 0

    first = write_split(split, str(staging), "run1", False)
    second = write_split(split, str(staging), "run1", False)
    assert first.files == second.files and first.summary.records == sum(rows for _, rows in first.files) > 0
    table = pq.read_table(staging, partitioning=_PARTITIONING)
    assert table.num_rows == first.summary.records == len(set(table["commitlog_offset"].to_pylist()))


def test_a_job_whose_task_is_killed_leaves_nothing_and_its_rerun_writes_each_row_once(
        spark: SparkSession, mqstore_store: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    environment = spark.sparkContext.environment
    environment[CRASH_AFTER_BYTES_ENV] = "2000"  # new Python workers, with the hook set
    try:
        with pytest.raises(Exception, match="(?i)worker|crash|exit"):
            export(spark, mqstore_store, str(out), split_size=20_000)
    finally:
        environment.pop(CRASH_AFTER_BYTES_ENV)
    assert not [p for p in out.rglob("*") if p.is_file() and p.suffix != ".json"]
    result = export(spark, mqstore_store, str(out), split_size=20_000)
    offsets = [row["commitlog_offset"] for row in exported_rows(out)]
    assert result.written == len(offsets) == len(set(offsets)) == 400
