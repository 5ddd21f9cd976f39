"""The indexer reads the commitlog's files itself (services/indexer/commitlog_reader.py): its chunks are
the commitlog's own Tail chunks, bounded by the readable end it is told (never the write position of
a transient store pool), BLANKs checked against their file's end, quarantined ranges skipped only when
listed; and an indexer whose "files" are not the service's falls back to the byte-carrying Tail."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from mqstore.v1 import commitlog_pb2
from services.commitlog.message_store import MessageStore
from services.indexer.commitlog_reader import CommitLogFiles, FileChunk, FilesMismatch
from services.store.config import load_config
from services.store.formats.message import Message
from services.store.formats.quarantine import QuarantinedRange
from services.store.formats.record import encode_blank
from tests.commitlog.commitlog_process import CommitLogProcess, StartCommitLog
from tests.indexer.indexer_process import IndexerProcess, start_indexer
from tests.indexer.test_indexer_file_roll import (
    ENV,
    FILE_SIZE,
    append_batches,
    assert_every_record_has_its_unit,
    wait_dispatched,
)

SMALL_FILE = 64 * 1024


def make_log(root: Path, **overrides: Any) -> MessageStore:
    settings: dict[str, Any] = {"mapped_file_size_commit_log": SMALL_FILE, "max_message_size": 16 * 1024}
    log = MessageStore(load_config(environ={}, **{**settings, **overrides}), root)
    log.start()
    return log


def messages(count: int) -> list[Message]:
    """Sizes from ~100 B to ~9 KB, so records end anywhere in a file and BLANKs of every length occur."""
    return [Message("FilesT", i % 4, bytes([i % 251]) * (37 * i % 9000), properties={"KEYS": f"k{i}"})
            for i in range(count)]


def walk(read: Any, end: int) -> list[tuple[int, bytes, int, int]]:
    chunks: list[tuple[int, bytes, int, int]] = []
    offset = 0
    while True:
        chunk = read(offset)
        if chunk.next_offset == offset:
            return chunks
        chunks.append((chunk.start_offset, bytes(chunk.data), chunk.next_offset, chunk.record_count))
        offset = chunk.next_offset
        assert offset <= end or chunk.record_count == 0


@pytest.mark.parametrize("max_bytes", [1, 5000, 1 << 20])
def test_chunks_from_the_files_are_the_commitlogs_tail_chunks(tmp_path: Path, max_bytes: int) -> None:
    log = make_log(tmp_path)
    try:
        log.put_messages(messages(120))
        end = log.max_offset
        assert end > 4 * SMALL_FILE  # several rolls, each behind a BLANK
        with CommitLogFiles(tmp_path / "commitlog", SMALL_FILE) as files:
            ours = walk(lambda offset: files.chunk(offset, end, max_bytes), end)
        theirs = walk(lambda offset: log.tail_chunk(offset, max_bytes), end)
        assert ours == theirs
        assert sum(c[3] for c in ours) == 120
    finally:
        log.shutdown()


def test_nothing_past_the_readable_end_is_read(tmp_path: Path) -> None:
    """Only whole records below the readable end: a transient store pool's uncommitted records are in
    no file yet, and a record that ends past the bound waits for the next one."""
    log = make_log(tmp_path, transient_store_pool_enable=True, transient_store_pool_size=3,
                   commit_interval_commit_log=60_000, commit_commit_log_thorough_interval=60_000,
                   commit_commit_log_least_pages=1_000)
    try:
        results = log.put_messages(messages(5))
        assert log.max_offset == 0 < log.commit_log.mfq.max_wrote_offset  # written, not committed
        with CommitLogFiles(tmp_path / "commitlog", SMALL_FILE) as files:
            assert files.chunk(0, log.max_offset, 1 << 20) == FileChunk(0, b"", 0, 0)
            log.commit_log.mfq.commit(0)
            assert log.max_offset == log.commit_log.mfq.max_wrote_offset
            second_end = results[1].commitlog_offset + results[1].wrote_bytes
            chunk = files.chunk(0, second_end + 50, 1 << 20)  # the bound inside the third record
            assert (chunk.record_count, chunk.next_offset) == (2, second_end)
            assert files.chunk(second_end, second_end + 50, 1 << 20).next_offset == second_end
            assert files.chunk(0, log.max_offset, 1 << 20).record_count == 5
    finally:
        log.shutdown()


def test_a_blank_must_reach_its_files_end_and_a_quarantine_is_skipped_only_when_listed(tmp_path: Path) -> None:
    directory = tmp_path / "commitlog"
    directory.mkdir()
    log = make_log(tmp_path / "src")
    try:
        results = log.put_messages(messages(3))
        first = bytes(log.read(0, results[-1].commitlog_offset + results[-1].wrote_bytes))
    finally:
        log.shutdown()
    end = len(first)
    (directory / f"{0:020d}").write_bytes((first + encode_blank(100)).ljust(SMALL_FILE, b"\0"))
    with CommitLogFiles(directory, SMALL_FILE) as files, pytest.raises(FilesMismatch, match="must reach its file"):
        files.chunk(0, SMALL_FILE, 1 << 20)
    (directory / f"{0:020d}").write_bytes((first + encode_blank(SMALL_FILE - end)).ljust(SMALL_FILE, b"\0"))
    with CommitLogFiles(directory, SMALL_FILE) as files:
        chunk = files.chunk(0, SMALL_FILE, 1 << 20)
        assert (chunk.record_count, chunk.next_offset) == (3, SMALL_FILE)
        assert files.chunk(end, SMALL_FILE, 1 << 20) == FileChunk(end, b"", SMALL_FILE, 0)
    second = results[1].commitlog_offset
    # The second record quarantined: a chunk stops at the range, and the range is skipped announced.
    with CommitLogFiles(directory, SMALL_FILE, [(second, results[2].commitlog_offset)]) as files:
        assert files.chunk(0, SMALL_FILE, 1 << 20).next_offset == second
        assert files.chunk(second + 10, SMALL_FILE, 1 << 20) == \
            FileChunk(second + 10, b"", results[2].commitlog_offset, 0)
    # Zeros below the readable end are no record: the service must be asked again.
    with CommitLogFiles(directory, SMALL_FILE) as files, pytest.raises(FilesMismatch, match="no record"):
        files.chunk(SMALL_FILE - 4096, SMALL_FILE, 1 << 20)


@pytest.mark.parametrize("max_bytes", [1, 5000, 1 << 20])
def test_both_callers_cut_the_same_chunks_around_blanks_and_quarantined_ranges(tmp_path: Path,
                                                                               max_bytes: int) -> None:
    """The one chunk walk (services/store/formats/chunk_walk.py) as its two callers use it: the Tail's
    chunks and the indexer's file chunks stop at a quarantined range's start, skip it announced (one
    range spans a BLANK and the next file's first record, one sits inside a file), and cross BLANKs
    to the next file's start, the same chunk for chunk."""
    log = make_log(tmp_path)
    try:
        results = log.put_messages(messages(120))
        end = log.max_offset
        ends = [r.commitlog_offset + r.wrote_bytes for r in results]
        first_file = [i for i, e in enumerate(ends) if e <= SMALL_FILE]
        later = [i for i, r in enumerate(results) if r.commitlog_offset > 2 * SMALL_FILE and ends[i] < 3 * SMALL_FILE]
        across = (results[first_file[-2]].commitlog_offset, ends[first_file[-1] + 1])  # over the BLANK
        inside = (results[later[1]].commitlog_offset, ends[later[2]])
        log.quarantine.reconcile([QuarantinedRange(*across, "test"), QuarantinedRange(*inside, "test")], 0, end)
        with CommitLogFiles(tmp_path / "commitlog", SMALL_FILE, [across, inside]) as files:
            ours = walk(lambda offset: files.chunk(offset, end, max_bytes), end)
        theirs = walk(lambda offset: log.tail_chunk(offset, max_bytes), end)
        assert ours == theirs
        skips = [(start, next_offset) for start, data, next_offset, count in ours if not count]
        assert across in skips and inside in skips
        assert any(next_offset == SMALL_FILE * k for _, _, next_offset, count in ours if count for k in (2, 3))
        assert sum(c[3] for c in ours) == 120 - (first_file[-1] + 2 - first_file[-2]) - 2
    finally:
        log.shutdown()


def store_end(commitlog: CommitLogProcess) -> int:
    return int(commitlog.stub.GetStoreInfo(commitlog_pb2.GetStoreInfoRequest(), timeout=5).max_offset)


def reading(indexer: IndexerProcess) -> list[str]:
    return [r["msg"] for r in indexer.log_records() if "reading the commitlog" in r.get("msg", "")
            or "disagreed" in r.get("msg", "")]


def test_an_indexer_reads_the_files_when_they_are_here(start_commitlog: StartCommitLog, tmp_path: Path) -> None:
    commitlog = start_commitlog(tmp_path / "broker", ENV)
    indexer = start_indexer(tmp_path / "indexer", commitlog.address, ENV)
    try:
        results = append_batches(commitlog, 0, 250)  # 10 KB records: a few file rolls
        wait_dispatched(indexer, store_end(commitlog))
        assert_every_record_has_its_unit(indexer, results)
        assert any("reading the commitlog's files in" in m for m in reading(indexer)), indexer.logs()
    finally:
        assert indexer.stop() == 0


def flip_byte(path: Path, position: int) -> None:
    with open(path, "r+b") as f:
        f.seek(position)
        byte = f.read(1)[0]
        f.seek(position)
        f.write(bytes([byte ^ 0xFF]))


def test_files_that_are_not_the_services_are_not_read(start_commitlog: StartCommitLog, tmp_path: Path) -> None:
    """auto: a directory holding other bytes (a same-named directory elsewhere, a stale copy) is
    noticed at connect and the Tail is read. files (forced) on a stale copy: the files fail at the
    first record they lack, and that connection reads the Tail; nothing is lost either way."""
    commitlog = start_commitlog(tmp_path / "broker", ENV)
    first = append_batches(commitlog, 0, 40)
    stale = tmp_path / "stale"
    shutil.copytree(tmp_path / "broker" / "commitlog", stale)
    end = int(first[-1].commitlog_offset + first[-1].wrote_bytes)
    flip_byte(stale / f"{0:020d}", end - 1)  # the last record's last byte differs
    auto = start_indexer(tmp_path / "auto", commitlog.address, {**ENV, "MQSTORE_INDEXER_COMMITLOG_DIR": str(stale)})
    try:
        wait_dispatched(auto, end)
        assert any("not its files" in m and "other bytes" in m for m in reading(auto)), auto.logs()
    finally:
        assert auto.stop() == 0
    flip_byte(stale / f"{0:020d}", end - 1)  # the copy is now right, but stale: it lacks what comes next
    forced_env = {**ENV, "MQSTORE_INDEXER_COMMITLOG_DIR": str(stale), "MQSTORE_INDEXER_REPUT_SOURCE": "files"}
    forced = start_indexer(tmp_path / "forced", commitlog.address, forced_env)
    try:
        wait_dispatched(forced, end)
        later = append_batches(commitlog, 40, 200)
        deadline = time.monotonic() + 20
        while forced.status().reput_offset < store_end(commitlog) and time.monotonic() < deadline:
            time.sleep(0.02)
        wait_dispatched(forced, store_end(commitlog))
        assert_every_record_has_its_unit(forced, first + later)
        assert any("disagreed" in m for m in reading(forced)), forced.logs()
    finally:
        assert forced.stop() == 0


def test_bad_reput_source_is_a_settings_error(start_commitlog: StartCommitLog, tmp_path: Path) -> None:
    commitlog = start_commitlog(tmp_path / "broker", ENV)
    with pytest.raises(RuntimeError, match="MQSTORE_INDEXER_REPUT_SOURCE"):
        start_indexer(tmp_path / "indexer", commitlog.address, {"MQSTORE_INDEXER_REPUT_SOURCE": "nfs"}, timeout_s=10)


def test_positions_tail_sends_only_the_readable_end(start_commitlog: StartCommitLog, tmp_path: Path) -> None:
    commitlog = start_commitlog(tmp_path / "broker", ENV)
    append_batches(commitlog, 0, 10)
    end = store_end(commitlog)
    stream = commitlog.stub.Tail(commitlog_pb2.TailRequest(from_offset=0, poll_wait_ms=100, positions_only=True),
                                 timeout=10)
    first = next(stream)
    assert (first.start_offset, first.next_offset, first.max_offset, first.record_count, first.data) == \
        (end, end, end, 0, b"")
    append_batches(commitlog, 10, 30)
    grown = next(stream)
    while grown.max_offset < store_end(commitlog):
        grown = next(stream)
    assert grown.max_offset == store_end(commitlog) and not grown.data
    stream.cancel()
    with pytest.raises(Exception) as caught:
        next(iter(commitlog.stub.Tail(commitlog_pb2.TailRequest(from_offset=FILE_SIZE * 50, positions_only=True),
                                      timeout=10)))
    assert "outside the log" in str(caught.value)


def test_with_a_transient_store_pool_the_files_are_read_up_to_the_commit(start_commitlog: StartCommitLog,
                                                                         tmp_path: Path) -> None:
    """The pool's records reach the file only when committed: the readable end the indexer follows
    is the committed offset, and every record is dispatched once committed, across file rolls."""
    env = {**ENV, "MQSTORE_TRANSIENT_STORE_POOL_ENABLE": "true", "MQSTORE_TRANSIENT_STORE_POOL_SIZE": "3",
           "MQSTORE_COMMIT_INTERVAL_COMMIT_LOG": "100"}
    commitlog = start_commitlog(tmp_path / "broker", env)
    indexer = start_indexer(tmp_path / "indexer", commitlog.address, {**env, "MQSTORE_INDEXER_REPUT_SOURCE": "files"})
    try:
        results = append_batches(commitlog, 0, 250)
        wait_dispatched(indexer, int(results[-1].commitlog_offset + results[-1].wrote_bytes))
        info = commitlog.stub.GetStoreInfo(commitlog_pb2.GetStoreInfoRequest(), timeout=5)
        assert info.transient_store_pool_enable and indexer.status().reput_offset <= info.committed_offset
        assert_every_record_has_its_unit(indexer, results)
        assert any("reading the commitlog's files in" in m for m in reading(indexer)), indexer.logs()
    finally:
        assert indexer.stop() == 0
