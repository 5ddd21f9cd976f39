"""A table the query service keeps in memory and writes whole, atomically, when it changed: the consumer
offsets and the v2 consumers' pop checkpoints.

Writes run on a worker thread every persist interval and on the stop path; a version counts the
changes, so a write records which version it saved, and a change made while it ran keeps the table
dirty for the next interval. One write at a time: the periodic writer may still be in its thread
when the stop path writes.

A table whose changes must be durable when answered (consumer offsets under SYNC_FLUSH) awaits
``durable()`` after a change: a group commit. One write runs at a time and holds every change made
before its snapshot; callers arriving while it runs wait for the next one, which covers them all,
so a burst of commits costs two writes, not one fsync each, and the loop never blocks on the fsync.
"""

from __future__ import annotations

import asyncio
import threading
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Generic, TypeVar

from services.store.store_root import write_atomically

Snapshot = TypeVar("Snapshot")


class StateFile(ABC, Generic[Snapshot]):
    def __init__(self, path: Path) -> None:
        self.path = path
        self._version = 0
        self._persisted_version = 0
        self._write_lock = threading.Lock()
        self._group_write: asyncio.Future[None] | None = None

    @property
    def dirty(self) -> bool:
        return self._version != self._persisted_version

    def changed(self) -> None:
        self._version += 1

    def snapshot(self) -> tuple[int, Snapshot]:
        """The table now (on the event loop: cheap, no I/O), with its version."""
        return self._version, self._copy()

    @abstractmethod
    def _copy(self) -> Snapshot:
        """A copy of the table that later changes leave alone."""

    @abstractmethod
    def _encode(self, snapshot: Snapshot) -> bytes:
        """The file's bytes for a snapshot."""

    def write(self, snapshot: tuple[int, Snapshot]) -> None:
        """Encode and write a snapshot (blocking: fsyncs); meant for a worker thread."""
        version, table = snapshot
        data = self._encode(table)
        with self._write_lock:
            write_atomically(self.path, data, keep_backup=True)
            self._persisted_version = max(self._persisted_version, version)

    async def durable(self) -> None:
        """Return once a write holding every change made so far is durable (OSError if one failed).

        The write runs on a worker thread and is shielded: a caller that is cancelled leaves it to
        finish for the others waiting on it."""
        target = self._version
        while self._persisted_version < target:
            if self._group_write is None:
                self._group_write = asyncio.ensure_future(self._write_group())
            await asyncio.shield(self._group_write)

    async def _write_group(self) -> None:
        try:
            await asyncio.to_thread(self.write, self.snapshot())
        finally:
            self._group_write = None

    def persist(self) -> None:
        """Write now if changed (the stop path: no loop, no thread)."""
        if self.dirty:
            self.write(self.snapshot())
