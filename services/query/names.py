"""Checks of the names and numbers a request carries, done once at the edge before any backend call."""

from __future__ import annotations

import re

from services.commitlog.topic_config import MAX_QUEUE_NUMS, check_topic_name
from services.store.errors import InvalidArgumentError
from services.store.message import NAME_VALUE_SEPARATOR, PROPERTY_SEPARATOR

# RocketMQ's group name rule (the topic rule's characters), at most 255 characters.
_LEGAL_GROUP = re.compile(r"^[%|a-zA-Z0-9_.\-]+$")
MAX_GROUP_LENGTH = 255
# A key lives in the properties string, whose length is a signed 16-bit number.
MAX_KEY_BYTES = 32767

__all__ = ["MAX_QUEUE_NUMS", "check_group", "check_key", "check_offset", "check_queue", "check_topic_name"]


def check_queue(topic: str, queue_id: int) -> None:
    check_topic_name(topic)
    if not 0 <= queue_id < MAX_QUEUE_NUMS:
        raise InvalidArgumentError(f"queue id {queue_id} must be within 0..{MAX_QUEUE_NUMS - 1}")


def check_group(group: str) -> None:
    if not group:
        raise InvalidArgumentError("consumer group is empty: give a group name")
    if len(group) > MAX_GROUP_LENGTH:
        raise InvalidArgumentError(f"consumer group {group[:40]!r}... is longer than {MAX_GROUP_LENGTH} characters")
    if not _LEGAL_GROUP.match(group):
        raise InvalidArgumentError(f"consumer group {group!r} has illegal characters: use letters, digits and %|_.-")


def check_offset(name: str, value: int) -> None:
    if value < 0:
        raise InvalidArgumentError(f"{name} {value} is negative")


def check_key(key: str) -> None:
    """A key that could be stored in a record's KEYS or UNIQ_KEY property."""
    if not key:
        raise InvalidArgumentError("key is empty: give the key to look up")
    if len(key.encode("utf-8", "surrogatepass")) > MAX_KEY_BYTES:
        raise InvalidArgumentError(f"key {key[:40]!r}... is longer than {MAX_KEY_BYTES} bytes")
    if NAME_VALUE_SEPARATOR in key or PROPERTY_SEPARATOR in key:
        raise InvalidArgumentError(f"key {key[:40]!r} contains a property separator (\\x01 or \\x02)")
