"""A replica's divergent suffix is cut crash-safely, and its queue offsets come from what is left.

apache/rocketmq#10666: a slave's truncation to the consistent point was not crash-safe: the stale tail
stayed valid on disk. Here the cut is recorded, then zeroed and fsync'd, before any bookkeeping shrinks:
a kill -9 at any step leaves nothing past the cut that reads as valid.
apache/rocketmq#7689: after the recovery to the confirm offset, new messages reused the ConsumeQueue
offsets of the cut ones. Here the queue table is rebuilt from the truncated log: each queue goes on
exactly after its last record left.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from services.commitlog.ha.epoch_file import EpochEntry, EpochFile, consistent_point
from services.commitlog.ha.truncation import TRUNCATION_FILE, finish_interrupted_truncation, truncate_log
from services.commitlog.message_store import MessageStore
from services.commitlog.put_result import PutMessageResult
from services.store.config import MessageStoreConfig
from services.store.errors import StoreError
from services.store.formats.message import Message

FILE_SIZE = 64 * 1024
REPO = Path(__file__).resolve().parents[2]
TOPIC = "Cut"

# The child process: starts the engine, truncates, and kills itself with SIGKILL after a step.
CHILD = """
import os, signal, sys
from pathlib import Path
from services.commitlog.message_store import MessageStore
from services.commitlog.ha.epoch_file import EpochFile
from services.commitlog.ha.truncation import truncate_log
from services.store.config import MessageStoreConfig
root, cut, stop_at, file_size = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
engine = MessageStore(MessageStoreConfig(mapped_file_size_commit_log=file_size), root)
engine.start()
def step(name):
    if name == stop_at:
        os.kill(os.getpid(), signal.SIGKILL)
truncate_log(engine.commit_log, EpochFile(root), cut, step)
"""


def _config(**overrides: object) -> MessageStoreConfig:
    return MessageStoreConfig(mapped_file_size_commit_log=FILE_SIZE, **overrides)  # type: ignore[arg-type]


def _fill(root: Path, count: int) -> list[PutMessageResult]:
    """``count`` messages over 3 queues (several files), a clean stop, epochs 1 and 2."""
    engine = MessageStore(_config(), root)
    engine.start()
    try:
        results = [engine.put_message(Message(TOPIC, i % 3, f"message {i} ".encode() * 20)) for i in range(count)]
    finally:
        engine.shutdown()
    epochs = EpochFile(root)
    epochs.begin(1, 0)
    epochs.begin(2, results[count // 2].commitlog_offset)
    return results


def _expected_table(results: list[PutMessageResult], cut: int) -> dict[tuple[str, int], int]:
    table: dict[tuple[str, int], int] = {}
    for r in results:
        if r.commitlog_offset < cut:
            table[(r.topic, r.queue_id)] = r.queue_offset + 1
    return table


def _check_cut(root: Path, results: list[PutMessageResult], cut: int) -> None:
    """Nothing past ``cut`` is there, the queue table is the truncated log's, new puts go on from it."""
    engine = MessageStore(_config(), root)
    engine.start()
    try:
        assert engine.max_offset == cut
        with pytest.raises(StoreError):
            engine.read(cut, 8)
        mapped = engine.commit_log.mfq.find_by_offset(cut - 1)
        assert mapped is not None
        assert not any(mapped.buffer[cut - mapped.file_from_offset:]), "stale bytes past the cut"
        assert not [p for p in (root / "commitlog").iterdir() if int(p.name) > cut]
        expected = _expected_table(results, cut)
        assert {k: v for k, v in engine.commit_log.queue_table.items() if k[0] == TOPIC} == expected
        for queue_id in range(3):
            put = engine.put_message(Message(TOPIC, queue_id, b"after the cut"))
            assert put.queue_offset == expected.get((TOPIC, queue_id), 0)
    finally:
        engine.shutdown()
    assert [e.epoch for e in EpochFile(root).entries] == ([1, 2] if cut > results[len(results) // 2]
                                                          .commitlog_offset else [1])


@pytest.mark.parametrize("stop_at", ["recorded", "invalidated", "rebuilt"])
def test_10666_kill9_mid_truncation_leaves_nothing_valid_past_the_cut(tmp_path: Path, stop_at: str) -> None:
    root = tmp_path / "store"
    results = _fill(root, 900)
    assert len(list((root / "commitlog").iterdir())) >= 3
    cut = results[int(len(results) * 0.4)].commitlog_offset  # inside an early file: later files go whole
    killed = subprocess.run([sys.executable, "-c", CHILD, str(root), str(cut), stop_at, str(FILE_SIZE)],
                            cwd=REPO, capture_output=True, text=True, timeout=60, check=False)
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert (root / TRUNCATION_FILE).exists()
    if stop_at != "recorded":
        # Past the zeroing step the disk alone says where the log ends: a plain recovery (that even
        # accepts what its records call missing) finds nothing past the cut.
        plain = tmp_path / "plain"
        shutil.copytree(root, plain)
        engine = MessageStore(_config(refuse_start_on_missing_log=False), plain)
        engine.start()
        try:
            assert engine.max_offset == cut, "records past the cut read as valid after a kill -9"
        finally:
            engine.shutdown()
    assert finish_interrupted_truncation(root, _config()) == cut
    assert not (root / TRUNCATION_FILE).exists()
    _check_cut(root, results, cut)


def test_7689_queue_offsets_go_on_from_the_truncated_log_not_from_the_cut_records(tmp_path: Path) -> None:
    root = tmp_path / "store"
    results = _fill(root, 300)
    cut = results[200].commitlog_offset
    engine = MessageStore(_config(), root)
    engine.start()
    try:
        assert truncate_log(engine.commit_log, EpochFile(root), cut) == results[-1].commitlog_offset + \
            results[-1].wrote_bytes - cut
        expected = _expected_table(results, cut)
        assert {k: v for k, v in engine.commit_log.queue_table.items() if k[0] == TOPIC} == expected
        for queue_id in range(3):  # the cut records' queue offsets are the next ones, each used once
            assert engine.put_message(Message(TOPIC, queue_id, b"new")).queue_offset == expected[(TOPIC, queue_id)]
    finally:
        engine.shutdown()
    engine = MessageStore(_config(), root)  # and a restart agrees
    engine.start()
    try:
        assert engine.commit_log.queue_table[(TOPIC, 0)] == expected[(TOPIC, 0)] + 1
    finally:
        engine.shutdown()


def test_consistent_point_is_the_end_of_the_last_epoch_both_logs_share() -> None:
    leader = [EpochEntry(1, 0), EpochEntry(2, 1000), EpochEntry(4, 3000)]
    # An old leader of epoch 3 that wrote [2500, 2900) no one else has: its epoch 2 ended at 2500.
    assert consistent_point([EpochEntry(1, 0), EpochEntry(2, 1000), EpochEntry(3, 2500)], 2900, leader, 3500) \
        == 2500
    assert consistent_point([EpochEntry(1, 0), EpochEntry(2, 1000)], 2000, leader, 3500) == 2000  # behind: keep
    assert consistent_point([EpochEntry(1, 0), EpochEntry(2, 1000)], 3200, leader, 3500) == 3000  # diverged in 2
    assert consistent_point([EpochEntry(1, 0), EpochEntry(2, 900)], 3200, leader, 3500) == 900
    assert consistent_point([], 500, leader, 3500) == 0
    assert consistent_point([], 500, [], 3500) == 500
