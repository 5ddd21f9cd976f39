"""Topics a store's data holds join the topic table at start: a RocketMQ store without
``config/topics.json`` has its topics, with as many queues as its data shows, and configured topics
are never changed (only SCHEDULE_TOPIC_XXXX grows to one queue per delay level)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from services.commitlog.message_store import MessageStore
from services.store.config import load_config
from services.store.formats.message import SCHEDULE_TOPIC, Message
from services.store.rules.topics import TopicConfig

MIB = 1024 * 1024
FIXTURE_TOPICS = {"TopicA": 4, "TopicB": 2, "Topic-Long-Name_with.chars": 1, SCHEDULE_TOPIC: 18}


def started(root: Path, **overrides: Any) -> MessageStore:
    settings: dict[str, Any] = {"mapped_file_size_commit_log": MIB, "max_message_size": 4 * MIB}
    settings.update(overrides)
    log = MessageStore(load_config(environ={}, **settings), root)
    log.start()
    return log


def queue_nums(log: MessageStore) -> dict[str, int]:
    for config in log.topics.list():
        assert config.read_queue_nums == config.write_queue_nums
    return {c.topic: c.write_queue_nums for c in log.topics.list()}


def test_a_rocketmq_store_without_topics_json_gets_the_topics_of_its_data(
        fixture_store: Callable[[str], Path]) -> None:
    store = fixture_store("normal-raw")
    assert not (store / "config" / "topics.json").exists()
    log = started(store)
    try:
        assert queue_nums(log) == FIXTURE_TOPICS
        assert log.put_message(Message("TopicA", 3, b"more")).queue_offset == 450, "and they take more messages"
    finally:
        log.shutdown()
    written = json.loads((store / "config" / "topics.json").read_text())["topics"]
    assert {t: c["write_queue_nums"] for t, c in written.items()} == FIXTURE_TOPICS
    again = started(store)
    try:
        assert queue_nums(again) == FIXTURE_TOPICS
    finally:
        again.shutdown()


def test_consume_queue_directories_name_topics_the_log_does_not_hold(tmp_path: Path) -> None:
    for queue_dir in ("consumequeue/Expired/0", "consumequeue/Expired/5", "indexer/consumequeue/Built/2",
                      "consumequeue/bad name/0", "consumequeue/Odd/x1"):
        (tmp_path / queue_dir).mkdir(parents=True)
    log = started(tmp_path)
    try:
        assert queue_nums(log) == {"Expired": 6, "Built": 3}, "bad names and non-queue directories are skipped"
    finally:
        log.shutdown()


def test_configured_topics_are_kept_as_they_are(fixture_store: Callable[[str], Path]) -> None:
    store = fixture_store("normal-raw")
    (store / "config").mkdir()
    (store / "config" / "topics.json").write_text(json.dumps({"topics": {
        "TopicA": {"read_queue_nums": 8, "write_queue_nums": 8, "perm": 6},
        "TopicB": {"read_queue_nums": 1, "write_queue_nums": 1, "perm": 4}}}))  # lowered on purpose
    log = started(store)
    try:
        assert log.topics.get("TopicA") == TopicConfig("TopicA", 8, 8)
        assert log.topics.get("TopicB") == TopicConfig("TopicB", 1, 1, perm=4)
        assert queue_nums(log)["Topic-Long-Name_with.chars"] == 1
    finally:
        log.shutdown()
