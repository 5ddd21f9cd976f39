"""Under ASYNC_FLUSH a power cut may take what was not yet flushed; recovery after an unclean stop says
how much, from every durable witness that outlived the log's tail: the indexer's dispatch checkpoint
(offsets and the store time of the newest record it indexed), the checkpoint's flushed store time, and
consumer offsets past the end of a queue (messages that were consumed, so existed). A WARNING names
the lost range and gauges export it, so the loss is bounded, measured and logged, not silent."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from services.commitlog import commit_log, metrics
from services.commitlog.flush import FlushDeadline, FlushRealTimeService
from services.commitlog.message_store import MessageStore
from services.commitlog.recovery import RecoveryResult, find_flush_loss
from services.store.config import ASYNC_FLUSH, SYNC_FLUSH, MessageStoreConfig
from services.store.formats.message import Message
from services.store.store_root import ABORT_FILE

FILE_SIZE = 64 * 1024
CONFIG = MessageStoreConfig(mapped_file_size_commit_log=FILE_SIZE, flush_disk_type=ASYNC_FLUSH)


def _write_store(root: Path, count: int) -> tuple[int, int]:
    """``count`` messages on queue 0 and 1 of "Lost", a clean stop; (end of the log, newest store time)."""
    log = MessageStore(CONFIG, root)
    log.start()
    try:
        stored = 0
        for i in range(count):
            stored = log.put_message(Message("Lost", i % 2, f"message {i} ".encode() * 60)).store_timestamp
        return log.max_offset, stored
    finally:
        log.shutdown()


def _sample(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


def test_an_unclean_stop_under_async_flush_reports_the_lost_range(tmp_path: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    root = tmp_path / "store"
    end, newest = _write_store(root, 20)
    (root / ABORT_FILE).touch()  # the power went out while it ran
    dispatch = root / "indexer" / "config" / "dispatch_checkpoint.json"
    dispatch.parent.mkdir(parents=True)
    header = {"beginTimestamp": newest - 1000, "endTimestamp": newest + 700, "beginPhyOffset": 0,
              "endPhyOffset": end + 4000, "hashSlotCount": 1, "indexCount": 30}
    dispatch.write_text(json.dumps({"version": 1, "reputOffset": end + 5000, "consumeQueueEnd": end + 5000,
                                    "indexFile": "20260101000000000", "indexHeader": header}))
    offsets = root / "query" / "config" / "consumerOffset.json"
    offsets.parent.mkdir(parents=True)
    offsets.write_text(json.dumps({"offsetTable": {"Lost@readers": {"0": 13, "1": 10}}}))  # queue 0 holds 10

    log = MessageStore(CONFIG, root)
    log.start()
    log.shutdown()
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and "ASYNC_FLUSH" in r.getMessage()]
    report = next((w for w in warnings if "lost" in w), "")
    assert f"offsets [{end}, {end + 5000})" in report, warnings
    assert f"stored after {newest}" in report and "700 ms" in report, report
    assert "Lost queue 0: readers consumed up to offset 13, the queue ends at 10" in report, report
    assert metrics.RECOVERY_FLUSH_LOSS_BYTES._value.get() == 5000
    assert metrics.RECOVERY_FLUSH_LOSS_MS._value.get() == 700
    assert metrics.RECOVERY_FLUSH_LOSS_MESSAGES._value.get() == 3


def test_what_each_witness_shows() -> None:
    found = RecoveryResult(end=1000, start=0, records=10, last_timestamp=50_000)
    assert find_flush_loss(found, 50_000, None, ()) is None  # nothing shows more than the log holds
    loss = find_flush_loss(found, 51_500, None, ())
    assert loss is not None and (loss.lost_bytes, loss.lost_ms) == (0, 1500)  # the checkpoint's flushed time
    loss = find_flush_loss(found, 50_000, (1800, 50_400), (("T", "g", 2, 9, 7),))
    assert loss is not None and (loss.lost_bytes, loss.lost_ms, loss.lost_messages) == (800, 400, 2)


def test_every_unclean_stop_under_async_flush_names_the_range_that_may_be_lost(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """No witness saw past the log (the usual case: each is written after the flush it describes), yet
    the appends of the last flush interval may be gone: the WARNING says where the log ends and from
    which store time messages may be lost, and the metrics count it."""
    root = tmp_path / "store"
    end, newest = _write_store(root, 6)
    (root / ABORT_FILE).touch()
    unclean_before = _sample("mqstore_commitlog_recovery_unclean_async_total")

    log = MessageStore(CONFIG, root)
    log.start()
    log.shutdown()
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    report = next((w for w in warnings if "ASYNC_FLUSH after an unclean stop" in w), "")
    assert f"messages stored after {newest}" in report and f"the log ends at offset {end}" in report, warnings
    assert "at most flushIntervalCommitLog (500 ms) before the stop" in report, report
    assert "at least" not in report, report  # no witness: nothing proven beyond the bound
    assert _sample("mqstore_commitlog_recovery_unclean_async_total") == unclean_before + 1
    assert _sample("mqstore_commitlog_recovery_end_store_timestamp_ms") == newest



def test_one_flush_round_covers_everything_written_before_it(tmp_path: Path) -> None:
    """An ASYNC_FLUSH round makes durable all that was written when it began: every file past a roll,
    and a tail below flushCommitLogLeastPages (not left to flushCommitLogThoroughInterval, 10 s), so an
    append waits at most one round."""
    config = MessageStoreConfig(mapped_file_size_commit_log=FILE_SIZE, flush_disk_type=ASYNC_FLUSH,
                                flush_interval_commit_log=60_000)  # the store's own service stays out of it
    log = MessageStore(config, tmp_path / "store")
    log.start()
    try:
        for _ in range(3 * FILE_SIZE // 1024):  # three files' worth, then a tail of one small record
            log.put_message(Message("Flushed", 0, bytes(900)))
        log.put_message(Message("Flushed", 0, b"the last one"))
        mfq = log.commit_log.mfq
        assert len(mfq.files) >= 3 and mfq.flushed_where == 0
        round_ = FlushRealTimeService(mfq, interval_ms=0, least_pages=4, thorough_interval_ms=10_000, timed=True)
        round_.run_once()
        assert mfq.flushed_where == log.max_offset, f"one round flushed to {mfq.flushed_where} of {log.max_offset}"
    finally:
        log.shutdown()


def test_the_next_round_starts_early_by_the_longest_recent_flush() -> None:
    deadline = FlushDeadline(0.5)
    started = time.monotonic()
    deadline.flushed(started, 0.12)
    deadline.flushed(started, 0.05)
    assert 0.3 < deadline.wait_s() <= 0.5 - 0.12  # due 0.5 s after the round began, less 0.12 s
    deadline.flushed(started - 1, 0.9)  # flushes longer than the interval: the next round is due at once
    assert deadline.wait_s() == 0


class _CaptureAtStoreTime:
    """Stands in for the put path's STORETIMESTAMP packer: the first time it is armed, copies the store
    as the disk would hold it had an fdatasync (which syncs every dirty page of the file, also those of
    a record still being written) run at that instant and the power gone right after."""

    def __init__(self, root: Path, copy: Path) -> None:
        self._struct = commit_log._I64
        self._root, self._copy = root, copy
        self.armed = False

    def __getattr__(self, name: str) -> object:
        return getattr(self._struct, name)

    def pack_into(self, buffer: bytearray, offset: int, value: int) -> None:
        if self.armed and not self._copy.exists():
            shutil.copytree(self._root, self._copy)
        self._struct.pack_into(buffer, offset, value)


def test_a_record_caught_by_a_flush_while_it_is_written_is_whole_or_absent(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A flush that catches a record before its offsets and store time are filled in must leave either
    the whole record or none of it: a record at its own offset with STORETIMESTAMP 0 reads as the newest
    record, stored at time 0, and the next start, finding the checkpoint "newer" than every record,
    refuses as if the log had been lost."""
    config = MessageStoreConfig(mapped_file_size_commit_log=FILE_SIZE, flush_disk_type=SYNC_FLUSH)
    root, cut = tmp_path / "store", tmp_path / "cut"
    capture = _CaptureAtStoreTime(root, cut)
    monkeypatch.setattr(commit_log, "_I64", capture)
    live = MessageStore(config, root)
    live.start()
    try:
        for i in range(5):
            newest = live.put_message(Message("Torn", 0, f"message {i} ".encode() * 60)).store_timestamp
        time.sleep(0.3)  # the checkpoint holds a flushed record's store time
        capture.armed = True
        live.put_message(Message("Torn", 0, b"caught while written " * 300))
    finally:
        live.shutdown()

    recovered = MessageStore(config, cut)
    recovered.start()
    try:
        assert recovered.recovery.last_timestamp == newest, recovered.recovery
    finally:
        recovered.shutdown()
