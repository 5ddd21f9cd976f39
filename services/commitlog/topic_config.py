"""Topic configuration: topic -> read/write queue counts and permission, kept in config/topics.json."""

from __future__ import annotations

import json
import re
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

from services.store.errors import AlreadyExistsError, InvalidArgumentError, NotFoundError
from services.store.record import MAX_TOPIC_LENGTH_V1
from services.store.store_root import write_atomically

PERM_WRITE = 0x2
PERM_READ = 0x4
PERM_READ_WRITE = PERM_READ | PERM_WRITE
MAX_QUEUE_NUMS = 1024
# RocketMQ's legal characters, plus '.', which real brokers store (the fixtures have such a topic).
_LEGAL_TOPIC = re.compile(r"^[%|a-zA-Z0-9_.\-]+$")


@dataclass(slots=True, frozen=True)
class TopicConfig:
    topic: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int = PERM_READ_WRITE


def check_topic_name(topic: str) -> None:
    if not topic:
        raise InvalidArgumentError("topic is empty: give a topic name")
    if len(topic.encode("utf-8")) > MAX_TOPIC_LENGTH_V1:
        raise InvalidArgumentError(f"topic {topic[:40]!r}... is longer than {MAX_TOPIC_LENGTH_V1} bytes")
    if not _LEGAL_TOPIC.match(topic):
        raise InvalidArgumentError(f"topic {topic!r} has illegal characters: use letters, digits and %|_.-")


def check_topic_config(config: TopicConfig) -> None:
    check_topic_name(config.topic)
    for name in ("read_queue_nums", "write_queue_nums"):
        value = getattr(config, name)
        if not 1 <= value <= MAX_QUEUE_NUMS:
            raise InvalidArgumentError(f"{name} of {config.topic!r} is {value}: it must be within 1..{MAX_QUEUE_NUMS}")
    if config.perm & ~PERM_READ_WRITE or config.perm == 0:
        raise InvalidArgumentError(f"perm of {config.topic!r} is {config.perm}: use 2 (write), 4 (read) or 6 (both)")


class TopicConfigManager:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._topics: dict[str, TopicConfig] = {}

    def load(self) -> None:
        source = self.path if self.path.exists() else self.path.with_name(self.path.name + ".bak")
        if not source.exists():
            return
        data = json.loads(source.read_text())
        self._topics = {name: TopicConfig(topic=name, **fields) for name, fields in data["topics"].items()}

    def get(self, topic: str) -> TopicConfig | None:
        return self._topics.get(topic)

    def list(self) -> list[TopicConfig]:
        return sorted(self._topics.values(), key=lambda c: c.topic)

    def create(self, config: TopicConfig) -> TopicConfig:
        check_topic_config(config)
        with self._lock:
            if config.topic in self._topics:
                raise AlreadyExistsError(f"topic {config.topic!r} exists: use UpdateTopic to change it")
            self._put(config)
        return config

    def update(self, config: TopicConfig) -> TopicConfig:
        check_topic_config(config)
        with self._lock:
            if config.topic not in self._topics:
                raise NotFoundError(f"topic {config.topic!r} does not exist: create it first")
            self._put(config)
        return config

    def get_or_create(self, topic: str, queue_nums: int) -> TopicConfig:
        found = self._topics.get(topic)
        if found is not None:
            return found
        with self._lock:
            found = self._topics.get(topic)
            if found is None:
                found = TopicConfig(topic, queue_nums, queue_nums)
                self._put(found)
            return found

    def _put(self, config: TopicConfig) -> None:
        topics = {**self._topics, config.topic: config}
        body = {"topics": {name: {k: v for k, v in asdict(c).items() if k != "topic"}
                           for name, c in sorted(topics.items())}}
        write_atomically(self.path, json.dumps(body, indent=2).encode(), keep_backup=True)
        self._topics = topics
