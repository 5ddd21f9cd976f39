"""Message domain types, property names, sysflag bits and the properties string codec.

These mirror RocketMQ's MessageConst / MessageSysFlag so that a RocketMQ engineer recognises every
name. The byte layout of a stored record lives in :mod:`services.store.formats.record`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from services.store.formats.java_hash import java_string_hash

# Separators of the properties string: name \x01 value \x02 name \x01 value \x02 ...
NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"

# Well-known property names (RocketMQ MessageConst).
PROPERTY_KEYS = "KEYS"
PROPERTY_TAGS = "TAGS"
PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX = "UNIQ_KEY"
PROPERTY_DELAY_TIME_LEVEL = "DELAY"
PROPERTY_REAL_TOPIC = "REAL_TOPIC"
PROPERTY_REAL_QUEUE_ID = "REAL_QID"
PROPERTY_TRANSACTION_PREPARED = "TRAN_MSG"
PROPERTY_WAIT_STORE_MSG_OK = "WAIT"
PROPERTY_CLUSTER = "CLUSTER"
#: RocketMQ 5's message group (FIFO): a send's sharding key, kept so v2 consumers see the group.
PROPERTY_SHARDING_KEY = "__SHARDINGKEY"
KEY_SEPARATOR = " "

# sysFlag bits (RocketMQ MessageSysFlag).
COMPRESSED_FLAG = 0x1
MULTI_TAGS_FLAG = 0x2
TRANSACTION_NOT_TYPE = 0x0
TRANSACTION_PREPARED_TYPE = 0x4
TRANSACTION_COMMIT_TYPE = 0x8
TRANSACTION_ROLLBACK_TYPE = 0xC
TRANSACTION_TYPE_MASK = 0xC
BORNHOST_V6_FLAG = 0x10
STOREHOSTADDRESS_V6_FLAG = 0x20

SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"

# Default MessageStoreConfig.messageDelayLevel, parsed into milliseconds per level (level 1 first).
DEFAULT_MESSAGE_DELAY_LEVEL = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
_TIME_UNIT_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_delay_levels(spec: str) -> tuple[int, ...]:
    """``"1s 5s 1m"`` -> (1000, 5000, 60000): milliseconds of delay level 1, 2, 3..."""
    levels = []
    for item in spec.split():
        unit = item[-1]
        if unit not in _TIME_UNIT_MS or not item[:-1].isdigit():
            raise ValueError(f"delay level {item!r} must be a number followed by one of s, m, h, d")
        levels.append(int(item[:-1]) * _TIME_UNIT_MS[unit])
    return tuple(levels)


DEFAULT_DELAY_LEVELS_MS = parse_delay_levels(DEFAULT_MESSAGE_DELAY_LEVEL)


def transaction_type(sys_flag: int) -> int:
    return sys_flag & TRANSACTION_TYPE_MASK


def properties_to_string(properties: dict[str, str]) -> str:
    """RocketMQ 4.9.x messageProperties2String: pairs joined by the property separator, with no
    separator after the last pair (the 4.9.8 fixture records end ``...CLUSTER\x01DefaultCluster``).
    A trailing separator would make every record one byte longer than RocketMQ's."""
    return PROPERTY_SEPARATOR.join(f"{k}{NAME_VALUE_SEPARATOR}{v}" for k, v in properties.items())


def string_to_properties(text: str) -> dict[str, str]:
    """RocketMQ's string2messageProperties (4.9.x): an item splits at its first name/value separator;
    items with an empty name or an empty value are dropped, and a value may contain the name/value
    separator. Getting this exactly right matters: keys, tags and DELAY feed the CQ and the index.
    (On the dispatch path: split and partition keep the per-item work in C.)"""
    properties: dict[str, str] = {}
    for item in text.split(PROPERTY_SEPARATOR):
        name, sep, value = item.partition(NAME_VALUE_SEPARATOR)
        if name and value:
            properties[name] = value
    return properties


def tags_code(tags: str | None) -> int:
    """RocketMQ's tagsString2tagsCode: Java hashCode of the TAGS string, 0 without tags.
    Memoised: a topic has few distinct tags, and this runs for every dispatched record."""
    if not tags:
        return 0
    code = _TAGS_CODES.get(tags)
    if code is None:
        code = java_string_hash(tags)
        if len(_TAGS_CODES) < _TAGS_CODES_MAX:
            _TAGS_CODES[tags] = code
    return code


_TAGS_CODES: dict[str, int] = {}
_TAGS_CODES_MAX = 65536


@dataclass(slots=True)
class Message:
    """A message as a producer hands it to the store (before the store assigns offsets)."""

    topic: str
    queue_id: int
    body: bytes = b""
    flag: int = 0
    properties: dict[str, str] = field(default_factory=dict)
    born_timestamp: int = 0
    born_host: str = "127.0.0.1:0"
    sys_flag: int = 0
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0


@dataclass(slots=True, frozen=True)
class MessageRecord:
    """One decoded record of the CommitLog: every field of the stored layout."""

    store_size: int
    magic: int
    body_crc: int
    queue_id: int
    flag: int
    queue_offset: int
    commitlog_offset: int
    sys_flag: int
    born_timestamp: int
    born_host: str
    store_timestamp: int
    store_host: str
    reconsume_times: int
    prepared_transaction_offset: int
    body: bytes
    topic: str
    properties: dict[str, str]

    @property
    def keys(self) -> str | None:
        return self.properties.get(PROPERTY_KEYS)

    @property
    def tags(self) -> str | None:
        return self.properties.get(PROPERTY_TAGS)

    @property
    def uniq_key(self) -> str | None:
        return self.properties.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX)
