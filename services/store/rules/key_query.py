"""A query by key's bounds (RocketMQ's queryMessage: at most 64 messages, 32 by default), checked
wherever the query enters: the gateway before it fans out to the shards, the query service before
it reads the index."""

from __future__ import annotations

from services.store.errors import InvalidArgumentError
from services.store.rules.names import check_key, check_offset, check_topic_name

INT64_MAX = (1 << 63) - 1
DEFAULT_MAX_NUM = 32
# maxMsgsNumBatch: the index answers at most this many hits per query.
MAX_NUM = 64
# Index hits one key query walks at most (the indexer's QueryByKey: skip + max_num). Beyond RocketMQ,
# which keeps the first maxMsgsNumBatch hits whatever they are: a bound on the records read when hash
# collisions crowd a key's chain.
MAX_HITS_WALKED = 1024


def check_key_query(topic: str, key: str, begin_ms: int, end_ms: int, max_num: int) -> tuple[int, int]:
    """The arguments of a key query; returns (end ms, max num) with their defaults applied."""
    check_topic_name(topic)
    check_key(key)
    check_offset("begin timestamp", begin_ms)
    check_offset("end timestamp", end_ms)
    end = end_ms or INT64_MAX
    if begin_ms > end:
        raise InvalidArgumentError(f"begin timestamp {begin_ms} is after end timestamp {end_ms}")
    max_num = max_num or DEFAULT_MAX_NUM
    if not 1 <= max_num <= MAX_NUM:
        raise InvalidArgumentError(f"max num {max_num} must be within 0..{MAX_NUM} (0 means {DEFAULT_MAX_NUM})")
    return end, max_num
