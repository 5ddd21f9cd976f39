"""The replication fault campaign at length (``make soak-ha``, ``SOAK_MINUTES``): a SYNC_MASTER leader
and two followers under producers, a follower killed with SIGKILL at random points and restarted,
over and over. At every stop point the surviving follower's commitlog equals the leader's up to its
offset; no put is refused while a follower is up; at the end both followers equal the leader byte
for byte (test_replication.py compares the indexers' ConsumeQueues and IndexFiles).

Skipped in ``make test``: ``test_replication.py`` runs one kill and restart there.
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import pytest

from tests.commitlog.commitlog_process import StartCommitLog
from tests.commitlog.replicas import (
    Producers,
    assert_same_commitlog,
    follower_env,
    max_offset,
    start_group,
    wait_caught_up,
)

MINUTES = float(os.environ.get("SOAK_HA_MINUTES", "0"))


@pytest.mark.skipif(not MINUTES, reason="the long replication campaign: make soak-ha (SOAK_MINUTES)")
def test_follower_kills_under_sync_master(start_commitlog: StartCommitLog, tmp_path: Path) -> None:
    rng = random.Random(int(os.environ.get("SOAK_SEED", "0")) or None)
    group = start_group(start_commitlog, tmp_path, followers=2)
    leader = group.leader
    producers = Producers(leader, count=3).start()
    deadline = time.monotonic() + MINUTES * 60
    kills = 0
    started = time.monotonic()
    try:
        while time.monotonic() < deadline:
            victim = rng.randrange(2)
            survivor = group.followers[1 - victim]
            time.sleep(rng.uniform(0.2, 2.0))
            group.followers[victim].kill9()
            kills += 1
            reached = max_offset(survivor)  # a stop point
            assert_same_commitlog(leader.store_dir, survivor.store_dir, reached)
            time.sleep(rng.uniform(0.0, 1.0))
            group.followers[victim] = start_commitlog(group.followers[victim].store_dir, follower_env(group.ha_port))
            wait_caught_up(leader, group.followers[victim], timeout_s=60)
    finally:
        producers.stop()
    elapsed = time.monotonic() - started
    for follower in group.followers:
        end = wait_caught_up(leader, follower)
        assert_same_commitlog(leader.store_dir, follower.store_dir, end)
    print(f"\nsoak-ha: {kills} follower kills in {elapsed:.0f} s, {len(producers.acked)} puts acknowledged "
          f"({len(producers.acked) / elapsed:.0f}/s), {len(producers.errors)} refused, log {max_offset(leader)} bytes")
    assert not producers.errors, producers.errors[:5]
