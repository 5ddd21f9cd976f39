"""Metadata replication in-process: the leader logs topic changes, a follower fed the leader's stream (in
arbitrary cuts) ends with the same topic table; changes apply idempotently; only the kinds other
services may log come through ``metadata_flow``; a refused log leaves the table as it was."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from services.commitlog.ha.metadata_apply import apply_replicated, metadata_flow_message
from services.commitlog.ha.replica_append import ReplicaAppender
from services.commitlog.message_store import MessageStore
from services.commitlog.topic_config import TopicConfigManager
from services.query.consumer_offsets import ConsumerOffsetTable
from services.store.config import load_config
from services.store.errors import FailedPreconditionError, InvalidArgumentError, UnavailableError
from services.store.formats.message import Message
from services.store.metadata_log import (
    METADATA_TOPIC,
    OFFSET_TAG,
    POP_TAG,
    TOPIC_TAG,
    OffsetChange,
    PopChange,
    StateFileChange,
    TopicChange,
    metadata_message,
    parse_change,
)
from services.store.rules.topics import TopicConfig

FILE_SIZE = 64 * 1024


def _engine(root: Path, **overrides: object) -> MessageStore:
    engine = MessageStore(load_config(environ={}, mapped_file_size_commit_log=FILE_SIZE, max_message_size=16 * 1024,
                                      **overrides), root)
    engine.start()
    return engine


def _topics(engine: MessageStore) -> tuple[list[TopicConfig], list[str]]:
    listed = engine.topics.list()
    return listed, sorted(t for t in ("A", "B", "C", "auto") if engine.topics.is_deleted(t))


def _stream(leader: MessageStore, follower: MessageStore, rng: random.Random) -> None:
    appender = ReplicaAppender(follower.commit_log)
    offset = 0
    while offset < leader.max_offset:  # as the leader streams: never across a file, cut anywhere
        mapped = leader.commit_log.mfq.find_by_offset(offset)
        assert mapped is not None
        position = offset - mapped.file_from_offset
        size = min(rng.randrange(1, 3000), mapped.read_position - position)
        appender.append(offset, mapped.read(position, size))
        offset += size


def test_a_follower_fed_the_leaders_stream_has_its_topics(tmp_path: Path) -> None:
    leader = _engine(tmp_path / "leader", ha_listen_port=10912)
    followers = [_engine(tmp_path / f"follower-{i}") for i in range(2)]
    try:
        leader.create_topic(TopicConfig("A", 4, 4))
        leader.create_topic(TopicConfig("B", 2, 3, 4))
        rng = random.Random(5)
        for i in range(120):  # several files: the changes land among messages and BLANKs
            leader.put_messages([Message(("A", "auto")[i % 2], 0, rng.randbytes(rng.randrange(1, 1500)))])
        leader.update_topic(TopicConfig("A", 6, 6))
        leader.delete_topic("B")
        leader.create_topic(TopicConfig("C", 1, 1))
        for i, follower in enumerate(followers):
            _stream(leader, follower, random.Random(i))
            assert _topics(follower) == _topics(leader)
        assert {t.topic for t in leader.topics.list()} >= {"A", "C", "auto", METADATA_TOPIC}
        assert _topics(leader)[1] == ["B"]
        # Applying the log again up to its end (a follower restarted between its table and its log gets
        # the records again) changes nothing.
        before = _topics(followers[0])
        for mapped in leader.commit_log.mfq.files:
            apply_replicated(followers[0].topics, mapped.read(0, mapped.read_position))
        assert _topics(followers[0]) == before
    finally:
        leader.shutdown()
        for follower in followers:
            follower.shutdown()


def test_a_follower_refuses_a_topic_change_and_keeps_its_table(tmp_path: Path) -> None:
    follower = _engine(tmp_path, broker_role="SLAVE", ha_master_address="10.0.0.9:10912")
    try:
        follower.commit_log.write_refusal = FailedPreconditionError("a replica: send to the leader 10.0.0.9:10912")
        before = follower.topics.list()
        with pytest.raises(FailedPreconditionError, match="10.0.0.9:10912"):
            follower.create_topic(TopicConfig("A", 4, 4))
        assert follower.topics.list() == before and follower.topics.get("A") is None
    finally:
        follower.shutdown()


def test_a_change_written_but_not_acknowledged_is_applied_and_refused(tmp_path: Path) -> None:
    """SYNC_MASTER's refusal after the record is in the leader's log: the table follows the log."""
    topics = TopicConfigManager(tmp_path / "topics.json")
    not_replicated = UnavailableError("SLAVE_NOT_AVAILABLE: shard broker-a: ...")
    topics.log_change = lambda change: not_replicated
    with pytest.raises(UnavailableError, match="SLAVE_NOT_AVAILABLE"):
        topics.create(TopicConfig("A", 4, 4))
    assert topics.get("A") == TopicConfig("A", 4, 4)

    def refused(change: TopicChange) -> None:
        raise FailedPreconditionError("not the leader")
    topics.log_change = refused
    with pytest.raises(FailedPreconditionError):
        topics.delete("A")
    assert topics.get("A") is not None and not topics.is_deleted("A")


def test_metadata_records_round_trip_and_metadata_flow_takes_only_offsets_pops_and_state_files() -> None:
    changes = [TopicChange("A", TopicConfig("A", 3, 5, 4)), TopicChange("B", None), OffsetChange("g", "A", 2, 17),
               StateFileChange("delayOffset.json", b'{"offsetTable": {"1": 3}}'),
               PopChange("g", "A", 1, 9, 4, {4: (1700000000000, 2, 17, None), 6: (1700000000001, 1, 18, "k")}, (5,))]
    for change in changes:
        message = metadata_message(change)
        assert message.topic == METADATA_TOPIC and message.queue_id == 0
        assert parse_change(message.properties["TAGS"], message.body) == change
    offset = metadata_message(changes[2])
    assert metadata_flow_message(METADATA_TOPIC, 0, OFFSET_TAG, offset.body).body == offset.body
    topic = metadata_message(changes[0])
    pop = metadata_message(changes[-1])
    assert metadata_flow_message(METADATA_TOPIC, 0, POP_TAG, pop.body).body == pop.body
    with pytest.raises(InvalidArgumentError, match="consumer offset, a pop state change or a state file"):
        metadata_flow_message(METADATA_TOPIC, 0, TOPIC_TAG, topic.body)
    with pytest.raises(InvalidArgumentError, match="not 'T' queue 0"):
        metadata_flow_message("T", 0, OFFSET_TAG, offset.body)
    with pytest.raises(InvalidArgumentError, match="not a offset change"):
        metadata_flow_message(METADATA_TOPIC, 0, OFFSET_TAG, b"{}")


def test_the_offsets_file_keeps_the_metadata_queue_offset_it_covers(tmp_path: Path) -> None:
    """A query service's start goes on applying from there, not from the queue's first record."""
    table = ConsumerOffsetTable(tmp_path)
    table.commit("g", "T", 1, 7)
    table.applied_metadata = 42
    snapshot = table.snapshot()
    table.applied_metadata = 43  # applied after the snapshot: not what the file says
    table.write(snapshot)
    loaded = ConsumerOffsetTable(tmp_path)
    loaded.load()  # replays the journal the write appended to, and folds it into the file
    assert loaded.applied_metadata == 42 and loaded.query("g", "T", 1) == 7
    document = json.loads(table.path.read_bytes())
    assert document == {"offsetTable": {"T@g": {"1": 7}}, "mqstoreMetadataQueueOffset": 42}
    plain = ConsumerOffsetTable(tmp_path / "single-copy")
    plain.commit("g", "T", 1, 7)
    plain.persist()
    assert json.loads(plain.path.read_bytes()) == {"offsetTable": {"T@g": {"1": 7}}}
