"""reindex equals the RocketMQ fixture's files; verify passes on consistent stores, flags damage."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from mqstore.v1 import commitlog_pb2
from pipeline import verify as verify_job
from pipeline.reindex import reindex
from pipeline.verify import verify
from services.cli import main as mqstore_main
from services.store.formats.consume_queue import BLANK_UNIT
from services.store.formats.index_file import INDEX_HEADER_SIZE, IndexHeader
from tests.commitlog.commitlog_process import start_commitlog
from tests.conftest import StoreFactory
from tests.indexer.indexer_process import start_indexer
from tests.indexer.test_indexer_fixture import FIXTURE_ENV
from tests.pipeline.services_store import ServicesStore

CRASH_END = 2034195  # the end of the crash fixture's log


def files_under(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("split_size", (100_000, 1 << 20))
def test_reindex_equals_the_fixture(spark: SparkSession, pristine_store: StoreFactory, tmp_path: Path,
                                    split_size: int) -> None:
    store = pristine_store("normal-raw")
    result = reindex(spark, store, tmp_path, split_size=split_size, cq_file_size=6000, hash_slot_num=100,
                     index_num=400)
    assert result.records == 3000 and result.queues == 8
    assert files_under(tmp_path / "consumequeue") == files_under(store / "consumequeue")
    ours = sorted((tmp_path / "index").iterdir())
    theirs = sorted((store / "index").iterdir())
    assert len(ours) == len(theirs) == 16
    for mine, reference in zip(ours, theirs, strict=True):
        data, expected = mine.read_bytes(), reference.read_bytes()
        assert IndexHeader.read(data) == IndexHeader.read(expected)
        assert data[INDEX_HEADER_SIZE:] == expected[INDEX_HEADER_SIZE:]  # slots and entries


def test_reindex_refuses_to_overwrite(spark: SparkSession, fixture_store: StoreFactory) -> None:
    with pytest.raises(FileExistsError):
        reindex(spark, fixture_store("normal-raw"))


def test_verify_passes_on_the_normal_store(spark: SparkSession, pristine_store: StoreFactory) -> None:
    report = verify(spark, pristine_store("normal-raw"), split_size=400_000)
    assert report.ok, report.as_json()
    assert (report.records, report.cq_units, report.index_files) == (3000, 3000, 16)


def test_verify_flags_the_torn_store(spark: SparkSession, pristine_store: StoreFactory, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    report_path = tmp_path / "report.json"
    code = verify_job.main([str(pristine_store("torn-raw")), "--report", str(report_path), "--split-size", "500000"])
    assert code == 1
    report = json.loads(report_path.read_text())
    assert not report["ok"] and report["records"] == 2109
    damage = report["problems"]["commitlog-damage"]
    assert [(p["offset"], p["kind"]) for p in damage] == [(2033918, "corrupt")]
    assert report["problem_counts"]["record-not-in-consumequeue"] > 0  # dispatch lagged the kill
    assert "INCONSISTENT" in capsys.readouterr().out


def test_verify_flags_a_damaged_body_and_a_lost_index(spark: SparkSession, fixture_store: StoreFactory) -> None:
    store = fixture_store("normal-raw")
    first = sorted((store / "commitlog").iterdir())[0]
    with open(first, "r+b") as handle:  # the last byte of record 1's one-byte body (record at 161, 185 B)
        handle.seek(161 + 88)
        handle.write(b"X")
    for index_file in (store / "index").iterdir():
        index_file.unlink()
    report = verify(spark, store, split_size=1 << 20)
    assert report.counts["body-crc"] == 1 and report.samples["body-crc"][0]["offset"] == 161
    assert report.counts["key-not-in-index"] > 3000


def test_reindex_then_verify_a_mqstore_store(spark: SparkSession, mqstore_store: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    (store).mkdir()
    (store / "commitlog").symlink_to(mqstore_store / "commitlog")
    before = verify(spark, store, split_size=16384)
    assert before.counts["record-not-in-consumequeue"] == 400
    result = reindex(spark, store, split_size=8192, cq_file_size=200, hash_slot_num=16, index_num=64)
    assert result.records == 400 and len(result.index_files) > 5
    after = verify(spark, store, split_size=16384)
    assert after.ok, after.as_json()


def test_verify_a_store_the_services_wrote(spark: SparkSession, services_store: ServicesStore, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """mqstore's own layout (indexer/consumequeue, indexer/index) is found without flags; the index
    geometry comes from the settings the services ran with, and without them the job says so in one
    line instead of failing inside Spark."""
    report = tmp_path / "report.json"
    args = ["pipeline", "verify", str(services_store.root), "--report", str(report)]
    assert mqstore_main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "104028-byte index file" in err[0] and "--hash-slot-num" in err[0], err
    assert not report.exists()
    assert mqstore_main([*args, "--config", str(services_store.config)]) == 0, capsys.readouterr()
    written = json.loads(report.read_text())
    assert written["ok"] and written["problem_counts"]["key-not-in-index"] == 0
    assert (written["records"], written["cq_units"], written["index_files"]) == (services_store.messages,) * 2 + (2,)


def test_reindex_into_the_mqstore_layout(spark: SparkSession, services_store: ServicesStore, tmp_path: Path) -> None:
    """Without --output, reindex writes where the store keeps the files (indexer/ in mqstore's layout),
    with the geometry of the store's settings: ConsumeQueue files equal the indexer's byte for byte."""
    store = tmp_path / "store"
    shutil.copytree(services_store.root, store)
    assert mqstore_main(["pipeline", "reindex", str(store), "--config", str(services_store.config), "--force"]) == 0
    online = services_store.root / "indexer"
    assert files_under(store / "indexer" / "consumequeue") == files_under(online / "consumequeue")
    ours, theirs = sorted((store / "indexer" / "index").iterdir()), sorted((online / "index").iterdir())
    assert len(ours) == len(theirs) == 2
    for mine, reference in zip(ours, theirs, strict=True):
        assert mine.read_bytes()[INDEX_HEADER_SIZE:] == reference.read_bytes()[INDEX_HEADER_SIZE:]
    assert not (store / "consumequeue").exists() and not (store / "index").exists()


def test_a_quarantined_record_gets_the_same_filler_unit_online_fresh_and_from_reindex(
        spark: SparkSession, pristine_store: StoreFactory, dump_rows: Callable[..., list[dict[str, Any]]],
        tmp_path: Path) -> None:
    """The differential check with a CRC-damaged record: the online indexer built its unit before the
    damage (then voided it when the commitlog quarantined the record), a fresh indexer and ``pipeline
    reindex`` build after it. All three give the same ConsumeQueue bytes, a filler unit at the lost
    record's queue offset; reindex and the fresh indexer the same index entries (none for it)."""
    rows = dump_rows("crash", "msg")
    victim = next(r for r in rows if r["commitLogOffset"] > 1_200_000 and r["bodyLen"] > 10)
    broker, online, fresh = tmp_path / "broker", tmp_path / "online", tmp_path / "fresh"
    shutil.copytree(pristine_store("crash-recovered") / "commitlog", broker / "commitlog")
    commitlog = start_commitlog(broker, FIXTURE_ENV)
    indexer = start_indexer(online, commitlog.address, FIXTURE_ENV)
    indexer.wait_caught_up(CRASH_END)
    assert indexer.stop() == 0 and commitlog.stop() == 0
    with open(broker / "commitlog" / f"{1 << 20:020d}", "r+b") as f:  # a byte of its body: a CRC mismatch
        f.seek(victim["commitLogOffset"] - (1 << 20) + 98)
        byte = f.read(1)[0]
        f.seek(victim["commitLogOffset"] - (1 << 20) + 98)
        f.write(bytes([byte ^ 0xFF]))
    commitlog = start_commitlog(broker, FIXTURE_ENV)
    try:
        info = commitlog.stub.GetStoreInfo(commitlog_pb2.GetStoreInfoRequest(), timeout=5)
        assert [(r.start_offset, r.end_offset) for r in info.quarantined_ranges] == \
            [(victim["commitLogOffset"], victim["commitLogOffset"] + victim["storeSize"])]
        for root in (online, fresh):
            indexer = start_indexer(root, commitlog.address, FIXTURE_ENV)
            indexer.wait_caught_up(CRASH_END)
            assert indexer.stop() == 0
    finally:
        assert commitlog.stop() == 0
    result = reindex(spark, broker, tmp_path / "reindex", split_size=1 << 20, cq_file_size=6000, hash_slot_num=100,
                     index_num=400)
    assert result.records == len(rows) - 1
    assert any(g.offset == victim["commitLogOffset"] and "QUARANTINED" in g.reason for g in result.gaps)
    queue = f"consumequeue/{victim['topic']}/{victim['queueId']}"
    built = files_under(tmp_path / "reindex" / queue)
    assert built == files_under(online / queue) == files_under(fresh / queue)
    unit = b"".join(built.values())[20 * victim["queueOffset"]:20 * victim["queueOffset"] + 20]
    assert unit == BLANK_UNIT
    assert files_under(tmp_path / "reindex" / "consumequeue") == files_under(online / "consumequeue") == \
        files_under(fresh / "consumequeue")
    ours, theirs = sorted((tmp_path / "reindex" / "index").iterdir()), sorted((fresh / "index").iterdir())
    assert len(ours) == len(theirs)
    for mine, reference in zip(ours, theirs, strict=True):
        assert mine.read_bytes()[INDEX_HEADER_SIZE:] == reference.read_bytes()[INDEX_HEADER_SIZE:]
