"""After a power cut the indexer rebuilds the ConsumeQueue units past its dispatch checkpoint from the
log, so for a moment after the restart a queue's max offset is below what the scheduler's durable
progress records. The scheduler must not take that for RocketMQ's "the indexer truncated past it" and
go back: going back delivers the units between again (a delay-level or timer message twice)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from services.scheduler.delivery import DelayScheduler
from services.store.formats.delay_offsets_file import write_delay_offsets

LOG_END = 5000


class RebuildingIndexer:
    """A restarted indexer: units up to queue offset 1 at first, all 3 once it dispatched the log."""

    def __init__(self) -> None:
        self.reput = 1000

    async def queue_offsets(self, topic: str, queue_id: int) -> tuple[int, int]:
        return (0, 3 if self.reput >= LOG_END else 1)

    async def reput_offset(self) -> int:
        self.reput = min(LOG_END, self.reput + 2000)  # catching up a little with each question
        return self.reput


class CommitLog:
    async def log_end(self) -> int:
        return LOG_END


def test_a_delay_level_does_not_go_back_while_the_indexer_rebuilds(tmp_path: Path) -> None:
    offsets = tmp_path / "delayOffset.json"
    write_delay_offsets(offsets, {1: 3}, scan_from=LOG_END)  # three units of level 1 delivered before the cut
    files: Any = None
    scheduler = DelayScheduler((1000,), offsets, files, RebuildingIndexer(), CommitLog(),  # type: ignore[arg-type]
                               persist_interval_s=10)
    scheduler.load()
    asyncio.run(scheduler._refresh_bounds())
    assert scheduler.table() == {1: 3}, "the level went back to a max offset read before the indexer caught up"
