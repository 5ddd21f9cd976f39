"""The cold-read rule and the gateway's table of pulls that go to a follower (slaveReadEnable)."""

from __future__ import annotations

import pytest

from gateway.cold_reads import ColdReads, follower_for
from services.store.config import ConfigError, load_config
from services.store.rules.cold_read import cold_read_threshold, is_cold, physical_memory_bytes


def test_a_read_is_cold_past_the_share_of_memory_as_rocketmq_compares() -> None:
    threshold = cold_read_threshold(40, memory_bytes=1000)
    assert threshold == 400
    assert not is_cold(10_000, 9_600, threshold)  # exactly the share behind: still in memory
    assert is_cold(10_000, 9_599, threshold)
    assert 0 < cold_read_threshold(40) <= physical_memory_bytes()


def test_the_ratio_is_a_percent_and_slave_read_is_off_by_default() -> None:
    config = load_config(environ={})
    assert config.slave_read_enable is False and config.access_message_in_memory_max_ratio == 40
    half = load_config(environ={"MQSTORE_ACCESS_MESSAGE_IN_MEMORY_MAX_RATIO": "0.5"})
    assert half.access_message_in_memory_max_ratio == 0.5
    with pytest.raises(ConfigError, match="accessMessageInMemoryMaxRatio"):
        load_config(environ={"MQSTORE_ACCESS_MESSAGE_IN_MEMORY_MAX_RATIO": "101"})


def test_a_suggestion_holds_for_the_pull_that_starts_where_the_cold_one_ended_once() -> None:
    reads = ColdReads(max_remembered=2)
    reads.remember("t", 0, 8)
    assert not reads.take("t", 0, 7) and not reads.take("t", 1, 8)
    assert reads.take("t", 0, 8)
    assert not reads.take("t", 0, 8), "used up: the next pull asks the leader unless told again"
    for offset in (1, 2, 3):
        reads.remember("t", 0, offset)
    assert len(reads) == 2 and not reads.take("t", 0, 1), "the oldest is forgotten first"


def test_a_queue_keeps_to_one_follower_and_queues_spread_over_them() -> None:
    followers = ["replica-2", "replica-1"]
    assert follower_for("t", 3, followers) == follower_for("t", 3, list(reversed(followers)))
    assert {follower_for("t", q, followers) for q in range(16)} == set(followers)
