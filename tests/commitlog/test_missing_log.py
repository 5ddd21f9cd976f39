"""A log shorter than the store's own records say it was is a loud loss, not a silent one.

The queue-offset snapshot (saved once the log is flushed that far), the checkpoint's physicMsgTimestamp
and the indexer's dispatch checkpoint each say how far the log reached. When recovery finds less (files
whose names a power cut took, files deleted by hand), the service logs an ERROR naming what is missing,
exports it, and refuses to start (exit 4, nothing changed) until an operator accepts the loss with
refuseStartOnMissingLog=false. Before, it served what it found ("offsets [0, 0)") without a word.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from services.commitlog import metrics
from services.commitlog.message_store import MessageStore
from services.commitlog.recovery import MissingLogError, RecoveryResult, find_missing_log
from services.store.config import ASYNC_FLUSH, SYNC_FLUSH, MessageStoreConfig
from services.store.formats.message import Message
from services.store.formats.record_scan import Damage
from tests.commitlog.commitlog_process import StartCommitLog, commitlog_env, free_port, mqstore_command

KIB = 1024
FILE_SIZE = 64 * KIB


def _write_store(root: Path, count: int, flush: str = SYNC_FLUSH) -> int:
    """``count`` messages, a clean stop; returns the end of the log."""
    log = MessageStore(MessageStoreConfig(mapped_file_size_commit_log=FILE_SIZE, flush_disk_type=flush), root)
    log.start()
    try:
        for i in range(count):
            log.put_message(Message("Lost", i % 2, f"message {i} ".encode() * 60))
        return log.max_offset
    finally:
        log.shutdown()


def _digests(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


def _serve(root: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The service on ``root`` until it exits by itself (a refusal), at most 60 s."""
    return subprocess.run([*mqstore_command(), "serve", "commitlog", "--store", str(root),
                           "--listen", f"127.0.0.1:{free_port()}"],
                          env=commitlog_env({"MQSTORE_MAPPED_FILE_SIZE_COMMIT_LOG": str(FILE_SIZE), **(env or {})}),
                          capture_output=True, text=True, timeout=60, check=False)


def test_lost_files_refuse_the_start_until_the_loss_is_accepted(tmp_path: Path,
                                                                start_commitlog: StartCommitLog) -> None:
    root = tmp_path / "store"
    end = _write_store(root, 300)
    files = sorted((root / "commitlog").iterdir())
    assert len(files) >= 3
    for lost in files[-2:]:  # their names were not durable: a power cut took them
        lost.unlink()
    before = _digests(root / "commitlog")

    done = _serve(root)
    assert done.returncode == 4, f"a store missing acknowledged log must not start:\n{done.stderr[-3000:]}"
    assert "LESS LOG" in done.stderr and f"durable up to offset {end}" in done.stderr, done.stderr[-3000:]
    assert "MQSTORE_REFUSE_START_ON_MISSING_LOG=false" in done.stderr
    assert _digests(root / "commitlog") == before, "a refused start changes nothing"

    accepted = start_commitlog(root, {"MQSTORE_MAPPED_FILE_SIZE_COMMIT_LOG": str(FILE_SIZE),
                                      "MQSTORE_REFUSE_START_ON_MISSING_LOG": "false"})
    assert any(r["level"] == "ERROR" and "Starting anyway" in r["msg"] for r in accepted.log_records())
    accepted.stop()
    again = start_commitlog(root, {"MQSTORE_MAPPED_FILE_SIZE_COMMIT_LOG": str(FILE_SIZE)})
    assert not [r for r in again.log_records() if r["level"] == "ERROR"], "the accepted loss is not reported again"


def test_a_checkpoint_newer_than_every_record_refuses_the_start(tmp_path: Path) -> None:
    root = tmp_path / "store"
    _write_store(root, 40)
    (root / "config" / "queue_offsets.json").unlink()
    (root / "config" / "queue_offsets.json.bak").unlink(missing_ok=True)
    for path in (root / "commitlog").iterdir():
        path.unlink()  # every name lost: only the checkpoint remembers that records were flushed
    log = MessageStore(MessageStoreConfig(mapped_file_size_commit_log=FILE_SIZE), root)
    with pytest.raises(MissingLogError, match="no record was found"):
        log.start()
    assert metrics.RECOVERY_MISSING_MS.collect()[0].samples[0].value > 0


def test_dispatched_but_unflushed_records_under_async_flush_are_a_warning(tmp_path: Path,
                                                                          caplog: pytest.LogCaptureFixture) -> None:
    root = tmp_path / "store"
    end = _write_store(root, 20, ASYNC_FLUSH)
    dispatch = root / "indexer" / "config" / "dispatch_checkpoint.json"
    dispatch.parent.mkdir(parents=True)
    dispatch.write_text(json.dumps({"version": 1, "reputOffset": end + 5000, "consumeQueueEnd": end + 5000}))
    log = MessageStore(MessageStoreConfig(mapped_file_size_commit_log=FILE_SIZE, flush_disk_type=ASYNC_FLUSH), root)
    log.start()
    log.shutdown()
    assert "the loss the flush policy allows (5000 bytes)" in caplog.text
    assert metrics.RECOVERY_MISSING_BYTES.labels("dispatched")._value.get() == 5000
    with pytest.raises(MissingLogError, match="indexer dispatched records up to offset"):
        config = MessageStoreConfig(mapped_file_size_commit_log=FILE_SIZE, flush_disk_type=SYNC_FLUSH)
        MessageStore(config, root).start()


def test_what_counts_as_missing() -> None:
    found = RecoveryResult(end=1000, start=0, records=10, last_timestamp=50_000)
    assert find_missing_log(found, 50_000, 1000, 1000) is None
    assert find_missing_log(found, 52_000, None, None) is None  # within the 3 s margin for a clock stepped back
    missing = find_missing_log(found, 60_000, 1500, None)
    assert missing is not None and (missing.durable_missing_bytes, missing.missing_ms) == (500, 10_000)
    torn = RecoveryResult(end=1000, start=0, records=10, last_timestamp=50_000,
                          damage=Damage(offset=1000, reason="torn", dropped_bytes=700, intact_records=0))
    assert find_missing_log(torn, 60_000, 1500, None) is None  # recovery's own cut, already reported


@pytest.mark.parametrize("lost", ["bytes", "name"])
def test_a_log_lost_right_after_the_start_refuses_the_next_start(tmp_path: Path, lost: str) -> None:
    """The power goes out a moment after the first acknowledged appends, well before the checkpoint
    service's round (flushIntervalConsumeQueue), on a file system that dropped the log's bytes or its
    file's name: the checkpoint must already say that flushed records existed, or the next start
    serves an empty log without a word."""
    config = MessageStoreConfig(mapped_file_size_commit_log=FILE_SIZE, flush_disk_type=SYNC_FLUSH,
                                flush_interval_consume_queue=30_000)
    root, cut = tmp_path / "store", tmp_path / "cut"
    live = MessageStore(config, root)
    live.start()
    try:
        for i in range(5):
            live.put_message(Message("Lost", 0, f"message {i} ".encode() * 60))
        time.sleep(0.5)
        shutil.copytree(root, cut)  # what the disk holds at the cut, the log's own loss aside
    finally:
        live.shutdown()
    for path in (cut / "commitlog").iterdir():
        if lost == "name":
            path.unlink()
        else:
            path.write_bytes(bytes(path.stat().st_size))

    with pytest.raises(MissingLogError, match="the checkpoint says records stored up to"):
        MessageStore(config, cut).start()
