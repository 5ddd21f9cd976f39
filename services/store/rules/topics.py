"""A topic's configuration (queue counts and permission) and the rule every service checks it by.

The commitlog service keeps the table (``config/topics.json``); the gateway checks a CreateTopic or
UpdateTopic before it reaches any shard, with the same rule.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.store.errors import InvalidArgumentError
from services.store.rules.names import MAX_QUEUE_NUMS, check_topic_name

PERM_WRITE = 0x2
PERM_READ = 0x4
PERM_READ_WRITE = PERM_READ | PERM_WRITE


@dataclass(slots=True, frozen=True)
class TopicConfig:
    topic: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int = PERM_READ_WRITE


def check_topic_config(config: TopicConfig) -> None:
    check_topic_name(config.topic)
    for name in ("read_queue_nums", "write_queue_nums"):
        value = getattr(config, name)
        if not 1 <= value <= MAX_QUEUE_NUMS:
            raise InvalidArgumentError(f"{name} of {config.topic!r} is {value}: it must be within 1..{MAX_QUEUE_NUMS}")
    if config.perm & ~PERM_READ_WRITE or config.perm == 0:
        raise InvalidArgumentError(f"perm of {config.topic!r} is {config.perm}: use 2 (write), 4 (read) or 6 (both)")
