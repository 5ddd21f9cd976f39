"""Names and numbers every service checks the same way: topics, consumer groups, queue ids, offsets.

A topic name becomes a directory (``consumequeue/<topic>/<queue id>``) and a key of
``config/*.json``; a group name a key of the consumer offsets. So the rule is RocketMQ's
TopicValidator (its characters, at most 127 characters) plus what keeps a name a single, harmless
path component: ``.`` and ``..`` are refused. The ``.`` character itself stays legal because real
RocketMQ brokers store such topics (the fixtures have ``Topic-Long-Name_with.chars``).

System topics are the broker's own: producers may not send to them directly, only through the flow
that owns them (delayed delivery writes ``SCHEDULE_TOPIC_XXXX``, transactions the half topics,
consumer retry and dead letters the ``%RETRY%`` and ``%DLQ%`` topics).
"""

from __future__ import annotations

import re

from services.store.errors import InvalidArgumentError
from services.store.formats.message import NAME_VALUE_SEPARATOR, PROPERTY_SEPARATOR
from services.store.formats.record import MAX_TOPIC_LENGTH_V1

#: RocketMQ's TopicValidator.TOPIC_MAX_LENGTH: the 127 the v1 record's TOPICLEN byte allows.
MAX_TOPIC_LENGTH = MAX_TOPIC_LENGTH_V1
MAX_GROUP_LENGTH = 255
MAX_QUEUE_NUMS = 1024
# A key lives in the properties string, whose length is a signed 16-bit number.
MAX_KEY_BYTES = 32767
_LEGAL_NAME = re.compile(r"^[%|a-zA-Z0-9_.\-]+$")

SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
AUTO_CREATE_TOPIC = "TBW102"
RETRY_GROUP_TOPIC_PREFIX = "%RETRY%"
DLQ_GROUP_TOPIC_PREFIX = "%DLQ%"
SYSTEM_TOPIC_PREFIX = "RMQ_SYS_"
#: Topics of the broker's own flows (RocketMQ's TopicValidator system topics).
SYSTEM_TOPICS = frozenset({
    SCHEDULE_TOPIC, AUTO_CREATE_TOPIC, "RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC",
    "RMQ_SYS_TRACE_TOPIC", "TRANS_CHECK_MAX_TIME_TOPIC", "SELF_TEST_TOPIC", "OFFSET_MOVED_EVENT",
    "BenchmarkTest", "rmq_sys_wheel_timer",
})


def _check_name(kind: str, name: str, max_length: int) -> None:
    if not name:
        raise InvalidArgumentError(f"{kind} is empty: give a {kind} name")
    if len(name) > max_length:
        raise InvalidArgumentError(f"{kind} {name[:40]!r}... is longer than {max_length} characters")
    if not _LEGAL_NAME.match(name):
        raise InvalidArgumentError(f"{kind} {name[:60]!r} has illegal characters: use letters, digits and %|_.-")
    if name.strip(".") == "":
        raise InvalidArgumentError(f"{kind} {name!r} is not a name (it would name a directory of the store)")


def check_topic_name(topic: str) -> None:
    """A topic name that is safe everywhere it is used: in records, paths and config files."""
    _check_name("topic", topic, MAX_TOPIC_LENGTH)


def check_group(group: str) -> None:
    """A consumer group name (RocketMQ's topic characters, at most 255 characters)."""
    _check_name("consumer group", group, MAX_GROUP_LENGTH)


def check_producer_group(group: str) -> None:
    """A producer group name: the same rules as a consumer group's (RocketMQ checks both alike)."""
    _check_name("producer group", group, MAX_GROUP_LENGTH)


def is_system_topic(topic: str) -> bool:
    return topic in SYSTEM_TOPICS or topic.startswith(SYSTEM_TOPIC_PREFIX)


def check_deletable_topic(topic: str) -> None:
    """A topic that DeleteTopic may remove: a legal name that is not one of the store's own flows
    (every service that deletes checks it: an internal caller must not drop SCHEDULE_TOPIC_XXXX either)."""
    check_topic_name(topic)
    if is_system_topic(topic):
        raise InvalidArgumentError(f"topic {topic!r} is a system topic: the store's own flows use it, it cannot "
                                   "be deleted")


def is_group_topic(topic: str) -> bool:
    """A consumer group's retry or dead-letter topic."""
    return topic.startswith((RETRY_GROUP_TOPIC_PREFIX, DLQ_GROUP_TOPIC_PREFIX))


def check_producer_topic(topic: str) -> None:
    """A topic a producer may send to directly: a legal name that no broker flow owns."""
    check_topic_name(topic)
    if is_system_topic(topic):
        raise InvalidArgumentError(f"topic {topic!r} is a system topic: producers may not send to it "
                                   "(delayed messages use the DELAY property or TIMER_DELIVER_MS, not "
                                   "SCHEDULE_TOPIC_XXXX or rmq_sys_wheel_timer)")
    if is_group_topic(topic):
        raise InvalidArgumentError(f"topic {topic!r} belongs to a consumer group's retry or dead-letter "
                                   "flow: producers may not send to it")


def check_queue(topic: str, queue_id: int) -> None:
    check_topic_name(topic)
    if not 0 <= queue_id < MAX_QUEUE_NUMS:
        raise InvalidArgumentError(f"queue id {queue_id} must be within 0..{MAX_QUEUE_NUMS - 1}")


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
