"""CommitLog recovery against real RocketMQ stores and against our own damaged logs."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from services.commitlog.message_store import MessageStore
from services.commitlog.topic_queue_table import QueueOffsetSnapshot, QueueOffsetStore
from services.store.config import MessageStoreConfig, load_config
from services.store.errors import OutOfRangeError
from services.store.formats.message import Message
from services.store.formats.record import decode_record
from services.store.store_root import StoreLockedError
from tests.conftest import StoreFactory
from tests.geometry import GeometryPreset

FIXTURE_FILE_SIZE = 1024 * 1024


def fixture_config(**overrides: Any) -> MessageStoreConfig:
    return load_config(environ={}, mapped_file_size_commit_log=FIXTURE_FILE_SIZE, **overrides)


@contextmanager
def opened(store: Path, config: MessageStoreConfig | None = None) -> Iterator[MessageStore]:
    commit_log = MessageStore(config or fixture_config(), store)
    commit_log.start()
    try:
        yield commit_log
    finally:
        commit_log.shutdown()


def commitlog_files(store: Path) -> list[str]:
    return sorted(p.name for p in (store / "commitlog").iterdir())


def msg_rows(dump_rows: Callable[..., list[dict[str, Any]]], run: str) -> list[dict[str, Any]]:
    return dump_rows(run, "msg")


@pytest.mark.parametrize("mode", ["quarantine", "cut"])  # a torn tail is cut in both recoverCorruptionModes
def test_crash_store_recovers_to_the_offset_real_rocketmq_reached(
        fixture_store: StoreFactory, dump_rows: Callable[..., list[dict[str, Any]]], mode: str) -> None:
    store = fixture_store("crash-raw")
    assert (store / "abort").exists()
    assert len(commitlog_files(store)) == 3  # the preallocated, all-zero third file
    with opened(store, fixture_config(recover_corruption_mode=mode)) as log:
        assert log.quarantine.ranges == ()
        assert log.last_exit_ok is False
        assert log.max_offset == 2034195
        rows = msg_rows(dump_rows, "crash")
        assert len(rows) == 2110
        for row in rows:
            record = decode_record(log.read(row["commitLogOffset"], row["storeSize"]))
            assert (record.topic, record.queue_id, record.queue_offset, record.body_crc) == \
                (row["topic"], row["queueId"], row["queueOffset"], row["bodyCRC"])
        # next queue offsets continue where the real store's ConsumeQueues end
        ranges = {(r["topic"], r["queueId"]): r["maxOffset"] for r in dump_rows("crash", "cqrange")
                  if r["maxOffset"] > 0}
        assert log.commit_log.queue_table == ranges
    assert commitlog_files(store) == ["00000000000000000000", "00000000000001048576"]
    assert not (store / "abort").exists()


@pytest.mark.parametrize("mode", ["quarantine", "cut"])  # a torn tail is cut in both recoverCorruptionModes
def test_torn_record_is_truncated(fixture_store: StoreFactory,
                                  dump_rows: Callable[..., list[dict[str, Any]]], mode: str) -> None:
    store = fixture_store("torn-raw")
    with opened(store, fixture_config(recover_corruption_mode=mode)) as log:
        assert log.max_offset == 2033918 and log.quarantine.ranges == ()
        assert log.commit_log.queue_table[("Topic-Long-Name_with.chars", 0)] == 210
        last = msg_rows(dump_rows, "torn")[-1]
        assert last["commitLogOffset"] + last["storeSize"] == 2033918
        # Unlike RocketMQ, the torn bytes are zeroed so they can never be read as a record again.
        mapped = log.commit_log.mfq.find_by_offset(2033918 - 1)
        assert mapped is not None
        pos = 2033918 - mapped.file_from_offset
        assert bytes(mapped.buffer[pos:pos + 277]) == bytes(277)


def test_clean_store_recovers_from_the_last_three_files(
        fixture_store: StoreFactory, dump_rows: Callable[..., list[dict[str, Any]]]) -> None:
    store = fixture_store("normal-raw")
    with opened(store) as log:
        assert log.last_exit_ok is True
        meta = dump_rows("normal", "meta")[0]
        assert log.max_offset == meta["maxPhyOffset"] == 3008717
        ranges = {(r["topic"], r["queueId"]): r["maxOffset"] for r in dump_rows("normal", "cqrange")
                  if r["maxOffset"] > 0}
        assert log.commit_log.queue_table == ranges


def test_corrupt_body_crc_stops_abnormal_recovery_at_that_record(
        fixture_store: StoreFactory, dump_rows: Callable[..., list[dict[str, Any]]]) -> None:
    """recoverCorruptionMode: cut (RocketMQ's rule); quarantine mode keeps the records after it
    (tests/commitlog/test_recovery_quarantine.py)."""
    store = fixture_store("crash-raw")
    victim = next(r for r in msg_rows(dump_rows, "crash")
                  if r["commitLogOffset"] > 1_200_000 and r["bodyLen"] > 10)
    path = store / "commitlog" / f"{FIXTURE_FILE_SIZE:020d}"
    body_pos = victim["commitLogOffset"] - FIXTURE_FILE_SIZE + 84 + 4 + 5  # a byte inside the body
    with open(path, "r+b") as f:
        f.seek(body_pos)
        byte = f.read(1)
        f.seek(body_pos)
        f.write(bytes([byte[0] ^ 0xFF]))
    with opened(store, fixture_config(recover_corruption_mode="cut")) as log:
        assert log.max_offset == victim["commitLogOffset"]


def test_crc_is_not_checked_when_check_crc_on_recover_is_off(
        fixture_store: StoreFactory, dump_rows: Callable[..., list[dict[str, Any]]]) -> None:
    store = fixture_store("crash-raw")
    victim = next(r for r in msg_rows(dump_rows, "crash") if r["bodyLen"] > 10)
    with open(store / "commitlog" / f"{0:020d}", "r+b") as f:
        f.seek(victim["commitLogOffset"] + 84 + 4 + 3)
        f.write(b"\x00")
    with opened(store, fixture_config(check_crc_on_recover=False)) as log:
        assert log.max_offset == 2034195


def small_config(**overrides: Any) -> MessageStoreConfig:
    return load_config(environ={}, mapped_file_size_commit_log=64 * 1024, **overrides)


def put_many(log: MessageStore, count: int, topic: str = "TopicT") -> list[int]:
    ends = []
    for i in range(count):
        result = log.put_message(Message(topic, i % 4, f"body-{i}".encode() * 20, properties={"KEYS": f"k{i}"}))
        ends.append(result.commitlog_offset + result.wrote_bytes)
    return ends


def test_restart_keeps_queue_offsets_across_file_rolls(tmp_path: Path) -> None:
    with opened(tmp_path, small_config()) as log:
        put_many(log, 2000)
        table = dict(log.commit_log.queue_table)
        assert len(log.commit_log.mfq.files) > 3  # normal recovery only walks the last three
    with opened(tmp_path, small_config()) as log:
        assert log.commit_log.queue_table == table
        result = log.put_message(Message("TopicT", 1, b"after restart"))
        assert result.queue_offset == table[("TopicT", 1)]


def test_crash_without_snapshot_rebuilds_queue_offsets(store_geometry: GeometryPreset, tmp_path: Path) -> None:
    with opened(tmp_path, store_geometry.config()) as log:
        put_many(log, 700)
        table = dict(log.commit_log.queue_table)
    # A snapshot from an older point: start-up replays the records written after it.
    QueueOffsetStore(tmp_path / "config" / "queue_offsets.json").save(QueueOffsetSnapshot(0, {}))
    (tmp_path / "abort").touch()
    with opened(tmp_path, store_geometry.config()) as log:
        assert log.commit_log.queue_table == table
    # A snapshot beyond the end of the log (the log lost data; a start refuses that until the loss is
    # accepted, tests/commitlog/test_missing_log.py): rebuilt from the whole log.
    QueueOffsetStore(tmp_path / "config" / "queue_offsets.json").save(
        QueueOffsetSnapshot(10**12, {("TopicT", 0): 10**6}))
    with opened(tmp_path, dataclasses.replace(store_geometry.config(), refuse_start_on_missing_log=False)) as log:
        assert log.commit_log.queue_table == table


def test_torn_tail_of_our_own_log_is_truncated(store_geometry: GeometryPreset, tmp_path: Path) -> None:
    with opened(tmp_path, store_geometry.config()) as log:
        ends = put_many(log, 300)
        last_file = log.commit_log.mfq.files[-1]
        path, start = last_file.path, last_file.file_from_offset
    torn_at = ends[-2]  # keep the first 30 bytes of the last record, zero the rest
    with open(path, "r+b") as f:
        f.seek(torn_at - start + 30)
        f.write(bytes(ends[-1] - torn_at - 30))
    (tmp_path / "abort").touch()
    with opened(tmp_path, store_geometry.config()) as log:
        assert log.max_offset == torn_at
        assert log.commit_log.queue_table[("TopicT", 299 % 4)] == 299 // 4
        again = log.put_message(Message("TopicT", 299 % 4, b"x"))
        assert again.commitlog_offset == torn_at and again.queue_offset == 299 // 4


def test_stale_records_after_a_truncation_are_not_resurrected(store_geometry: GeometryPreset, tmp_path: Path) -> None:
    """After a truncation, new records overwrite the old ones; a later crash recovery must not walk on
    into the old records left behind them (they sit at their own offsets and have valid CRCs).
    recoverCorruptionMode: cut, the mode that truncates at a damaged record with records after it."""
    config = store_geometry.config(recover_corruption_mode="cut")
    with opened(tmp_path, config) as log:
        ends = put_many(log, 50)
    cut = ends[9]
    (tmp_path / "abort").touch()
    path = tmp_path / "commitlog" / f"{0:020d}"
    with open(path, "r+b") as f:  # corrupt record #10: recovery truncates at its start
        f.seek(cut + 84 + 4 + 2)
        f.write(b"\xff\xff")
    with opened(tmp_path, config) as log:
        assert log.max_offset == cut
        # Same size as the record it replaces: the old record #11 now starts right where this ends.
        log.put_message(Message("TopicT", 10 % 4, b"body-10" * 20, properties={"KEYS": "k10"}))
        new_end = log.max_offset
        assert new_end == ends[10]
    (tmp_path / "abort").touch()
    with opened(tmp_path, config) as log:
        assert log.max_offset == new_end


def test_lock_refuses_a_second_writer(tmp_path: Path) -> None:
    with opened(tmp_path, small_config()):
        second = MessageStore(small_config(), tmp_path)
        with pytest.raises(StoreLockedError, match=f"pid.*{os.getpid()}"):
            second.start()
    with opened(tmp_path, small_config()) as log:  # released by the clean stop
        assert log.last_exit_ok


def test_clean_stop_removes_abort_and_the_preallocated_file(tmp_path: Path) -> None:
    with opened(tmp_path, small_config()) as log:
        put_many(log, 10)
        assert (tmp_path / "abort").exists()
    assert not (tmp_path / "abort").exists()
    assert commitlog_files(tmp_path) == [f"{0:020d}"]


def test_expired_files_are_deleted_and_reads_below_them_are_out_of_range(tmp_path: Path) -> None:
    hour = time.strftime("%H")
    with opened(tmp_path, small_config(delete_when=hour, file_reserved_time=72)) as log:
        put_many(log, 1500)
        files = list(log.commit_log.mfq.files)
        assert len(files) >= 5
        log.commit_log.mfq.flush_until(log.max_offset)
        old = time.time() - 100 * 3600
        for mapped in files[:3]:
            os.utime(mapped.path, (old, old))
        table = dict(log.commit_log.queue_table)
        assert log.clean_expired_files(disk_used_ratio=0.1) == [m.path for m in files[:3]]
        assert log.min_offset == files[3].file_from_offset
        with pytest.raises(OutOfRangeError, match="below the min offset"):
            log.read(0, 10)
        # Nothing expired is left: another round deletes nothing, and never the last file.
        assert log.clean_expired_files(disk_used_ratio=0.1) == []
        # A disk past diskSpaceWarningLevelRatio cleans at once, expired or not, but keeps the last file.
        assert len(log.clean_expired_files(disk_used_ratio=0.95)) == min(10, len(files) - 4)
    with opened(tmp_path, small_config()) as log:
        assert log.commit_log.queue_table == table


def test_queue_offsets_rebuilt_from_the_log_match_the_writer(tmp_path: Path) -> None:
    """The numpy rebuild (queue_offsets.replay_queue_offsets) against the writer's own table: topics of
    1 to 127 bytes (several 8-byte words, equal lengths, shared prefixes), IPv6 born hosts, and
    prepared transactions, which take no queue offset."""
    topics = ["T", "TopicA", "TopicB", "TopicA-long-name-0123456789", "TopicA-long-name-0123456780",
              "TopicA-long-name-0123456789-x", "%RETRY%g_1", "t" * 127]
    with opened(tmp_path, small_config()) as log:
        for i in range(1500):
            topic = topics[i % len(topics)]
            log.put_message(Message(topic, i // len(topics) % 3, b"x" * (i % 50), properties={"KEYS": f"k{i}"},
                                    born_host="[::1]:9" if i % 7 == 0 else "127.0.0.1:9",
                                    sys_flag=0x4 if i % 11 == 0 else 0))
        table = dict(log.commit_log.queue_table)
        assert len(table) == len(topics) * 3 and len(log.commit_log.mfq.files) > 3
    (tmp_path / "config" / "queue_offsets.json").unlink()
    (tmp_path / "config" / "queue_offsets.json.bak").unlink(missing_ok=True)
    with opened(tmp_path, small_config()) as log:
        assert log.commit_log.queue_table == table
