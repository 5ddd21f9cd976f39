"""Every replica's epoch file: which epoch wrote which part of its log (RocketMQ 5's EpochFileCache).

``<store>/ha/epochs.json``: ``[[epoch, start offset], ...]``, epochs and offsets increasing. A leader
adds ``(its epoch, its max offset)`` when it takes a shard, before it writes anything; a follower takes
its leader's entries once its log is a prefix of the leader's. Comparing two replicas' entries finds
the last offset up to which their logs are the same (:func:`consistent_point`): a returning old
leader's records past it were never acknowledged, and it truncates them (``truncation.py``).
Written with the store's atomic write, keeping the previous version.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from services.store.store_root import read_with_backup, write_atomically

log = logging.getLogger(__name__)

EPOCH_FILE = Path("ha") / "epochs.json"


@dataclass(frozen=True, slots=True, order=True)
class EpochEntry:
    epoch: int
    start_offset: int


def _parse(data: bytes) -> list[EpochEntry]:
    entries = [EpochEntry(int(epoch), int(start)) for epoch, start in json.loads(data)]
    for before, after in zip(entries, entries[1:], strict=False):
        if after.epoch <= before.epoch or after.start_offset < before.start_offset:
            raise ValueError(f"epoch entries out of order: {before} then {after}")
    return entries


class EpochFile:
    """Thread-safe; every change is durable before the method returns."""

    def __init__(self, store_root: Path) -> None:
        self.path = store_root / EPOCH_FILE
        self._lock = threading.Lock()
        self._entries: list[EpochEntry] = read_with_backup(self.path, _parse) or []

    @property
    def entries(self) -> list[EpochEntry]:
        with self._lock:
            return list(self._entries)

    @property
    def last_epoch(self) -> int:
        with self._lock:
            return self._entries[-1].epoch if self._entries else 0

    def begin(self, epoch: int, start_offset: int) -> None:
        """A new epoch starts at ``start_offset`` (a leader's max offset when it took the shard)."""
        with self._lock:
            if self._entries and (epoch <= self._entries[-1].epoch or start_offset < self._entries[-1].start_offset):
                raise ValueError(f"epoch {epoch} at offset {start_offset} does not follow {self._entries[-1]}")
            self._save([*self._entries, EpochEntry(epoch, start_offset)])

    def replace(self, entries: list[EpochEntry]) -> None:
        """Take a leader's entries (this log is now a prefix of the leader's)."""
        with self._lock:
            self._save(list(entries))

    def truncate_from(self, offset: int) -> None:
        """Forget the epochs that start at or after ``offset`` (their records were cut)."""
        with self._lock:
            kept = [e for e in self._entries if e.start_offset < offset]
            if kept != self._entries:
                self._save(kept)

    def _save(self, entries: list[EpochEntry]) -> None:
        write_atomically(self.path, json.dumps([[e.epoch, e.start_offset] for e in entries]).encode(),
                         keep_backup=True)
        self._entries = entries


def consistent_point(mine: list[EpochEntry], my_end: int, leader: list[EpochEntry], leader_end: int) -> int:
    """The offset up to which this replica's log is the leader's: the end of the last epoch both
    started at the same offset, bounded by where each replica's part of that epoch ends. A replica
    with no entries (it never followed under epochs) shares nothing it can prove with a leader that
    has some (0: its whole log goes); with a leader that has none either, its log is kept as it is."""
    if not mine:
        return 0 if leader else my_end
    starts = {e.epoch: e.start_offset for e in leader}
    for i in range(len(mine) - 1, -1, -1):
        entry = mine[i]
        if starts.get(entry.epoch) != entry.start_offset:
            continue
        my_epoch_end = mine[i + 1].start_offset if i + 1 < len(mine) else my_end
        later = [e.start_offset for e in leader if e.epoch > entry.epoch]
        leader_epoch_end = min(later) if later else leader_end
        return min(my_epoch_end, leader_epoch_end)
    return 0


@dataclass(frozen=True, slots=True)
class LeaderEpoch:
    """A leader elected through etcd: its epoch (the handshake compares it), its epoch file (sent to each
    follower, which finds where its log stops being the leader's) and who hears each follower's report
    (the in-sync set's growth)."""

    epoch: int
    epochs: EpochFile
    on_report: Callable[[str, int], None]
