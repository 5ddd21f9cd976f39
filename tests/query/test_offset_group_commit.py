"""Commits that wait to be durable share writes (a group commit): a burst costs a couple of writes, not
one fsync each, and every waiter's change is in the write that answers it."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from services.query.consumer_offsets import ConsumerOffsetTable
from services.store.config import MessageStoreConfig
from services.store.formats.consumer_offsets_file import read_offset_table
from services.store.formats.table_journal import journal_path


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
    on_disk = read_offset_table(table.path)["T@g"]  # the file and the journal the writes appended to
    assert on_disk == {q: q + 1 for q in range(64)}
    assert not table.dirty


def test_sync_commit_follows_the_flush_mode() -> None:
    assert not MessageStoreConfig().consumer_offset_commit_sync
    assert MessageStoreConfig(flush_disk_type="SYNC_FLUSH").consumer_offset_commit_sync
    assert not MessageStoreConfig(flush_disk_type="SYNC_FLUSH",
                                  sync_consumer_offset_commit="false").consumer_offset_commit_sync
    assert MessageStoreConfig(sync_consumer_offset_commit="true").consumer_offset_commit_sync


def test_a_write_costs_the_commits_it_carries_not_the_table(tmp_path: Path) -> None:
    """With 3,000 offsets committed, a commit's write appends one journal line and leaves the file."""
    table = ConsumerOffsetTable(tmp_path)
    for q in range(3000):
        table.commit(f"g{q // 8}", "T", q % 8, q + 1)
    table.persist()  # a clean stop: one file
    snapshot = table.path.stat()
    table.commit("g0", "T", 0, 99)
    table.write(table.snapshot())
    after = table.path.stat()
    assert (after.st_ino, after.st_mtime_ns) == (snapshot.st_ino, snapshot.st_mtime_ns)
    assert 0 < journal_path(table.path).stat().st_size < 100
    again = ConsumerOffsetTable(tmp_path)
    again.load()
    assert again.query("g0", "T", 0) == 99 and again.entries == 3000
