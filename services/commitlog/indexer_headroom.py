"""The room the indexer still needs for what the commitlog has acknowledged, kept free on a full disk.

An acknowledged message is pullable and findable by key only once the indexer has written its
ConsumeQueue unit and its index entries. Those files take space when they are created (ConsumeQueue
and index files are allocated whole), or as they are written if they are sparse, so the commitlog
refuses writes (``DiskGuard``) while the disk no longer holds, besides its own next file:

* per queue of the topic table, the ConsumeQueue files its acknowledged units need and the indexer has
  not created yet (its lag), one more (the file the queue's next unit starts), and whatever of its
  last file is not allocated yet (a sparse file fills as it is written);
* the next index file, and whatever of the last one is not allocated yet;
* ``CHECKPOINT_BYTES`` for the checkpoints and config files the indexer and the query service
  rewrite (each one as a new file renamed over the old).

It is measured from the indexer's own files (read-only: a ``stat`` per queue, one listing of the index
directory) at every disk refresh; between two refreshes the put path counts the ConsumeQueue files
its messages start (:meth:`DiskGuard.charge_queue_files`). None of it is kept when the indexer's files
are on another disk, or not here at all (an indexer on another machine).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from mqstore.services.store.consume_queue import CQ_STORE_UNIT_SIZE
from mqstore.services.store.disk_space import MIB, unallocated_bytes
from mqstore.services.store.index_file import is_index_file_name
from mqstore.services.store.mapped_file import file_name, parse_file_name
from mqstore.services.store.store_layout import StoreLayout, StoreLayoutError, resolve_store

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
    """Bytes to keep free for the indexer. ``queue_file_size`` is what one new ConsumeQueue file
    costs on this disk (0: the indexer's files are elsewhere)."""

    queues: int = 0
    consume_queue: int = 0
    index: int = 0
    checkpoints: int = 0
    queue_file_size: int = 0

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
        # queue -> start of its last acknowledged unit's file, for queues whose file there is created
        # and wholly allocated: they need one more file until their end passes it (no stat needed).
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
        consumequeue, size, settled = self._layout.consumequeue, self.queue_file_size, self._settled
        table = self.queues()
        queue_bytes = 0
        for key, end in table.items():
            if end <= 0:
                continue
            last_start = (end - 1) * CQ_STORE_UNIT_SIZE // size * size
            if settled.get(key) == last_start:
                queue_bytes += size
                continue
            needs = self._queue_needs(consumequeue / key[0] / str(key[1]), last_start)
            if needs == size:
                settled[key] = last_start
            queue_bytes += needs
        return Headroom(len(table), queue_bytes, self._index_needs(self._layout.index), CHECKPOINT_BYTES,
                        self.queue_file_size)

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

    def _queue_needs(self, directory: Path, last_start: int) -> int:
        """Bytes queue ``directory`` still needs for its acknowledged units, the last of which lies in
        the file starting at byte ``last_start``, and for its next one."""
        size = self.queue_file_size
        try:
            return size + unallocated_bytes(directory / file_name(last_start), size)
        except FileNotFoundError:
            pass
        # The indexer is behind on this queue: the files up to the last unit's are still to come.
        try:
            starts = [parse_file_name(p) for p in directory.iterdir() if is_store_file_name(p.name)]
        except (FileNotFoundError, NotADirectoryError):
            starts = []
        if not starts:
            return 2 * size  # the file of its first unit (where the indexer starts it) and the next
        last = max(starts)
        missing = max(0, (last_start - last) // size)
        return (missing + 1) * size + unallocated_bytes(directory / file_name(last), size)

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


def is_store_file_name(name: str) -> bool:
    return len(name) == 20 and name.isdigit()
