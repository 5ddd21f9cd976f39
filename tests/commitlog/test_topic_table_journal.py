"""The topic table: a change is one durable journal entry, and what comes back at a start is exactly
what was acknowledged, whatever moment a crash or a power cut picked.

A CreateTopic used to rewrite (and fsync) the whole topics.json: with 100,000 topics, megabytes per
call, so CreateTopic slowed in proportion to the topics already there.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.commitlog.topic_config import TopicConfigManager
from services.store.formats.table_journal import JournalDamagedError, TableJournal, encode_entry, journal_path
from services.store.formats.topics_file import read_topics
from services.store.rules.topics import TopicConfig


def manager(tmp_path: Path, compact_min: int = 64) -> TopicConfigManager:
    """A table that folds its journal in at 64 entries (1024 by default): the same rule, smaller."""
    topics = TopicConfigManager(tmp_path / "config" / "topics.json")
    topics._journal.compact_min = compact_min
    topics.load()
    return topics


def test_a_create_appends_one_entry_and_leaves_the_snapshot_alone(tmp_path: Path) -> None:
    topics = manager(tmp_path)
    for i in range(100):  # past the first fold (at 64 entries)
        topics.create(TopicConfig(f"t{i:05d}", 8, 8))
    snapshot = tmp_path / "config" / "topics.json"
    before = snapshot.stat()
    journal = journal_path(snapshot)
    size = journal.stat().st_size
    topics.create(TopicConfig("one-more", 8, 8))
    after = snapshot.stat()
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (before.st_ino, before.st_size, before.st_mtime_ns)
    assert journal.stat().st_size - size < 200
    again = manager(tmp_path)
    assert len(again.list()) == 101 and again.get("one-more") == TopicConfig("one-more", 8, 8)


def test_the_journal_is_folded_in_once_it_holds_as_many_entries_as_the_table(tmp_path: Path) -> None:
    topics = manager(tmp_path)
    journal = journal_path(tmp_path / "config" / "topics.json")
    for i in range(63):
        topics.create(TopicConfig(f"t{i}", 1, 1))
    assert len(journal.read_bytes().splitlines()) == 63
    topics.create(TopicConfig("t63", 1, 1))  # the 64th entry: compact_min reached
    assert journal.read_bytes() == b""
    assert len(read_topics(tmp_path / "config" / "topics.json").topics) == 64
    for i in range(64, 127):
        topics.create(TopicConfig(f"t{i}", 1, 1))
    assert len(journal.read_bytes().splitlines()) == 63
    topics.create(TopicConfig("t127", 1, 1))  # as many entries as the snapshot's 64 rows: folded again
    assert journal.read_bytes() == b""
    for i in range(128, 200):
        topics.create(TopicConfig(f"t{i}", 1, 1))
    assert len(journal.read_bytes().splitlines()) == 72  # the next fold comes at 128 entries


def test_deletes_updates_and_recreates_replay_to_the_same_table(tmp_path: Path) -> None:
    topics = manager(tmp_path)
    topics.create(TopicConfig("a", 4, 4))
    topics.create(TopicConfig("b", 4, 4))
    topics.update(TopicConfig("a", 2, 2, 4))
    topics.delete("b")
    topics.create(TopicConfig("c", 1, 1))
    topics.delete("c")
    topics.create(TopicConfig("c", 3, 3))
    table = read_topics(tmp_path / "config" / "topics.json")
    assert table.deleted == {"b"}
    assert table.topics == {"a": {"read_queue_nums": 2, "write_queue_nums": 2, "perm": 4},
                            "c": {"read_queue_nums": 3, "write_queue_nums": 3, "perm": 6}}
    again = manager(tmp_path)
    assert [c.topic for c in again.list()] == ["a", "c"] and again.is_deleted("b")
    assert journal_path(tmp_path / "config" / "topics.json").read_bytes() == b""  # folded in at the start


def test_a_torn_last_line_was_never_acknowledged_and_is_cut(tmp_path: Path) -> None:
    topics = manager(tmp_path)
    topics.create(TopicConfig("kept", 1, 1))
    journal = journal_path(tmp_path / "config" / "topics.json")
    torn = encode_entry({"topic": "torn", "config": {"read_queue_nums": 1, "write_queue_nums": 1, "perm": 6}})
    with open(journal, "ab") as file:
        file.write(torn[:-9])  # the machine stopped mid-append
    again = manager(tmp_path)
    assert [c.topic for c in again.list()] == ["kept"]
    again.create(TopicConfig("after", 1, 1))
    assert [c.topic for c in manager(tmp_path).list()] == ["after", "kept"]


def test_a_damaged_line_before_the_last_refuses_to_load(tmp_path: Path) -> None:
    topics = manager(tmp_path)
    for name in ("a", "b", "c"):
        topics.create(TopicConfig(name, 1, 1))
    journal = journal_path(tmp_path / "config" / "topics.json")
    data = bytearray(journal.read_bytes())
    data[12] ^= 0x01  # inside the first entry's JSON
    journal.write_bytes(bytes(data))
    with pytest.raises(JournalDamagedError, match="line 1 of 3 is damaged"):
        manager(tmp_path)


def test_a_compaction_cut_between_its_steps_replays_harmlessly(tmp_path: Path) -> None:
    snapshot = tmp_path / "config" / "topics.json"
    topics = manager(tmp_path)
    topics.create(TopicConfig("a", 1, 1))
    topics.delete("a")
    topics.create(TopicConfig("b", 2, 2))
    entries = journal_path(snapshot).read_bytes()
    TableJournal(snapshot).compact(json.dumps({"topics": {"b": {"read_queue_nums": 2, "write_queue_nums": 2,
                                                                "perm": 6}}, "deleted": ["a"]}).encode())
    journal_path(snapshot).write_bytes(entries)  # as if the journal had not been emptied yet
    again = manager(tmp_path)
    assert [(c.topic, c.read_queue_nums) for c in again.list()] == [("b", 2)] and again.is_deleted("a")


def test_a_failed_append_changes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    topics = manager(tmp_path)
    topics.create(TopicConfig("a", 1, 1))

    def no_space(fd: int, data: object) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "write", no_space)
    with pytest.raises(Exception, match="(?i)disk|space"):
        topics.create(TopicConfig("b", 1, 1))
    monkeypatch.undo()
    assert [c.topic for c in topics.list()] == ["a"]
    assert [c.topic for c in manager(tmp_path).list()] == ["a"]


@settings(max_examples=15, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["create", "delete"]), st.sampled_from("abcdef"),
                          st.integers(1, 16)), max_size=25),
       st.integers(1, 6))
def test_any_sequence_of_changes_reloads_to_the_table_in_memory(tmp_path_factory: pytest.TempPathFactory,
                                                                 changes: list[tuple[str, str, int]],
                                                                 compact_min: int) -> None:
    root = tmp_path_factory.mktemp("topics")
    topics = manager(root, compact_min)
    for op, name, queues in changes:
        if op == "create" and topics.get(name) is None:
            topics.create(TopicConfig(name, queues, queues))
        elif op == "delete" and topics.get(name) is not None:
            topics.delete(name)
    again = manager(root)
    assert again.list() == topics.list()
    assert {n for n in "abcdef" if again.is_deleted(n)} == {n for n in "abcdef" if topics.is_deleted(n)}
