"""The pieces of topic deletion and status in process: the topic table's tombstone, the indexer's
deletion (files, arrival, a later record starting the queue again), the wait for dispatch, a shard's
indexer address, and the client's plain dicts."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from gateway.settings import ShardSettings, _shard
from mqstore.client.admin import plain
from mqstore.v1 import admin_pb2
from services.commitlog.topic_config import TopicConfigManager
from services.indexer.indexer_store import ArrivalBatch, IndexerStore
from services.indexer.topic_deletion import delete_topic
from services.store.errors import InvalidArgumentError, NotFoundError
from services.store.formats.message import SCHEDULE_TOPIC
from services.store.formats.record import DispatchRequest
from services.store.formats.topics_file import read_topics
from services.store.rules.topics import TopicConfig
from tests.geometry import SMALL


def test_a_deleted_topic_is_tombstoned_against_discovery_until_it_is_created_again(tmp_path: Path) -> None:
    path = tmp_path / "config" / "topics.json"
    table = TopicConfigManager(path)
    table.create(TopicConfig("Gone", 4, 4))
    table.create(TopicConfig("Kept", 4, 4))
    assert table.delete("Gone").topic == "Gone"
    with pytest.raises(NotFoundError, match="does not exist"):
        table.delete("Gone")
    with pytest.raises(InvalidArgumentError, match="system topic"):
        table.delete(SCHEDULE_TOPIC)
    reloaded = TopicConfigManager(path)
    reloaded.load()
    assert [c.topic for c in reloaded.list()] == ["Kept"] and reloaded.is_deleted("Gone")
    assert reloaded.merge_discovered({"Gone": 4, "Other": 2}) == [TopicConfig("Other", 2, 2)]
    assert reloaded.get("Gone") is None
    reloaded.get_or_create("Gone")  # a first send creates it again: off the list
    assert not reloaded.is_deleted("Gone") and "Gone" not in read_topics(path).deleted  # as stored


def _records(topic: str, count: int, start_offset: int = 0, first_queue_offset: int = 0) -> list[DispatchRequest]:
    return [DispatchRequest(True, 100, topic, 0, start_offset + 100 * i, first_queue_offset + i,
                            store_timestamp=1_800_000_000_000 + i) for i in range(count)]


def test_the_indexer_removes_a_topics_queues_and_a_later_record_starts_the_queue_again(tmp_path: Path) -> None:
    store = IndexerStore(SMALL.config(flush_interval_consume_queue=3_600_000), tmp_path)
    store.start()
    published: list[ArrivalBatch] = []
    store.add_arrival_listener(published.append)
    try:
        gone, kept = _records("Gone", 700), _records("Kept", 10, start_offset=70_000)
        store.dispatch(gone, 70_000)
        store.dispatch(kept, 71_000)
        assert len(list((tmp_path / "consumequeue" / "Gone" / "0").iterdir())) >= 2
        assert delete_topic(store, "Gone", 70_000, wait_s=1.0) == 1
        assert not (tmp_path / "consumequeue" / "Gone").exists()
        assert store.queue("Gone", 0) is None and store.queue("Kept", 0) is not None
        assert published[-1].deleted == "Gone" and not published[-1].maxima
        assert store.delete_topic("Gone") == 0  # again: nothing left, no error
        # The topic again: its queue offsets go on (the commitlog keeps them), the queue starts there.
        store.dispatch(_records("Gone", 3, start_offset=71_000, first_queue_offset=700), 71_300)
        queue = store.queue("Gone", 0)
        assert queue is not None and queue.max_offset_in_queue == 703
        assert [u[3] for u in queue.get_units(700, 10)] == [700, 701, 702]
    finally:
        store.shutdown()


def test_the_indexer_waits_for_dispatch_to_pass_the_deletion_point(tmp_path: Path) -> None:
    store = IndexerStore(SMALL.config(flush_interval_consume_queue=3_600_000), tmp_path)
    store.start()
    try:
        store.dispatch(_records("Late", 5), 500)
        late = _records("Late", 5, start_offset=500, first_queue_offset=5)
        timer = threading.Timer(0.3, lambda: store.dispatch(late, 1000))
        started = time.monotonic()
        timer.start()
        assert delete_topic(store, "Late", 1000, wait_s=5.0) == 1
        assert 0.25 < time.monotonic() - started < 4.0
        assert store.queue("Late", 0) is None  # the records before the deletion point did not re-create it
        timer.join()
    finally:
        store.shutdown()


def test_a_shards_indexer_is_the_commitlog_port_plus_one_unless_set() -> None:
    assert ShardSettings("s", "10.0.0.5:9901", "10.0.0.5:9903").indexer_address == "10.0.0.5:9902"
    assert _shard(0, {"commitlog": "a:1", "query": "a:3", "indexer": "b:7"}).indexer_address == "b:7"


def test_plain_keeps_numbers_and_defaults() -> None:
    status = admin_pb2.ClusterStatus(shards=[admin_pb2.ShardStatus(name="s", max_offset=2**60,
                                                                   services=[admin_pb2.ServiceStatus(name="q")])])
    answer = plain(status)
    assert answer["healthy"] is False and answer["shards"][0]["max_offset"] == 2**60
    assert answer["shards"][0]["services"][0] == {"name": "q", "address": "", "state": "", "error": ""}
