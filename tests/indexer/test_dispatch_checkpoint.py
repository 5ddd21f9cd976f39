"""The indexer store's crash recovery from its dispatch checkpoint, record by record.

A child process builds an IndexerStore from a synthetic log, saves a dispatch checkpoint (one flush
round), dispatches on and is killed with SIGKILL. The restart here must resume where the checkpoint
says (or lower, when the ConsumeQueues lost units), and after re-dispatching the rest of the log its
ConsumeQueue files and index files must equal, byte for byte, those of a store that never crashed.
Small geometry: ~20 index files of 399 entries, ConsumeQueue files of 300 units.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import pytest

from services.indexer.dispatch_checkpoint import DispatchCheckpoint, DispatchCheckpointFile
from services.indexer.indexer_store import IndexerStore
from services.store.config import MessageStoreConfig
from services.store.formats.consume_queue import CQ_STORE_UNIT_SIZE, ConsumeQueueStore
from services.store.formats.index_file import IndexFile, IndexHeader
from services.store.formats.index_service import IndexState
from services.store.formats.message import TRANSACTION_PREPARED_TYPE
from services.store.formats.record import DispatchRequest
from tests.geometry import SMALL

RECORDS = 3000
CHUNK = 25
REPO = Path(__file__).resolve().parents[2]


def config() -> MessageStoreConfig:
    """SMALL geometry; the flush thread idle (an hour), so only the explicit flush rounds checkpoint."""
    return SMALL.config(flush_interval_consume_queue=3_600_000)


def workload(prepared: Sequence[int] = ()) -> list[DispatchRequest]:
    """RECORDS records of two topics and 2 queues each, 3 keys a record (one shared by many)."""
    requests, offset, next_queue_offset = [], 0, Counter[tuple[str, int]]()
    for i in range(RECORDS):
        topic, queue_id, size = ("CkA", "CkB")[i % 3 == 0], i % 2, 150 + i % 60
        sys_flag = TRANSACTION_PREPARED_TYPE if i in prepared else 0
        queue_offset = next_queue_offset[(topic, queue_id)]
        if not sys_flag:
            next_queue_offset[(topic, queue_id)] += 1
        requests.append(DispatchRequest(True, size, topic, queue_id, offset, queue_offset, tags_code=i % 5,
                                        store_timestamp=1_800_000_000_000 + i * 37, keys=f"a{i} b{i % 7}",
                                        uniq_key=f"{i:032X}", sys_flag=sys_flag))
        offset += size
    return requests


def dispatch(store: IndexerStore, requests: Sequence[DispatchRequest]) -> None:
    """In Tail-sized chunks, each moving the reput offset past its last record."""
    for start in range(0, len(requests), CHUNK):
        chunk = requests[start:start + CHUNK]
        store.dispatch(chunk, chunk[-1].commitlog_offset + chunk[-1].msg_size)


def crash_child(root: Path, checkpointed: int, dispatched: int, prepared: Sequence[int] = ()) -> None:
    """In a child process: dispatch ``checkpointed`` records, one flush round, dispatch up to
    ``dispatched``, SIGKILL itself (no flush, no shutdown: the abort file stays)."""
    script = (
        "import json, os, signal, sys\n"
        "from services.indexer.indexer_store import IndexerStore\n"
        "from tests.indexer.test_dispatch_checkpoint import config, dispatch, workload\n"
        "root, checkpointed, dispatched, prepared = json.loads(sys.argv[1])\n"
        "requests = workload(prepared)\n"
        "store = IndexerStore(config(), root)\n"
        "store.start()\n"
        "dispatch(store, requests[:checkpointed])\n"
        "store.flush(0)\n"
        "dispatch(store, requests[checkpointed:dispatched])\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n")
    args = json.dumps([str(root), checkpointed, dispatched, list(prepared)])
    child = subprocess.run([sys.executable, "-c", script, args], cwd=REPO, capture_output=True, timeout=60,
                           check=False)
    assert child.returncode == -signal.SIGKILL, child.stderr.decode()


def finish(root: Path, requests: Sequence[DispatchRequest]) -> IndexerStore:
    """Restart on ``root`` and re-dispatch from where it resumes to the end; the store is shut down."""
    store = IndexerStore(config(), root)
    store.start()
    dispatch(store, [r for r in requests if r.commitlog_offset >= store.reput_offset])
    store.shutdown()
    return store


def never_crashed(root: Path, requests: Sequence[DispatchRequest]) -> Path:
    store = IndexerStore(config(), root)
    store.start()
    dispatch(store, requests)
    store.shutdown()
    return root


def assert_same_store(ours: Path, fresh: Path) -> None:
    """ConsumeQueue files byte for byte; index files in order with equal headers and bodies."""
    def files(root: Path) -> dict[str, bytes]:
        return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}

    assert files(ours / "consumequeue") == files(fresh / "consumequeue")

    def index(root: Path) -> list[tuple[IndexHeader, bytes]]:
        out = []
        for path in sorted((root / "index").iterdir()):
            f = IndexFile(path, SMALL.hash_slot_num, SMALL.index_num, read_only=True)
            out.append((f.stored_header(), f.body()))
            f.close()
        return out

    ours_index, fresh_index = index(ours), index(fresh)
    assert len(ours_index) == len(fresh_index) >= 20
    assert ours_index == fresh_index


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return never_crashed(tmp_path_factory.mktemp("fresh"), workload())


@pytest.mark.parametrize(("checkpointed", "dispatched"), [(1, 2), (700, 701), (1234, 2500), (2999, 3000), (10, 3000)])
def test_a_crash_resumes_at_the_checkpoint(tmp_path: Path, fresh: Path, checkpointed: int, dispatched: int) -> None:
    """Resumes exactly at the checkpoint's reput offset, whatever was dispatched after it (up to the
    whole log, many index files later), and ends up byte-identical to a store that never crashed."""
    requests = workload()
    crash_child(tmp_path, checkpointed, dispatched)
    store = finish(tmp_path, requests)
    assert store.recovery is not None and not store.recovery.clean
    assert store.recovery.resume_offset == store.recovery.checkpoint_offset == requests[checkpointed].commitlog_offset
    assert_same_store(tmp_path, fresh)


def test_prepared_records_at_the_checkpoint_do_not_pull_the_resume_point_back(tmp_path: Path) -> None:
    """The last records before the checkpoint are PREPARED: indexed, not queued, so the ConsumeQueues
    end below the checkpoint. That is not a loss: dispatch resumes at the checkpoint, and their keys
    are not indexed twice."""
    prepared = range(995, 1000)
    requests = workload(prepared)
    crash_child(tmp_path, 1000, 1600, prepared)
    store = finish(tmp_path, requests)
    assert store.recovery is not None and store.recovery.resume_offset == requests[1000].commitlog_offset
    assert_same_store(tmp_path, never_crashed(tmp_path / "fresh", requests))


@pytest.mark.parametrize("lost", ["some units", "the consumequeue directory"])
def test_consume_queues_that_lost_units_pull_the_resume_point_back(
        tmp_path: Path, fresh: Path, lost: str, caplog: pytest.LogCaptureFixture) -> None:
    """A power loss can take ConsumeQueue units the checkpoint saw (they are not msync'd with it): the
    resume point drops to where the queues end, and the index is rewound that far too."""
    requests = workload()
    crash_child(tmp_path, 2000, 2400)
    if lost == "some units":
        queues = ConsumeQueueStore(tmp_path / "consumequeue", SMALL.cq_file_size)
        queues.load_all()
        queues.recover_all()
        queues.truncate_dirty(requests[1500].commitlog_offset)
        queues.shutdown()
        expected = requests[1499].commitlog_offset + requests[1499].msg_size
    else:
        shutil.rmtree(tmp_path / "consumequeue")
        expected = 0
    with caplog.at_level(logging.WARNING):
        store = finish(tmp_path, requests)
    assert store.recovery is not None and store.recovery.resume_offset == expected
    assert "below the" in caplog.text
    assert_same_store(tmp_path, fresh)


@pytest.mark.parametrize("damage", ["garbage", "wrong version", "index files replaced", "saved file gone"])
def test_an_unusable_checkpoint_falls_back_to_rocketmqs_rule(
        tmp_path: Path, fresh: Path, damage: str, caplog: pytest.LogCaptureFixture) -> None:
    """Without a checkpoint it can use, the indexer recovers as RocketMQ does (index files newer than
    indexMsgTimestamp dropped), with a warning; the result is still a store that never crashed."""
    requests = workload()
    crash_child(tmp_path, 1500, 1800)
    path = tmp_path / "config" / "dispatch_checkpoint.json"
    saved = DispatchCheckpointFile(path).load()
    assert saved is not None and saved.index is not None and saved.index.header is not None
    if damage == "garbage":
        path.write_bytes(b"{not json")
    elif damage == "wrong version":
        path.write_bytes(path.read_bytes().replace(b'"version": 1', b'"version": 99'))
    elif damage == "index files replaced":
        header = saved.index.header
        DispatchCheckpointFile(path).save(DispatchCheckpoint(saved.reput_offset, saved.consume_queue_end, IndexState(
            saved.index.file_name, IndexHeader(header.begin_timestamp, header.end_timestamp, 12345,
                                               header.end_phy_offset, header.hash_slot_count, header.index_count))))
    else:
        (tmp_path / "index" / str(saved.index.file_name)).unlink()
    with caplog.at_level(logging.WARNING):
        store = finish(tmp_path, requests)
    assert store.recovery is not None and store.recovery.checkpoint_offset == -1
    assert "dispatch checkpoint" in caplog.text
    if damage != "saved file gone":  # a file taken from the middle stays a gap under either rule (in
        assert_same_store(tmp_path, fresh)  # service only an expired one goes: its records are gone too)


def test_a_clean_restart_resumes_at_the_reput_offset_and_changes_nothing(tmp_path: Path, fresh: Path) -> None:
    requests = workload()
    store = IndexerStore(config(), tmp_path)
    store.start()
    dispatch(store, requests[:1700])
    store.shutdown()
    index_bytes = {p.name: p.read_bytes() for p in (tmp_path / "index").iterdir()}
    again = IndexerStore(config(), tmp_path)
    again.start()
    assert again.recovery is not None and again.recovery.clean
    assert again.reput_offset == requests[1700].commitlog_offset
    assert (again.recovery.rewound_entries, again.recovery.deleted_index_files) == (0, ())
    assert {p.name: p.read_bytes() for p in (tmp_path / "index").iterdir()} == index_bytes
    dispatch(again, requests[1700:])
    again.shutdown()
    assert_same_store(tmp_path, fresh)


def test_checkpoint_file_round_trip_and_errors(tmp_path: Path) -> None:
    state = IndexState("20260101000000000", IndexHeader(1, 2, 3, 4, 5, 6))
    for checkpoint in (DispatchCheckpoint(10, 8, state), DispatchCheckpoint(0, -1, IndexState(None, None)),
                       DispatchCheckpoint(7, 7, None)):
        assert DispatchCheckpoint.decode(checkpoint.encode()) == checkpoint
    body = json.loads(DispatchCheckpoint(10, 8, state).encode())
    for bad, why in [({**body, "reputOffset": -1}, "negative reputOffset"), ({**body, "reputOffset": "1"}, "'1'"),
                     ({**body, "indexFile": None}, "both"), ({k: v for k, v in body.items() if k != "version"},
                                                             "version None")]:
        with pytest.raises(ValueError, match=why):
            DispatchCheckpoint.decode(json.dumps(bad).encode())
    assert DispatchCheckpointFile(tmp_path / "none.json").load() is None
    os.makedirs(tmp_path / "dir.json")
    assert DispatchCheckpointFile(tmp_path / "dir.json").load() is None


def test_a_saved_dispatch_checkpoint_covers_only_flushed_consume_queue_units(tmp_path: Path) -> None:
    """A flush round that saves a dispatch checkpoint first makes every ConsumeQueue unit below its reput
    offset durable, even in a queue with fewer dirty pages than flushConsumeQueueLeastPages: the restart
    checks only the largest ConsumeQueue end, so a power cut that took one quiet queue's units (while a
    busy one kept its own) resumed dispatch past them and that queue was rewritten from its file's start
    (pulls of it answered DATA_LOSS; found by tests/powercut/up_campaign.py)."""
    store = IndexerStore(config(), tmp_path)
    store.start()
    try:
        dispatch(store, workload()[:40])  # four queues of about ten units: far below two pages each
        store.flush(2)  # a FlushConsumeQueueService round (flushConsumeQueueLeastPages = 2)
        assert store.dispatch_checkpoint is not None
        assert_every_queue_flushed(store, "the saved dispatch checkpoint")
    finally:
        store.shutdown()


def test_a_saved_dispatch_checkpoint_covers_units_written_past_a_consume_queue_roll(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Units dispatched between a flush round's first pass and its snapshot can roll a queue into a new
    ConsumeQueue file: the checkpoint then covers units in two unflushed files, and one more flush per
    queue made only the first durable. After a power cut the new file's first units were gone while
    dispatch resumed past them, so the next unit went into their slot (pulls answered DATA_LOSS at the
    file's first queue offset; found by tests/powercut/test_gateway_powercut.py)."""
    per_file = SMALL.config().mapped_file_size_consume_queue // CQ_STORE_UNIT_SIZE
    requests, offset = [], 0
    for i in range(per_file + 60):
        requests.append(DispatchRequest(True, 120, "CkRoll", 0, offset, i, store_timestamp=1_800_000_000_000 + i))
        offset += 120
    store = IndexerStore(config(), tmp_path)
    store.start()
    try:
        dispatch(store, requests[:per_file - 30])
        store.flush(0)
        dispatch(store, requests[per_file - 30:per_file - 20])  # under two pages: the first pass skips it
        racing = requests[per_file - 20:]  # the dispatcher's next chunks, past the roll
        first_pass = store.consume_queues.flush_all

        def first_pass_then_dispatch(least_pages: int) -> bool:
            flushed = first_pass(least_pages)
            if racing:
                dispatch(store, racing)
                racing.clear()
            return flushed

        monkeypatch.setattr(store.consume_queues, "flush_all", first_pass_then_dispatch)
        store.flush(2)
        assert store.dispatch_checkpoint is not None and store.dispatch_checkpoint.reput_offset == offset
        files = store.consume_queues.queues()[0].mapped_file_queue
        assert len(files.files) == 2
        assert files.flushed_where == files.max_offset, \
            f"units up to {files.max_offset} below the saved dispatch checkpoint, flushed only to {files.flushed_where}"
    finally:
        store.shutdown()


def test_a_checkpoint_saved_by_a_topic_deletion_covers_only_flushed_units(tmp_path: Path) -> None:
    """A topic deletion saves a dispatch checkpoint outside a flush round (so does a truncation): the
    other topics' units below its reput offset must be durable first, as a flush round makes them."""
    store = IndexerStore(config(), tmp_path)
    store.start()
    try:
        dispatch(store, workload()[:200])  # both topics, no flush round yet
        store.delete_topic("CkA")
        assert store.dispatch_checkpoint is not None and store.dispatch_checkpoint.reput_offset == store.reput_offset
        assert_every_queue_flushed(store, "the checkpoint the deletion saved")
    finally:
        store.shutdown()


def assert_every_queue_flushed(store: IndexerStore, checkpoint: str) -> None:
    """Every ConsumeQueue unit below ``checkpoint`` (a dispatch checkpoint just saved) is durable."""
    for queue in store.consume_queues.queues():
        files = queue.mapped_file_queue
        assert files.flushed_where == files.max_offset, \
            f"{queue.topic}/{queue.queue_id}: units up to {files.max_offset} below {checkpoint}, flushed only " \
            f"to {files.flushed_where}"
