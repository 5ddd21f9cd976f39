"""Incremental export of a live store: the commitlog service keeps appending (64 KiB files, so every
round rolls files) while export runs again and again with its state file; each run exports exactly
the records appended since the last one: no duplicates, no gaps. The oldest files are deleted in
between, as expiry would: files already exported are simply gone, and files that expired before an
export reached them are reported (the commitlog range lost) while the rest is exported.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from mqstore.v1 import commitlog_pb2 as pb
from mqstore.v1 import common_pb2
from pipeline.export import STATE_FILE_NAME, export
from services.cli import main as mqstore_main
from services.store.formats.commitlog_walk import list_commitlog_files
from tests.commitlog.commitlog_process import CommitLogProcess, Launcher
from tests.geometry import SMALL, GeometryPreset

TOPICS = ("Orders", "Audit")


@pytest.fixture
def live(store_geometry: GeometryPreset, tmp_path: Path) -> Iterator[CommitLogProcess]:
    launcher = Launcher()
    yield launcher(tmp_path / "store", store_geometry.env())
    launcher.stop_all()


def append(server: CommitLogProcess, count: int, rng: random.Random) -> dict[int, tuple[str, int]]:
    """Append ``count`` messages (bodies of 100 B .. 3 KB); returns (topic, queue offset) by commitlog offset."""
    messages = [common_pb2.Message(topic=TOPICS[i % 2], queue_id=i % 3, body=rng.randbytes(rng.randrange(100, 3000)),
                                   properties={"KEYS": f"k-{rng.randrange(1 << 30)}"}) for i in range(count)]
    results = server.stub.AppendBatch(pb.AppendBatchRequest(messages=messages), timeout=30).results
    assert len(results) == count and all(r.status == pb.PUT_MESSAGE_STATUS_PUT_OK for r in results)
    return {r.commitlog_offset: (r.topic, r.queue_offset) for r in results}


def exported(out: Path) -> list[tuple[int, str, int]]:
    """(commitlog offset, topic, queue offset) of every exported row, in file order (duplicates kept)."""
    table = pq.read_table(out, partitioning="hive", columns=["commitlog_offset", "topic", "queue_offset"])
    return sorted(zip(table.column("commitlog_offset").to_pylist(), (str(t) for t in table.column("topic").to_pylist()),
                      table.column("queue_offset").to_pylist(), strict=True))


@pytest.mark.parametrize("store_geometry", [SMALL], indirect=True)
def test_each_run_exports_what_was_appended_since_the_last(store_geometry: GeometryPreset, live: CommitLogProcess,
                                                           spark: SparkSession, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    rng = random.Random(3)
    commitlog = live.store_dir / "commitlog"
    out = tmp_path / "out"
    appended: dict[int, tuple[str, int]] = {}
    for round_number in range(4):
        new = append(live, 60, rng)  # ~100 KB: rolls a 64 KiB file or two
        appended.update(new)
        if round_number == 2:
            # expiry of files every record of which was exported already
            oldest = list_commitlog_files(commitlog)[0]
            assert oldest.end_offset <= json.loads((out / STATE_FILE_NAME).read_text())["next_offset"]
            oldest.path.unlink()
        result = export(spark, live.store_dir, str(out), split_size=16 * 1024)
        assert result.written == len(new) and result.expired is None, round_number
        assert result.summary.corrupt_gaps == [] and result.summary.holes() == []
        rows = exported(out)
        assert [row[0] for row in rows] == sorted(appended), f"round {round_number}: duplicates or gaps"
        assert rows == sorted((offset, *where) for offset, where in appended.items())
    assert len(list_commitlog_files(commitlog)) >= 4, "the rounds rolled files"

    # Records that expire before an export reaches them are lost to it: reported, the rest exported.
    state = json.loads((out / STATE_FILE_NAME).read_text())
    before = len(appended)
    new = append(live, 150, rng)
    files = list_commitlog_files(commitlog)
    survivor = next(f for f in files if f.start_offset > state["next_offset"] and f is not files[-1])
    for file in files:
        if file.start_offset < survivor.start_offset:
            file.path.unlink()
    capsys.readouterr()
    code = mqstore_main(["pipeline", "export", str(live.store_dir), str(out), "--split-size", "16384", "--json"])
    result = json.loads(capsys.readouterr().out)
    assert code == 0 and result["ok"]
    assert result["expired"] == {"from_offset": state["next_offset"], "to_offset": survivor.start_offset}
    kept = {offset: where for offset, where in new.items() if offset >= survivor.start_offset}
    assert 0 < len(kept) < len(new) and result["records"] == len(kept)
    rows = exported(out)
    assert [row[0] for row in rows] == sorted([*appended, *kept])
    assert json.loads((out / STATE_FILE_NAME).read_text())["exported_records"] == before + len(kept)
