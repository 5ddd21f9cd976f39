"""The room the indexer still needs for what the commitlog has acknowledged, kept free on a full disk.

An acknowledged message is pullable and findable by key only once the indexer has written its
ConsumeQueue unit and its index entries. Those files are sparse: they take space as they are written
(a ConsumeQueue page at a time), so the commitlog refuses writes (``DiskGuard``) while the disk no
longer holds, besides its own next reservation:

* per queue of the topic table, the pages its acknowledged units need and its files have no blocks
  for yet (the indexer's lag), and one more page (where the queue's next unit may start);
* the next index file, and whatever of the last one is not allocated yet;
* ``CHECKPOINT_BYTES`` for the checkpoints and config files the indexer and the query service
  rewrite (each one as a new file renamed over the old).

It is measured from the indexer's own files (read-only: a ``stat`` per queue, one listing of the index
directory) at every disk refresh; between two refreshes the put path counts the ConsumeQueue files
its messages start (:meth:`DiskGuard.charge_queue_pages`). None of it is kept when the indexer's files
are on another disk, or not here at all (an indexer on another machine).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from services.store.disk_space import MIB, allocated_bytes, unallocated_bytes
from services.store.formats.consume_queue import CQ_STORE_UNIT_SIZE
from services.store.formats.index_file import is_index_file_name
from services.store.formats.mapped_file import OS_PAGE_SIZE, file_name, parse_file_name
from services.store.formats.store_layout import StoreLayout, StoreLayoutError, resolve_store

log = logging.getLogger(__name__)

#: Checkpoints and config files rewritten on a full disk (checkpoint, dispatch_checkpoint.json,
#: reput.json, consumerOffset.json, each once more as the copy renamed over it).
CHECKPOINT_BYTES = MIB

QueueKey = tuple[str, int]
QueueTable = Callable[[], Mapping[QueueKey, int]]
#: Measures after which the queues found settled are looked at again (a file deleted under them).
RECHECK_SETTLED_EVERY = 60


@dataclass(frozen=True, slots=True)
class Headroom:
    """Bytes to keep free for the indexer. ``queue_page_size`` is what one new ConsumeQueue page
    costs on this disk (0: the indexer's files are elsewhere)."""

    queues: int = 0
    consume_queue: int = 0
    index: int = 0
    checkpoints: int = 0
    queue_page_size: int = 0

    @property
    def total(self) -> int:
        return self.consume_queue + self.index + self.checkpoints

    def describe(self) -> str:
        queues = f"{self.queues} queue" + ("" if self.queues == 1 else "s")
        return (f"the {self.total / MIB:.1f} MiB kept for the indexer to write what was acknowledged (ConsumeQueue "
                f"files for {queues} {self.consume_queue / MIB:.1f} MiB, index files {self.index / MIB:.1f} MiB, "
                f"checkpoints {self.checkpoints / MIB:.1f} MiB)")


NO_HEADROOM = Headroom()


class IndexerHeadroom:
    """Measures :class:`Headroom` for the store at ``store_root`` whose commitlog is ``commitlog_dir``;
    ``queues`` gives the topic table's next queue offsets."""

    def __init__(self, store_root: Path, commitlog_dir: Path, queues: QueueTable, queue_file_size: int,
                 index_file_size: int) -> None:
        """``index_file_size``: 0 when the index is off (messageIndexEnable false)."""
        self.store_root = store_root
        self.commitlog_dir = commitlog_dir
        self.queues = queues
        self.queue_file_size = queue_file_size
        self.index_file_size = index_file_size
        self._layout: StoreLayout | None = None
        self._told = ""
        # queue -> its end when its files had blocks for every acknowledged unit: it needs one page
        # more until its end moves (no stat needed).
        self._settled: dict[QueueKey, int] = {}
        self._measures = 0

    def measure(self) -> Headroom:
        """The headroom now; NO_HEADROOM when the indexer's files are not on the commitlog's disk."""
        try:
            elsewhere = self._elsewhere()
        except OSError as exc:
            elsewhere = f"its files cannot be inspected ({exc})"
        if elsewhere:
            self._tell(f"no room is kept for the indexer on the commitlog's disk: {elsewhere}")
            return NO_HEADROOM
        self._tell("")
        assert self._layout is not None
        self._measures += 1
        if self._measures % RECHECK_SETTLED_EVERY == 0:
            self._settled.clear()
        consumequeue, settled = self._layout.consumequeue, self._settled
        table = self.queues()
        queue_bytes = 0
        for key, end in table.items():
            if end <= 0:
                continue
            if settled.get(key) == end:
                queue_bytes += OS_PAGE_SIZE
                continue
            needs = self._queue_needs(consumequeue / key[0] / str(key[1]), end)
            if needs == OS_PAGE_SIZE:
                settled[key] = end
            queue_bytes += needs
        return Headroom(len(table), queue_bytes, self._index_needs(self._layout.index), CHECKPOINT_BYTES,
                        OS_PAGE_SIZE)

    def _elsewhere(self) -> str:
        """Why the indexer's files are not on this disk ("" when they are). Resolved every time: a new
        store's layout shows once the indexer has started."""
        try:
            self._layout = layout = resolve_store(self.store_root)
            logic = layout.logic_root
        except StoreLayoutError as exc:
            return str(exc)
        if not (logic != layout.root and logic.is_dir() or layout.consumequeue.is_dir() or layout.index.is_dir()):
            return f"no ConsumeQueue or index files under {logic} (the indexer runs elsewhere, or has not started)"
        if os.stat(logic).st_dev != os.stat(self.commitlog_dir).st_dev:
            return f"{logic} is on another file system"
        return ""

    def _queue_needs(self, directory: Path, end: int) -> int:
        """Bytes queue ``directory`` still needs for its ``end`` acknowledged units and its next one.
        Units fill a file from its start, so those of the last file take its first pages."""
        size = self.queue_file_size
        last_start = (end - 1) * CQ_STORE_UNIT_SIZE // size * size
        in_last = _pages(end * CQ_STORE_UNIT_SIZE - last_start)
        try:
            return OS_PAGE_SIZE + max(0, in_last - allocated_bytes(directory / file_name(last_start)))
        except FileNotFoundError:
            pass
        # The indexer is behind on this queue: the files up to the last unit's are still to come.
        try:
            starts = [parse_file_name(p) for p in directory.iterdir() if is_store_file_name(p.name)]
        except (FileNotFoundError, NotADirectoryError):
            starts = []
        if not starts:
            return OS_PAGE_SIZE + in_last  # the indexer starts the queue at the file of its unit
        last = max(starts)
        between = max(0, (last_start - last) // size - 1)  # files after the last one, before last_start
        return OS_PAGE_SIZE + unallocated_bytes(directory / file_name(last), size) + between * _pages(size) + in_last

    def _index_needs(self, directory: Path) -> int:
        size = self.index_file_size
        if not size:
            return 0
        try:
            names = sorted(n for n in os.listdir(directory) if is_index_file_name(n))
        except (FileNotFoundError, NotADirectoryError):
            names = []
        if not names:
            return size
        try:
            return size + unallocated_bytes(directory / names[-1], size)
        except FileNotFoundError:  # expired meanwhile
            return size

    def _tell(self, why: str) -> None:
        if why and why != self._told:
            log.info("%s", why)
        self._told = why


def _pages(size: int) -> int:
    return -(-size // OS_PAGE_SIZE) * OS_PAGE_SIZE


def is_store_file_name(name: str) -> bool:
    return len(name) == 20 and name.isdigit()
