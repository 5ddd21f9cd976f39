"""A full disk is refused as RESOURCE_EXHAUSTED ("disk full", naming the disk and its use) before any
write meets ENOSPC, a write that meets it anyway leaves no half-created file, and writes resume by
themselves once space is freed. On a real small filesystem (tmpfs, else an ext4 loop file)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from mqstore.v1 import commitlog_pb2, common_pb2, query_pb2
from services.commitlog.message_store import MessageStore
from services.commitlog.topic_config import TopicConfigManager
from services.indexer.indexer_store import IndexerStore
from services.indexer.reput import ReputService
from services.store.config import load_config
from services.store.errors import DiskFullError
from services.store.formats.mapped_file_queue import MappedFileQueue
from services.store.formats.message import Message
from services.store.formats.record import DispatchRequest, parse_dispatch_requests
from services.store.formats.table_journal import encode_entry, journal_path
from services.store.formats.topics_file import put_entry
from services.store.formats.transient_store_pool import TransientStorePool
from services.store.rules.topics import TopicConfig
from tests.commitlog.commitlog_process import StartCommitLog
from tests.commitlog.commitlog_process import start_commitlog as start_commitlog_process
from tests.commitlog.small_disk import MIB, fill, small_filesystem, until_accepted
from tests.indexer.indexer_process import start_indexer
from tests.query.query_process import start_query

FILE_SIZE = 2 * MIB
PAGE = 4096
BODY = b"d" * 30_000


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    with small_filesystem(tmp_path, 32) as mounted:
        yield mounted


def assert_refusal(text: str, disk: Path) -> None:
    """The refusal says it is the disk, which disk, and how full it is."""
    assert "disk full" in text and str(disk) in text and "% used" in text and "MiB free" in text, text


def store_files(directory: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in directory.iterdir()} if directory.is_dir() else {}


def wait_until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


# -- file creation on a full disk (what a racing filler causes): no half-created file ------------------

def test_a_file_creation_that_meets_enospc_leaves_no_file(disk: Path) -> None:
    fill(disk / "ballast", leave_bytes=MIB)
    pool = TransientStorePool(1, 4 * MIB)
    mfq = MappedFileQueue(disk / "commitlog", 4 * MIB, pool, preallocate=False)
    mfq.load()
    try:
        with pytest.raises(DiskFullError) as refused:
            mfq.last_file_for_append()
        assert_refusal(str(refused.value), disk)
        assert "No space left on device" in str(refused.value)
        assert store_files(disk / "commitlog") == {}, "the partly allocated file must be removed"
        assert pool.available == 1, "the pool buffer of the failed file goes back"
        (disk / "ballast").unlink()
        assert mfq.last_file_for_append().file_from_offset == 0, "the same file is created once there is room"
        assert store_files(disk / "commitlog") == {"00000000000000000000": 4 * MIB}
    finally:
        mfq.shutdown()
        pool.close()


def test_a_failed_background_allocation_leaves_nothing_and_is_retried_when_the_roll_needs_it(disk: Path) -> None:
    fill(disk / "ballast", leave_bytes=6 * MIB)  # room for one 4 MiB file, not two
    mfq = MappedFileQueue(disk / "commitlog", 4 * MIB, preallocate=True)
    mfq.load()
    try:
        first = mfq.last_file_for_append()  # file 0 now; file 1 in the background, which meets ENOSPC
        with pytest.raises(DiskFullError) as refused:
            mfq.prepare_next_files(1)  # the roll's turn: tried again, still no room
        assert_refusal(str(refused.value), disk)
        assert store_files(disk / "commitlog") == {first.path.name: 4 * MIB}, "no half-created file 1"
        (disk / "ballast").unlink()
        mfq.prepare_next_files(1)
        first.wrote_position = first.file_size  # the writer reached its end
        assert mfq.last_file_for_append().file_from_offset == 4 * MIB
        mfq.prepare_next_files(1)  # waits for the background creation of file 2 (there is room now)
        assert set(store_files(disk / "commitlog").values()) == {4 * MIB}
    finally:
        mfq.shutdown()


# -- the engine: watermark before ENOSPC, whole batches, resuming ---------------------------------------

def make_log(root: Path, **overrides: Any) -> MessageStore:
    settings: dict[str, Any] = {"mapped_file_size_commit_log": FILE_SIZE, "max_message_size": 64 * 1024,
                                "flush_interval_consume_queue": 100, "clean_resource_interval": 3_600_000}
    settings.update(overrides)
    log = MessageStore(load_config(environ={}, **settings), root)
    log.start()
    return log


def put_until_refused(log: MessageStore, batch: int = 8) -> DiskFullError:
    for _ in range(10_000):
        try:
            log.put_messages([Message("Filled", 0, BODY)] * batch)
        except DiskFullError as exc:
            return exc
    raise AssertionError("the disk never filled up")


def test_the_watermark_refuses_writes_before_the_disk_runs_out(disk: Path) -> None:
    log = make_log(disk / "store")
    try:
        refused = put_until_refused(log)
        assert_refusal(str(refused), disk)
        assert "the next 2.0 MiB commitlog file" in str(refused) and "diskSpaceWarningLevelRatio 0.90" in str(refused)
        files = store_files(disk / "store" / "commitlog")
        assert set(files.values()) == {FILE_SIZE}, f"only whole files: {files}"
        st = os.statvfs(disk)
        assert st.f_bavail * st.f_frsize >= FILE_SIZE, "refused while there was still room: no ENOSPC"
        assert log.disk_full
        before = log.max_offset, dict(log.commit_log.queue_table)
        with pytest.raises(DiskFullError):
            log.put_message(Message("Filled", 0, b"small"))
        assert (log.max_offset, dict(log.commit_log.queue_table)) == before
    finally:
        log.shutdown()


def test_a_batch_whose_roll_cannot_get_a_file_is_refused_whole(disk: Path) -> None:
    log = make_log(disk / "store", disk_space_warning_level_ratio=0.99)
    try:
        log.put_messages([Message("Whole", 0, BODY)] * 40)  # about 1.2 of the 2 MiB of file 0
        log.commit_log.mfq.prepare_next_files(1)  # file 1 is there (the background creation, finished)
        fill(disk / "ballast", leave_bytes=FILE_SIZE // 2)  # but no room for file 2
        before = log.max_offset, dict(log.commit_log.queue_table), store_files(disk / "store" / "commitlog")
        # 3 MB: the rest of file 0, all of file 1, then file 2, which cannot be created.
        with pytest.raises(DiskFullError) as refused:
            log.put_messages([Message("Whole", 1, BODY)] * 100)
        assert_refusal(str(refused.value), disk)
        after = log.max_offset, dict(log.commit_log.queue_table), store_files(disk / "store" / "commitlog")
        assert after == before, \
            "nothing of a refused batch may be written"
        (disk / "ballast").unlink()
        wait_until(lambda: not log.disk_full)
        results = log.put_messages([Message("Whole", 1, BODY)] * 100)
        assert [r.queue_offset for r in results] == list(range(100))
        assert results[-1].commitlog_offset > 2 * FILE_SIZE
    finally:
        log.shutdown()


def test_another_tenant_filling_the_disk_is_refused_within_a_refresh_then_writes_resume(disk: Path) -> None:
    log = make_log(disk / "store")
    try:
        log.put_message(Message("Tenant", 0, b"first"))
        fill(disk / "ballast", leave_bytes=MIB)  # > 90% used: RocketMQ's "disk full"
        wait_until(lambda: log.disk_full, timeout_s=5)
        with pytest.raises(DiskFullError) as refused:
            log.put_message(Message("Tenant", 0, b"refused"))  # the current file has room: the ratio refuses
        assert "above diskSpaceWarningLevelRatio 0.90" in str(refused.value)
        assert_refusal(str(refused.value), disk)
        (disk / "ballast").unlink()
        wait_until(lambda: not log.disk_full, timeout_s=5)
        assert log.put_message(Message("Tenant", 0, b"again")).queue_offset == 1
    finally:
        log.shutdown()


def test_a_new_topic_on_a_full_disk_is_refused_without_writing_topics_json(disk: Path) -> None:
    log = make_log(disk / "store")
    try:
        log.put_message(Message("Known", 0, b"x"))
        fill(disk / "ballast", leave_bytes=0)
        wait_until(lambda: log.disk_full, timeout_s=5)
        with pytest.raises(DiskFullError):
            log.put_message(Message("BrandNew", 0, b"x"))
        assert log.topics.get("BrandNew") is None
        assert not any(p.name.endswith(".tmp") for p in (disk / "store" / "config").iterdir())
    finally:
        (disk / "ballast").unlink(missing_ok=True)
        log.shutdown()


def test_a_stop_on_a_full_disk_is_clean_and_loses_nothing(disk: Path) -> None:
    log = make_log(disk / "store")
    results = log.put_messages([Message("Stop", 0, BODY)] * 10)
    fill(disk / "ballast", leave_bytes=0)  # the queue offset snapshot of the stop cannot be written
    log.shutdown()
    assert not (disk / "store" / "abort").exists()
    (disk / "ballast").unlink()
    again = make_log(disk / "store")
    try:
        assert again.commit_log.queue_table[("Stop", 0)] == 10 and again.max_offset == results[-1].commitlog_offset + \
            results[-1].wrote_bytes
    finally:
        again.shutdown()


def test_a_topics_json_write_that_meets_enospc_fails_cleanly(disk: Path) -> None:
    """The race the watermark cannot see: the disk fills between the check and the write."""
    path = disk / "config" / "topics.json"
    topics = TopicConfigManager(path)
    journal = journal_path(path)  # a change is one entry appended to the table's journal
    block = os.statvfs(disk).f_bsize
    entry = len(encode_entry(put_entry("After", {"read_queue_nums": 1, "write_queue_nums": 1, "perm": 6})))
    before = 0
    while before == 0 or block - journal.stat().st_size % block >= entry:  # the next entry needs a new block
        topics.create(TopicConfig(f"Before{before}", 1, 1))
        before += 1
    written = journal.read_bytes()
    fill(disk / "ballast", leave_bytes=0)
    with pytest.raises(DiskFullError) as refused:
        topics.create(TopicConfig("After", 1, 1))
    assert_refusal(str(refused.value), disk)
    assert journal.read_bytes() == written and sorted(p.name for p in path.parent.iterdir()) == [journal.name]
    assert topics.get("After") is None
    (disk / "ballast").unlink()
    topics.create(TopicConfig("After", 1, 1))
    reloaded = TopicConfigManager(path)
    reloaded.load()
    assert [c.topic for c in reloaded.list()] == ["After", *sorted(f"Before{i}" for i in range(before))]


# -- the commitlog service: RESOURCE_EXHAUSTED over gRPC, no traceback, resuming --------------------------

def test_the_service_answers_resource_exhausted_then_resumes(disk: Path, start_commitlog: StartCommitLog) -> None:
    # The store is the mount itself, so the service's log (next to the store) stays off the full disk.
    server = start_commitlog(disk, {"MQSTORE_MAPPED_FILE_SIZE_COMMIT_LOG": str(FILE_SIZE),
                                    "MQSTORE_FLUSH_INTERVAL_CONSUME_QUEUE": "200",
                                    "MQSTORE_CLEAN_RESOURCE_INTERVAL": "3600000"})
    fill(disk / "ballast", leave_bytes=5 * FILE_SIZE)
    batch = commitlog_pb2.AppendBatchRequest(messages=[common_pb2.Message(topic="Svc", body=BODY)] * 8)
    with pytest.raises(grpc.RpcError) as refused:
        for _ in range(1000):
            server.stub.AppendBatch(batch, timeout=10)
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, refused.value
    assert_refusal(refused.value.details() or "", disk)
    assert set(store_files(disk / "commitlog").values()) == {FILE_SIZE}
    (disk / "ballast").unlink()
    until_accepted(lambda: server.stub.AppendBatch(batch, timeout=10), timeout_s=10)
    logs = server.logs()
    assert "Traceback" not in logs and "Errno 28" not in logs, logs[-3000:]
    assert "refusing writes" in logs and "accepting writes again" in logs


# -- the indexer's headroom: what was acknowledged stays pullable and findable ------------------------

# ConsumeQueue files of 1 MiB: on a nearly full disk a queue's first (or next) file is a big share of
# what is left, so the refusal has to leave room for them.
HEADROOM_ENV = {"MQSTORE_MAPPED_FILE_SIZE_COMMIT_LOG": str(FILE_SIZE),
                "MQSTORE_MAPPED_FILE_SIZE_CONSUME_QUEUE": str(52_428 * 20),
                "MQSTORE_MAX_HASH_SLOT_NUM": "1000", "MQSTORE_MAX_INDEX_NUM": "4000",
                "MQSTORE_FLUSH_INTERVAL_CONSUME_QUEUE": "200", "MQSTORE_CLEAN_RESOURCE_INTERVAL": "3600000"}


def test_a_put_that_starts_consumequeue_pages_the_disk_has_no_room_for_is_refused(disk: Path) -> None:
    """The headroom is kept when the indexer's files share the disk: ConsumeQueue files are sparse, and
    the put path counts the pages its messages start, before the indexer has written them."""
    (disk / "store" / "indexer" / "consumequeue").mkdir(parents=True)
    log = make_log(disk / "store", mapped_file_size_consume_queue=52_428 * 20, max_hash_slot_num=1000,
                   max_index_num=4000, flush_interval_consume_queue=3_600_000,  # no refresh during the test
                   disk_space_warning_level_ratio=0.99)  # the headroom refuses, not the ratio
    try:
        log.put_message(Message("Warm", 0, b"w"))
        log.topics.get_or_create("Room")  # topics.json is not rewritten on the full disk
        wait_until(lambda: len(store_files(disk / "store" / "commitlog")) == 2)  # the next file, made ahead
        log.disk.refresh()
        # Warm's first page and its next (the indexer has written neither), an index file, checkpoints
        headroom = log.disk.headroom
        assert headroom.queues == 1 and headroom.consume_queue == 2 * PAGE and headroom.queue_page_size == PAGE
        fill(disk / "ballast", leave_bytes=headroom.total + 3 * PAGE + PAGE // 2)
        log.disk.refresh()
        results = [log.put_message(Message("Room", q, b"r")) for q in range(3)]  # 3 new pages
        log.put_message(Message("Room", 0, b"again"))  # no new page: accepted
        with pytest.raises(DiskFullError) as refused:
            log.put_message(Message("Room", 3, b"r"))
        assert_refusal(str(refused.value), disk)
        assert "the 1 new ConsumeQueue pages of these messages (4 KiB) do not fit next to the " in \
            str(refused.value), refused.value
        assert [r.queue_offset for r in results] == [0, 0, 0] and ("Room", 3) not in log.commit_log.queue_table
        log.disk.refresh()  # the indexer has written none of the 3 pages: each is counted, and the next one
        assert log.disk.headroom.queues == 4 and log.disk.headroom.consume_queue == 2 * PAGE + 3 * 2 * PAGE
        with pytest.raises(DiskFullError) as refused:
            log.put_message(Message("Room", 0, b"r"))
        assert "MiB kept for the indexer to write what was acknowledged" in str(refused.value)
        assert "(or lower mappedFileSizeConsumeQueue or maxIndexNum, or give the indexer's files a disk of their " \
            "own)" in str(refused.value)
        log.delete_topic("Warm")  # the indexer writes nothing more for a deleted topic
        log.disk.refresh()
        assert log.disk.headroom.queues == 3
    finally:
        log.shutdown()


def test_at_the_threshold_every_acked_message_stays_pullable_and_findable_by_uniq_key(disk: Path) -> None:
    """The commitlog, indexer and query service share the small disk, as under ``mqstore up``."""
    # The headroom refuses, not the ratio (1.5 MiB left of 32 MiB is above 0.90).
    commitlog = start_commitlog_process(disk, {**HEADROOM_ENV, "MQSTORE_DISK_SPACE_WARNING_LEVEL_RATIO": "0.99"})
    indexer = start_indexer(disk / "indexer", commitlog.address, HEADROOM_ENV)
    query = start_query(disk / "query", commitlog.address, indexer.address, HEADROOM_ENV)
    try:
        warm = common_pb2.Message(topic="Warm", body=b"w", born_host="127.0.0.1:50000")
        first = commitlog.stub.Append(commitlog_pb2.AppendRequest(message=warm), timeout=10)
        indexer.wait_caught_up(first.commitlog_offset + first.wrote_bytes, timeout_s=10)
        wait_until(lambda: len(store_files(disk / "commitlog")) == 2)  # the next file, made ahead
        # 1.5 MiB left: the commitlog's files have room, but every new queue needs ConsumeQueue pages
        # (and the indexer its checkpoints and index file): far fewer than 300 new queues fit.
        fill(disk / "ballast", leave_bytes=3 * MIB // 2)
        time.sleep(0.5)  # the commitlog sees the ballast at its next refresh (every 200 ms here)
        acked: list[tuple[str, commitlog_pb2.AppendResult]] = []
        refused: list[grpc.RpcError] = []
        for i in range(300):
            key = uuid.uuid4().hex.upper()
            message = common_pb2.Message(topic=f"Headroom{i // 8}", queue_id=i % 8, body=b"h" * 1000,
                                         born_host="127.0.0.1:50000", properties={"UNIQ_KEY": key})
            try:
                acked.append((key, commitlog.stub.Append(commitlog_pb2.AppendRequest(message=message), timeout=10)))
            except grpc.RpcError as exc:
                refused.append(exc)
        assert acked and refused, (len(acked), len(refused), refused and refused[0].details())
        assert all(e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED for e in refused), refused[0]
        assert_refusal(refused[-1].details() or "", disk)
        last = acked[-1][1]
        indexer.wait_caught_up(last.commitlog_offset + last.wrote_bytes, timeout_s=10)
        for key, result in acked:
            pulled = query.stub.PullMessage(query_pb2.PullMessageRequest(
                topic=result.topic, queue_id=result.queue_id, queue_offset=result.queue_offset, max_messages=1),
                timeout=10)
            assert [m.commitlog_offset for m in pulled.messages] == [result.commitlog_offset], (result, pulled)
            found = query.stub.ViewMessage(query_pb2.ViewMessageRequest(
                msg_id=key, topic=result.topic, kind=query_pb2.MESSAGE_ID_KIND_UNIQ_KEY), timeout=10)
            assert found.message.commitlog_offset == result.commitlog_offset
        logs = indexer.logs()
        assert "No space left on device" not in logs and "Errno 28" not in logs, logs[-3000:]
        (disk / "ballast").unlink()
        until_accepted(lambda: commitlog.stub.Append(commitlog_pb2.AppendRequest(message=warm), timeout=10), 10)
    finally:
        for handle in (query, indexer, commitlog):
            assert handle.stop() == 0, handle.logs()[-3000:]


# -- the indexer on a full disk: it waits where it is and goes on without a loss or a double --------------

def records(root: Path, count: int) -> tuple[list[DispatchRequest], int]:
    """``count`` records in 3 queues, each with its own key, written by a commitlog off the small disk."""
    log = make_log(root)
    try:
        for i in range(count):
            log.put_message(Message("Wait", i % 3, b"w", properties={"KEYS": f"key-{i}"}))
        return parse_dispatch_requests(log.read(0, log.max_offset), 0), log.max_offset
    finally:
        log.shutdown()


def test_the_indexer_waits_at_its_reput_offset_while_the_disk_is_full_then_goes_on(
        disk: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    requests, end = records(tmp_path / "commitlog", 30)
    config = load_config(environ={}, mapped_file_size_consume_queue=52_428 * 20, max_hash_slot_num=1000,
                         max_index_num=4000)
    store = IndexerStore(config, disk / "indexer")
    store.start()
    try:
        fill(disk / "ballast", leave_bytes=2 * PAGE)  # not a first page for each of the 3 queues
        with pytest.raises(DiskFullError):
            store.dispatch(requests, end)
        assert store.reput_offset == 0
        reput = ReputService(store, "127.0.0.1:1", max_backoff_s=0.05)
        waiting = threading.Thread(target=reput._dispatch, args=(requests, end))
        waiting.start()
        wait_until(lambda: any("dispatch waits at reput offset 0" in r.getMessage() and r.levelname == "ERROR"
                               for r in caplog.records))
        assert waiting.is_alive() and store.reput_offset == 0
        (disk / "ballast").unlink()
        waiting.join(10)
        assert not waiting.is_alive() and store.reput_offset == end
        assert [store.queue("Wait", q).max_offset_in_queue for q in range(3)] == [10, 10, 10]
        for i in (0, 1, 29):
            found = store.query_by_key("Wait", f"key-{i}", 32, 0, 2**62).phy_offsets
            assert found == [requests[i].commitlog_offset], (i, found)
    finally:
        (disk / "ballast").unlink(missing_ok=True)
        store.shutdown()


INDEX_ON_A_FULL_DISK = """
import sys
from pathlib import Path
from services.store.errors import DiskFullError
from services.store.formats.index_service import IndexService
from services.store.formats.record import DispatchRequest
index = IndexService(Path(sys.argv[1]), 400_000, 1_000)
index.load(True)
requests = [DispatchRequest(topic="T", queue_id=0, commitlog_offset=100 * i, msg_size=100, tags_code=0,
                            store_timestamp=1, queue_offset=i, keys=f"k{i}", uniq_key="", sys_flag=0,
                            prepared_transaction_offset=0, success=True) for i in range(1, 900)]
try:
    index.build_index_batch(requests)
except DiskFullError as exc:
    print("refused:", exc)
"""


def test_index_entries_the_disk_has_no_blocks_for_are_refused_not_a_sigbus(disk: Path) -> None:
    """Index files are sparse and written through their mapping: writing a hole on a full disk is a
    SIGBUS that kills the indexer, unless the write is refused before."""
    fill(disk / "ballast", leave_bytes=64 * 1024)
    done = subprocess.run([sys.executable, "-c", INDEX_ON_A_FULL_DISK, str(disk / "index")], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert "refused: disk full: indexing " in done.stdout, done.stdout
    assert " bytes of index files) failed" in done.stdout, done.stdout


CONSUME_QUEUES_ON_A_FULL_DISK = """
import sys
from pathlib import Path
from services.store.formats.consume_queue import ConsumeQueue
from services.store.errors import DiskFullError
queues = [ConsumeQueue(Path(sys.argv[1]), "T", q) for q in range(64)]
offset = 0
try:
    for cq in range(0, 2000, 100):  # 100 units (2000 bytes) a queue at a time: a new page every other time
        for queue in queues:
            units = [(offset + i * 100, 100, 0, cq + i) for i in range(100)]
            offset += 100 * 100
            queue.put_batch(units)
except DiskFullError as exc:
    print("refused:", exc)
for queue in queues:
    last = queue.mapped_file_queue.last_file()
    assert last is None or last.read_position <= last.reserved_position, (last, last.reserved_position)
"""


def test_consumequeue_pages_the_disk_has_no_blocks_for_are_refused_not_a_sigbus(disk: Path) -> None:
    """ConsumeQueue files are sparse and written through their mapping: writing a hole on a full disk
    is a SIGBUS that kills the indexer, unless the page is reserved before it is written."""
    fill(disk / "ballast", leave_bytes=256 * 1024)  # the first pages of the 64 queues, not many more
    done = subprocess.run([sys.executable, "-c", CONSUME_QUEUES_ON_A_FULL_DISK, str(disk / "consumequeue")],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert "refused: disk full: reserving space in " in done.stdout, done.stdout
