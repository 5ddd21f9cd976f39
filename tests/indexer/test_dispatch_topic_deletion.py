"""A replicated shard's topic-deletion record, dispatched (services/indexer/topic_deletion.py): the
reput loop removes the topic's ConsumeQueues where the record is, on every replica, whatever the chunk
boundaries; records of the topic after it start its queue again; the dispatch checkpoint the removal
saves covers only flushed units; DeleteTopic answers what dispatch removed and removes nothing more.

Records are encoded as the commitlog lays them out and fed to ``ReputService._take`` as the files
source's chunks, so no process is started (tests/commitlog/test_replication.py runs the processes).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from services.indexer.commitlog_reader import FileChunk
from services.indexer.indexer_store import ArrivalBatch, IndexerStore
from services.indexer.reput import ReputService
from services.indexer.topic_deletion import delete_topic
from services.store.formats.message import Message, properties_to_string
from services.store.formats.record import encode_record
from services.store.metadata_log import OffsetChange, TopicChange, metadata_message
from tests.geometry import SMALL

HOST = bytes([127, 0, 0, 1, 0, 0, 42, 159])
FILE_SIZE = 1 << 30  # one commitlog file: no BLANK in these logs


def _log() -> tuple[list[bytes], int, int]:
    """(records, the deletion record's index, the commitlog offset past it): Gone/0 over two
    ConsumeQueue files and Gone/1, Kept, consumer offset records, the deletion of Gone, then Gone/0
    written again and more of Kept."""
    messages = [Message("Gone", 0, b"g%d" % i, properties={"KEYS": f"g{i}"}) for i in range(320)]
    messages += [Message("Gone", 1, b"h%d" % i) for i in range(5)]
    messages += [Message("Kept", i % 2, b"k%d" % i, properties={"TAGS": "t"}) for i in range(40)]
    messages.append(metadata_message(OffsetChange("group", "Kept", 0, 3)))
    deletion = len(messages)
    messages.append(metadata_message(TopicChange("Gone", None)))
    messages += [Message(("Gone", "Kept")[i % 2], 0, b"n%d" % i) for i in range(30)]
    records, next_queue_offset, offset, past_deletion = [], Counter[tuple[str, int]](), 0, 0
    for i, msg in enumerate(messages):
        key = (msg.topic, msg.queue_id)
        record = encode_record(topic=msg.topic.encode(), queue_id=msg.queue_id, body=msg.body, flag=0,
                               properties=properties_to_string(msg.properties).encode(), sys_flag=0,
                               born_timestamp=1_800_000_000_000 + i, born_host=HOST, store_host=HOST,
                               queue_offset=next_queue_offset[key], commitlog_offset=offset,
                               store_timestamp=1_800_000_000_000 + i)
        next_queue_offset[key] += 1
        records.append(record)
        offset += len(record)
        if i == deletion:
            past_deletion = offset
    return records, deletion, past_deletion


def _dispatch(store: IndexerStore, records: list[bytes], chunk_records: int) -> None:
    reput = ReputService(store, "127.0.0.1:1")  # never started: its chunk path alone
    offset = 0
    for start in range(0, len(records), chunk_records):
        data = b"".join(records[start:start + chunk_records])
        reput._take(FileChunk(offset, data, offset + len(data), len(records[start:start + chunk_records])),
                    FILE_SIZE, ())
        offset += len(data)


def _consume_queue_files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted((root / "consumequeue").rglob("*"))
            if p.is_file()}


def test_dispatch_removes_a_deleted_topics_queues_at_its_record_in_any_chunking(tmp_path: Path) -> None:
    records, deletion, past_deletion = _log()
    config = SMALL.config(flush_interval_consume_queue=3_600_000)  # no flush round: only the deletion's save
    files: list[dict[str, bytes]] = []
    # The deletion record inside a chunk with the topic's records on both sides, at a chunk's end, and
    # at a chunk's start; the last store gets the whole log at once (a rebuild from offset 0).
    for chunk_records in (50, deletion + 1, deletion, 7, len(records)):
        root = tmp_path / f"chunks-{chunk_records}"
        store = IndexerStore(config, root)
        store.start()
        seen: list[str] = []

        def on_arrival(batch: ArrivalBatch, store: IndexerStore = store, seen: list[str] = seen) -> None:
            if not batch.deleted:
                return
            seen.append(batch.deleted)
            # Published once the queues are gone and a checkpoint covers the record: every unit below it
            # flushed first (the rule of a checkpoint saved outside a flush round).
            assert batch.reput_offset == past_deletion
            assert store.dispatch_checkpoint is not None and store.dispatch_checkpoint.reput_offset == past_deletion
            assert store.queue("Gone", 0) is None and store.queue("Gone", 1) is None
            for queue in store.consume_queues.queues():
                mapped = queue.mapped_file_queue
                assert mapped.flushed_where == mapped.max_offset, f"{queue.topic}/{queue.queue_id} not flushed"

        store.add_arrival_listener(on_arrival)
        try:
            _dispatch(store, records, chunk_records)
            assert seen == ["Gone"]
            # Gone/0 again from queue offset 320, where its offsets stopped; Gone/1 not again.
            queue = store.queue("Gone", 0)
            assert queue is not None and queue.max_offset_in_queue == 335
            assert [unit[3] for unit in queue.get_units(320, 100)] == list(range(320, 335))
            assert store.queue("Gone", 1) is None
            # The leader's DeleteTopic, past the deletion point: what dispatch removed, nothing more.
            assert delete_topic(store, "Gone", past_deletion, wait_s=1.0) == 2
            assert store.queue("Gone", 0) is not None
        finally:
            store.shutdown()
        files.append(_consume_queue_files(root))
    assert not [name for name in files[0] if name.startswith("consumequeue/Gone/1/")]
    for other in files[1:]:
        assert other == files[0]


def test_a_shard_without_deletion_records_keeps_deleting_through_the_call(tmp_path: Path) -> None:
    """Without the record (a shard that does not replicate its metadata) DeleteTopic removes the queues."""
    records, deletion, _ = _log()
    store = IndexerStore(SMALL.config(flush_interval_consume_queue=3_600_000), tmp_path)
    store.start()
    try:
        _dispatch(store, records[:deletion], 40)
        assert store.take_dispatch_deletion("Gone") is None
        assert delete_topic(store, "Gone", store.reput_offset, wait_s=1.0) == 2
        assert store.queue("Gone", 0) is None and not (tmp_path / "consumequeue" / "Gone").exists()
    finally:
        store.shutdown()
