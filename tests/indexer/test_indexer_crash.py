"""kill -9 the indexer at random points while records flow; after each restart it must converge.

Checked at the end: every queue is gap-free and duplicate-free, every unit points at a record with
the same topic, queue id and queue offset, and every key of every message is found.
"""

from __future__ import annotations

import os
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from mqstore.v1 import commitlog_pb2, common_pb2, indexer_pb2
from services.store.formats.record import decode_record
from tests.commitlog.commitlog_process import CommitLogProcess, StartCommitLog
from tests.indexer.indexer_process import IndexerProcess, start_indexer

CYCLES = int(os.environ.get("INDEXER_CRASH_CYCLES", "20"))
ENV = {
    "MQSTORE_MAPPED_FILE_SIZE_COMMIT_LOG": str(256 * 1024),
    "MQSTORE_MAPPED_FILE_SIZE_CONSUME_QUEUE": str(20 * 64),  # a CQ file every 64 units
    "MQSTORE_MAX_HASH_SLOT_NUM": "50",
    "MQSTORE_MAX_INDEX_NUM": "300",  # an index file every ~100 messages
    "MQSTORE_FLUSH_INTERVAL_CONSUME_QUEUE": "100",
}
TOPICS = ("CrashA", "CrashB")


def produce(commitlog: CommitLogProcess, stop: threading.Event, sent: list[tuple[int, str, list[str]]]) -> None:
    """AppendBatch of 8 until stopped; records (commitlog offset, topic, keys) of every acked message."""
    n = 0
    while not stop.is_set():
        batch = []
        for _ in range(8):
            topic = TOPICS[n % 2]
            keys = [f"k{n}", f"order-{n}"]  # unique: a shared key would hit the 64-result cap
            props = {"KEYS": " ".join(keys), "UNIQ_KEY": f"{n:032X}", "TAGS": f"T{n % 3}"}
            batch.append((common_pb2.Message(topic=topic, queue_id=n % 3, body=b"m" * (50 + n % 200),
                                             properties=props), topic, [*keys, props["UNIQ_KEY"]]))
            n += 1
        response = commitlog.stub.AppendBatch(
            commitlog_pb2.AppendBatchRequest(messages=[m for m, _, _ in batch]), timeout=10)
        for result, (_, topic, keys) in zip(response.results, batch, strict=True):
            sent.append((result.commitlog_offset, topic, keys))
        time.sleep(0.02)


def all_units(indexer: IndexerProcess, topic: str, queue_id: int) -> list[indexer_pb2.QueueUnit]:
    units: list[indexer_pb2.QueueUnit] = []
    offset = 0
    while True:
        response = indexer.stub.GetQueueEntries(indexer_pb2.GetQueueEntriesRequest(
            topic=topic, queue_id=queue_id, from_offset=offset, max_count=1024))
        if not response.units:
            return units
        units.extend(response.units)
        offset = response.units[-1].queue_offset + 1


def test_indexer_converges_after_repeated_kill9(start_commitlog: StartCommitLog, tmp_path: Path) -> None:
    commitlog = start_commitlog(tmp_path / "broker", ENV)
    sent: list[tuple[int, str, list[str]]] = []
    stop = threading.Event()
    producer = threading.Thread(target=produce, args=(commitlog, stop, sent))
    producer.start()
    rng = random.Random(11)
    indexer = None
    try:
        for _ in range(CYCLES):
            indexer = start_indexer(tmp_path / "indexer", commitlog.address, ENV)
            time.sleep(rng.uniform(0.05, 0.4))
            indexer.kill9()
            assert (tmp_path / "indexer" / "abort").exists()
    finally:
        stop.set()
        producer.join(30)
    max_offset = commitlog.stub.GetStoreInfo(commitlog_pb2.GetStoreInfoRequest()).max_offset
    indexer = start_indexer(tmp_path / "indexer", commitlog.address, ENV)
    try:
        indexer.wait_caught_up(max_offset)
        total = 0
        for topic in TOPICS:
            for queue_id in range(3):
                units = all_units(indexer, topic, queue_id)
                assert [u.queue_offset for u in units] == list(range(len(units))), f"{topic}/{queue_id} has gaps"
                total += len(units)
                records = commitlog.stub.ReadBatch(commitlog_pb2.ReadBatchRequest(ranges=[
                    commitlog_pb2.ByteRange(offset=u.commitlog_offset, size=u.size) for u in units[:1024]]))
                for unit, raw in zip(units, records.data, strict=False):
                    record = decode_record(raw)
                    assert (record.topic, record.queue_id, record.queue_offset) == (topic, queue_id, unit.queue_offset)
        assert total == len(sent) > 1000

        def missing(item: tuple[int, str, list[str]]) -> list[str]:
            offset, topic, keys = item
            return [key for key in keys if offset not in indexer.stub.QueryByKey(
                indexer_pb2.QueryByKeyRequest(topic=topic, key=key)).commitlog_offsets]

        with ThreadPoolExecutor(8) as pool:
            assert [m for m in pool.map(missing, sent) if m] == []
    finally:
        assert indexer.stop() == 0
