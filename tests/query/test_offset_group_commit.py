"""Commits that wait to be durable share writes (a group commit): a burst costs a couple of writes, not
one fsync each, and every waiter's change is in the write that answers it."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

from services.query.consumer_offsets import ConsumerOffsetTable
from services.store.config import MessageStoreConfig


class CountingTable(ConsumerOffsetTable):
    def __init__(self, config_dir: Path) -> None:
        super().__init__(config_dir)
        self.writes = 0
        self.release = threading.Event()

    def write(self, snapshot: tuple[int, dict[str, dict[int, int]]]) -> None:
        self.writes += 1
        self.release.wait(5)  # a slow fsync: the commits arriving meanwhile wait for the next write
        super().write(snapshot)


def test_a_burst_of_durable_commits_shares_writes(tmp_path: Path) -> None:
    table = CountingTable(tmp_path)

    async def commit(queue_id: int) -> None:
        table.commit("g", "T", queue_id, queue_id + 1)
        await table.durable()

    async def burst() -> None:
        first = asyncio.create_task(commit(0))
        await asyncio.sleep(0.05)  # the first write is running now
        rest = [asyncio.create_task(commit(q)) for q in range(1, 64)]
        await asyncio.sleep(0.05)
        table.release.set()
        await asyncio.gather(first, *rest)

    asyncio.run(burst())
    assert table.writes == 2, f"{table.writes} writes for 64 commits: one for the first, one for the rest"
    on_disk = json.loads(table.path.read_text())["offsetTable"]["T@g"]
    assert on_disk == {str(q): q + 1 for q in range(64)}
    assert not table.dirty


def test_sync_commit_follows_the_flush_mode() -> None:
    assert not MessageStoreConfig().consumer_offset_commit_sync
    assert MessageStoreConfig(flush_disk_type="SYNC_FLUSH").consumer_offset_commit_sync
    assert not MessageStoreConfig(flush_disk_type="SYNC_FLUSH",
                                  sync_consumer_offset_commit="false").consumer_offset_commit_sync
    assert MessageStoreConfig(sync_consumer_offset_commit="true").consumer_offset_commit_sync
