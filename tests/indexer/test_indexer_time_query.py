"""Offset by time on ConsumeQueues the indexer built after the messages were stored (issue 15).

RocketMQ picks the file to search by its mtime. A queue built later (a lagging indexer, a rebuild)
must not answer from its first file because every file looks "written now": each file gets the mtime
a broker writing it as the messages arrived would have left, the store time of the first unit
written into its last page. Real commitlog and indexer processes; 100 units (one page) per CQ file.
"""

from __future__ import annotations

import time
from pathlib import Path

from mqstore.v1 import commitlog_pb2, common_pb2, indexer_pb2
from services.store.formats.consume_queue import ConsumeQueue, last_modified_ms
from tests.commitlog.commitlog_process import StartCommitLog
from tests.indexer.indexer_process import IndexerProcess, start_indexer

UNITS_PER_FILE = 100
ENV = {
    "MQSTORE_MAPPED_FILE_SIZE_CONSUME_QUEUE": str(20 * UNITS_PER_FILE),
    "MQSTORE_MAX_HASH_SLOT_NUM": "64",
    "MQSTORE_MAX_INDEX_NUM": "400",
}
TOPIC = "TimeT"


def offset_by_time(indexer: IndexerProcess, timestamp: int) -> int:
    return int(indexer.stub.GetOffsetByTime(indexer_pb2.GetOffsetByTimeRequest(
        topic=TOPIC, queue_id=0, timestamp=timestamp), timeout=10).offset)


def cq_mtimes_ms(indexer_root: Path) -> list[int]:
    files = sorted((indexer_root / "consumequeue" / TOPIC / "0").iterdir())
    return [f.stat().st_mtime_ns // 1_000_000 for f in files]


def assert_answers(indexer: IndexerProcess, stamps: list[int]) -> None:
    """RocketMQ's answers with file mtimes stamps[0], stamps[100], stamps[200] (a file's one page
    was first written with its first unit)."""
    # After the last message: the last unit (from the last file, not the first file's last unit, 99).
    assert offset_by_time(indexer, stamps[-1] + 1) == 249
    assert offset_by_time(indexer, 0) == 0
    for unit in (0, 100, 200, 249):  # the file whose mtime it is: a unit stored then (ties: any of them)
        assert stamps[offset_by_time(indexer, stamps[unit])] == stamps[unit], unit
    # Later than file 1's mtime: searched in file 2, whose units are all later: its first.
    assert offset_by_time(indexer, stamps[150]) == 200


def test_offset_by_time_on_queues_built_after_the_messages(start_commitlog: StartCommitLog, tmp_path: Path) -> None:
    commitlog = start_commitlog(tmp_path / "broker", ENV)
    stamps: list[int] = []
    for i in range(250):  # one by one: store times grow through the queue's three files
        stamps.append(commitlog.stub.Append(commitlog_pb2.AppendRequest(message=common_pb2.Message(
            topic=TOPIC, queue_id=0, body=f"t{i}".encode())), timeout=10).store_timestamp)
        if i % 10 == 9:
            time.sleep(0.002)
    assert stamps[0] < stamps[99] < stamps[100] < stamps[199] < stamps[200] < stamps[-1]
    while time.time() * 1000 < stamps[-1] + 50:  # the indexer builds well after the last message
        time.sleep(0.01)

    root = tmp_path / "indexer"
    indexer = start_indexer(root, commitlog.address, ENV)
    try:
        max_offset = commitlog.stub.GetStoreInfo(commitlog_pb2.GetStoreInfoRequest()).max_offset
        indexer.wait_caught_up(max_offset)
        # Complete files carry their mtime as soon as they are complete.
        assert cq_mtimes_ms(root)[:2] == [stamps[0], stamps[100]]
        assert_answers(indexer, stamps)
    finally:
        assert indexer.stop() == 0
    # At shutdown the last file gets its mtime too; a restart that finds every unit built writes
    # nothing and changes no mtime.
    assert cq_mtimes_ms(root) == [stamps[0], stamps[100], stamps[200]]
    indexer = start_indexer(root, commitlog.address, ENV)
    try:
        indexer.wait_caught_up(max_offset)
        # No store time can be read: 0, as RocketMQ answers when pickupStoreTimestamp fails.
        assert commitlog.stop() == 0
        assert offset_by_time(indexer, stamps[150]) == 0
    finally:
        assert indexer.stop() == 0
    assert cq_mtimes_ms(root) == [stamps[0], stamps[100], stamps[200]]


def test_a_rebuilt_file_answers_as_the_broker_file_except_between_their_mtimes(tmp_path: Path) -> None:
    """Where a rebuilt queue can differ from the broker's (docs/architecture.md, "ConsumeQueue file
    mtimes"): a broker whose flush cleaned a file's last page while units were still going into it left
    the mtime of the first unit written after that flush, which no file records; the rebuilt file has
    the store time of the unit that started the page. A timestamp between the two is searched in the
    next file (its first unit) on the rebuilt queue and in this file (the nearest unit) on the
    broker's. Every other timestamp gets the same answer. 400 units a file: the last page starts in
    unit 204; the broker flushed after unit 299."""
    times = [1_000_000 + 10 * i for i in range(450)]

    def store_time_of(offset: int, size: int) -> int:
        return times[offset // 100]

    units = [(100 * i, 100, 0, i) for i in range(len(times))]
    broker = ConsumeQueue(tmp_path / "broker", TOPIC, 0, 20 * 400)
    broker.put_batch(units[:300], times[:300])
    assert broker.flush(0)  # a flush round of the broker, inside the last page of file 0
    broker.put_batch(units[300:], times[300:])
    rebuilt = ConsumeQueue(tmp_path / "rebuilt", TOPIC, 0, 20 * 400)
    rebuilt.put_batch(units, times)
    try:
        broker_mtime, rebuilt_mtime = (last_modified_ms(q.mapped_file_queue.files[0].path) for q in (broker, rebuilt))
        assert (broker_mtime, rebuilt_mtime) == (times[300], times[204])
        differ = []
        for stamp in range(times[0] - 20, times[-1] + 20):
            ours, theirs = (q.get_offset_in_queue_by_time(stamp, store_time_of) for q in (rebuilt, broker))
            if ours != theirs:
                differ.append(stamp)
                assert ours == 400 and theirs == min(range(400), key=lambda i: (abs(times[i] - stamp), i))
        assert differ == list(range(rebuilt_mtime + 1, broker_mtime + 1))
    finally:
        broker.shutdown()
        rebuilt.shutdown()
