"""export: Parquet rows equal the RocketMQ dump's ``msg`` rows; incremental reruns; mqstore stores."""

from __future__ import annotations

import base64
import json
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from pipeline.export import (
    STAGING_PREFIX,
    STATE_FILE_NAME,
    ExportError,
    check_written,
    export,
    kafka_view,
    records_batch,
    written_rows,
)
from services.commitlog.message_store import MessageStore
from services.store.config import load_config
from services.store.formats.commitlog_walk import RecordEntry, iter_commitlog
from services.store.formats.message import (
    TRANSACTION_NOT_TYPE,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    Message,
)
from services.store.formats.record import decode_record, encode_record
from tests.conftest import StoreFactory
from tests.pipeline.conftest import PutRecord


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The exported rows (partition columns included), by commitlog offset, read with pyarrow."""
    table = pq.read_table(path, partitioning="hive")
    return sorted(table.to_pylist(), key=lambda row: int(row["commitlog_offset"]))


def test_export_matches_the_dump(spark: SparkSession, pristine_store: StoreFactory,
                                 dump_rows: Callable[..., list[dict[str, Any]]], tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = export(spark, pristine_store("normal-raw"), str(out), split_size=200_000)
    assert result.summary.records == 3000 and result.summary.problems() == []
    rows = read_rows(out)
    expected = dump_rows("normal", "msg")
    assert len(rows) == len(expected) == 3000
    for row, want in zip(rows, expected, strict=True):
        assert row["topic"] == want["topic"]
        assert (row["queue_id"], row["queue_offset"]) == (want["queueId"], want["queueOffset"])
        assert (row["commitlog_offset"], row["store_size"]) == (want["commitLogOffset"], want["storeSize"])
        assert row["msg_id"] == want["msgId"]
        assert row["uniq_key"] == want["dispatch"]["uniqKey"]
        assert " ".join(row["keys"]) == (want["dispatch"]["keys"] or "").strip()
        assert row["tags"] == want["properties"].get("TAGS")
        assert dict(row["properties"]) == want["properties"]
        assert row["body"] == (base64.b64decode(want["body"]) if want["body"] else b"")
        assert row["body_crc"] == want["bodyCRC"] and row["body_crc_ok"]
        assert (row["flag"], row["sys_flag"]) == (want["flag"], want["sysFlag"])
        assert int(row["born_timestamp"].timestamp() * 1000) == want["bornTimestamp"]
        assert int(row["store_timestamp"].timestamp() * 1000) == want["storeTimestamp"]
        assert row["store_timestamp"].utcoffset().total_seconds() == 0
        assert (row["born_host"], row["store_host"]) == (want["bornHost"], want["storeHost"])
        assert row["reconsume_times"] == want["reconsumeTimes"]
        assert row["prepared_transaction_offset"] == want["preparedTransactionOffset"]
        assert str(row["store_date"]) == row["store_timestamp"].strftime("%Y-%m-%d")
    topics = sorted(p.name for p in out.iterdir() if p.is_dir())
    assert topics == ["topic=SCHEDULE_TOPIC_XXXX", "topic=Topic-Long-Name_with.chars", "topic=TopicA", "topic=TopicB"]


def test_spark_reads_the_schema(spark: SparkSession, pristine_store: StoreFactory, tmp_path: Path) -> None:
    out = tmp_path / "out"
    export(spark, pristine_store("normal-raw"), str(out), split_size=1 << 20, decompress=True)
    frame = spark.read.parquet(str(out))
    types = dict(frame.dtypes)
    assert types["store_timestamp"] == "timestamp" and types["properties"] == "map<string,string>"
    assert types["keys"] == "array<string>" and types["store_date"] == "date"
    inflated = frame.where("body_decompressed").select("commitlog_offset", "body", "sys_flag").collect()
    assert len(inflated) == 2 and all(row.sys_flag == 0x301 for row in inflated)  # i = 1200 and 2400
    assert all(len(row.body) >= 204800 for row in inflated)
    assert frame.where("not body_crc_ok").count() == 0


def test_incremental_export(spark: SparkSession, fixture_store: StoreFactory, tmp_path: Path) -> None:
    store = fixture_store("normal-raw")
    out = tmp_path / "out"
    first = export(spark, store, str(out), from_offset=0, split_size=500_000)
    state = json.loads((out / STATE_FILE_NAME).read_text())
    assert state["next_offset"] == 3008717 == first.next_offset
    again = export(spark, store, str(out), split_size=500_000)
    assert again.from_offset == 3008717 and again.summary.records == 0
    assert len(read_rows(out)) == 3000
    # a later part only: from the first record of the second file
    part = tmp_path / "part"
    tail = export(spark, store, str(part), from_offset=1048576)
    offsets = [e.offset for e in iter_commitlog(store / "commitlog") if isinstance(e, RecordEntry)]
    assert tail.summary.records == sum(1 for o in offsets if o >= 1048576)


def test_export_of_a_mqstore_store(spark: SparkSession, mqstore_store: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = export(spark, mqstore_store, str(out), split_size=5000)
    rows = read_rows(out)
    walked = [e.record for e in iter_commitlog(mqstore_store / "commitlog") if isinstance(e, RecordEntry)]
    assert result.summary.records == len(rows) == len(walked) == 400
    for row, record in zip(rows, walked, strict=True):
        assert (row["topic"], row["queue_id"], row["queue_offset"]) == (record.topic, record.queue_id,
                                                                        record.queue_offset)
        assert row["body"] == record.body and row["body_crc"] == zlib.crc32(record.body) & 0x7FFFFFFF
        assert row["keys"] == (record.keys.split() if record.keys else [])


def test_every_record_exported_once(spark: SparkSession, varied_store: tuple[Path, dict[int, PutRecord]],
                                    tmp_path: Path) -> None:
    """Differential, by commitlog offset: the Parquet rows are the records a walk of the commitlog finds,
    which are the records put; on 40-odd files with BLANK fillers, a wholly-BLANK file, records up to
    nearly a file long crossing split edges, and several Arrow batches per split (the rows after a
    split's first batch were once dropped, silently)."""
    store, puts = varied_store
    out = tmp_path / "out"
    result = export(spark, store, str(out), split_size=40_000, batch_rows=50)
    rows = read_rows(out)
    walked = [e.offset for e in iter_commitlog(store / "commitlog") if isinstance(e, RecordEntry)]
    assert [row["commitlog_offset"] for row in rows] == walked == sorted(puts)
    for row in rows:
        put = puts[row["commitlog_offset"]]
        assert (row["topic"], row["queue_id"], row["queue_offset"], row["store_size"]) == \
            (put.topic, put.queue_id, put.queue_offset, put.size)
    assert result.written == result.summary.records == len(puts) == 3000
    assert result.summary.problems() == []
    assert not [p for p in out.iterdir() if p.name.startswith(STAGING_PREFIX)]


def test_the_written_rows_are_counted_from_the_files(spark: SparkSession, mqstore_store: Path,
                                                      tmp_path: Path) -> None:
    """What export checks before it commits a run: rows read back from the Parquet files, against the
    records decoded. Here a file is lost after the fact, and the same check refuses the output."""
    out = tmp_path / "out"
    result = export(spark, mqstore_store, str(out), split_size=5000)
    check_written(written_rows(spark, str(out)), result.summary)  # as written: whole
    victim = sorted(out.rglob("part-*.parquet"))[0]
    lost = pq.read_metadata(victim).num_rows
    victim.unlink()
    with pytest.raises(ExportError, match=f"wrote {400 - lost} rows but decoded 400 records: {lost} missing"):
        check_written(written_rows(spark, str(out)), result.summary)


def test_an_interrupted_commit_is_finished_not_repeated(spark: SparkSession, mqstore_store: Path,
                                                         tmp_path: Path) -> None:
    """The state an export leaves when it stops after its rows were checked but before all were moved
    into OUT: the next export moves the rest first, so every record is there once."""
    out = tmp_path / "out"
    first = export(spark, mqstore_store, str(out), split_size=5000)
    staging = out / f"{STAGING_PREFIX}interrupted"
    moved_back = sorted(out.rglob("part-*.parquet"))[1:]  # one file made it, the others did not
    for path in moved_back:
        target = staging / path.relative_to(out)
        target.parent.mkdir(parents=True, exist_ok=True)
        path.rename(target)
    stale = out / f"{STAGING_PREFIX}stopped-before-its-check"  # never exported: dropped
    stale.mkdir()
    (stale / "part-00000.parquet").write_bytes(moved_back[0].name.encode())
    state = json.loads((out / STATE_FILE_NAME).read_text())
    state.update(next_offset=0, exported_records=0,
                 pending={"staging": staging.name, "next_offset": first.next_offset, "records": 400})
    (out / STATE_FILE_NAME).write_text(json.dumps(state))
    again = export(spark, mqstore_store, str(out), split_size=5000)
    assert (again.resumed, again.from_offset, again.written) == (400, first.next_offset, 0)
    assert [row["commitlog_offset"] for row in read_rows(out)] == \
        [e.offset for e in iter_commitlog(mqstore_store / "commitlog") if isinstance(e, RecordEntry)]
    assert not staging.exists() and not stale.exists()
    assert json.loads((out / STATE_FILE_NAME).read_text())["exported_records"] == 400


def test_the_kafka_view_is_unique_by_topic_partition_and_offset(spark: SparkSession, tmp_path: Path) -> None:
    """PREPARED and ROLLBACK records take no queue offset (the record says 0): every one is exported,
    and the Kafka-shaped view leaves them out, so (topic, partition, offset) names one row."""
    store = tmp_path / "store"
    log = MessageStore(load_config(environ={}, mapped_file_size_commit_log=64 * 1024), store)
    log.start()
    try:
        for i in range(12):
            sys_flag = (TRANSACTION_NOT_TYPE, TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE)[i % 3]
            log.put_messages([Message("Tx", i % 2, f"m{i}".encode(), sys_flag=sys_flag)])
    finally:
        log.shutdown()
    out = tmp_path / "out"
    export(spark, store, str(out), split_size=1 << 20)
    keys = [(row["topic"], row["queue_id"], row["queue_offset"]) for row in read_rows(out)]
    assert len(keys) == 12 and len(set(keys)) == 4  # the table: every record, offsets repeating
    view = kafka_view(spark.read.parquet(str(out)))
    assert view.columns == ["topic", "partition", "offset", "timestamp", "timestampType", "key", "value", "headers"]
    rows = sorted((r.partition, r.offset, r.value) for r in view.collect())
    assert rows == [(0, 0, b"m0"), (0, 1, b"m6"), (1, 0, b"m3"), (1, 1, b"m9")]


@pytest.mark.parametrize(("body", "sys_flag", "exported", "inflated"), [
    (b"\x04\x22\x4d\x18 an LZ4 frame", 0x101, b"\x04\x22\x4d\x18 an LZ4 frame", False),  # LZ4: no codec here
    (zlib.compress(b"a stream, then") + b"more", 0x1, zlib.compress(b"a stream, then") + b"more", False),
    (zlib.compress(b"inflate me " * 9), 0x301, b"inflate me " * 9, True),
])
def test_export_decompress_keeps_a_body_the_rule_does_not_inflate(body: bytes, sys_flag: int, exported: bytes,
                                                                  inflated: bool) -> None:
    """--decompress inflates by the one rule; any other compressed body is exported as stored, its
    sys_flag kept and body_decompressed false, never a failed export."""
    record = decode_record(encode_record(topic=b"T", queue_id=0, body=body, flag=0, properties=b"", sys_flag=sys_flag,
                                         born_timestamp=1, born_host=bytes(8), store_host=bytes(8), queue_offset=0,
                                         commitlog_offset=0, store_timestamp=1))
    [row] = records_batch([record], decompress=True).to_pylist()
    assert (row["body"], row["sys_flag"], row["body_decompressed"]) == (exported, sys_flag, inflated)
