"""Quarantined commitlog ranges: damaged bytes that recovery stepped over instead of cutting the log.

A flipped byte inside one record used to cost every record after it: recovery cut the log at the
first bad record, as RocketMQ does. Under ``recoverCorruptionMode: quarantine`` recovery tells a torn
tail (nothing valid after it: cut, as before) from a damaged record with intact records after it:
the range [bad record, next valid record) is quarantined and the walk goes on. A quarantined range
is never read as records (a Read answers DATA_LOSS), never indexed (the Tail skips it with a chunk
the indexer checks against GetStoreInfo's list) and never written over (it lies below the end of
the log).

The ranges are kept in ``config/quarantine.json`` of the store root, so that a later start whose
walk does not cover them (a clean start walks only the last three files) still knows them.

On a replicated shard a range is quarantined on every replica: the leader's HA handshake carries its
ranges, and a follower adopts them before it takes the leader's bytes, so that it copies the damaged
bytes as they are (its log stays byte-identical) without reading them as records, and a follower
promoted later answers DATA_LOSS for the same offsets the old leader did.
"""

from __future__ import annotations

import bisect
import json
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from services.store.store_root import write_atomically

log = logging.getLogger(__name__)

QUARANTINE_FILE = Path("config") / "quarantine.json"
QUARANTINE = "quarantine"
CUT = "cut"
RECOVER_CORRUPTION_MODES = (QUARANTINE, CUT)


@dataclass(frozen=True, slots=True, order=True)
class QuarantinedRange:
    """Commitlog bytes [start, end) that hold no readable record; ``reason`` says what was wrong."""

    start: int
    end: int
    reason: str = ""

    @property
    def size(self) -> int:
        return self.end - self.start

    def describe(self) -> str:
        return f"[{self.start}, {self.end}) ({self.size} bytes: {self.reason})"


class QuarantineTable:
    """The quarantined ranges of one store, sorted and disjoint; persisted atomically on change."""

    def __init__(self, root: Path) -> None:
        self.path = root / QUARANTINE_FILE
        # the sorted ranges and their starts, replaced as one value: readers (reads, Tails) run on
        # other threads than a follower's replication, which adopts its leader's ranges
        self._table: tuple[tuple[QuarantinedRange, ...], list[int]] = ((), [])

    @property
    def ranges(self) -> tuple[QuarantinedRange, ...]:
        return self._table[0]

    @property
    def total_bytes(self) -> int:
        return sum(r.size for r in self.ranges)

    def load(self) -> None:
        """Read the file; a missing one means no quarantine. An unreadable one is an error: silently
        forgetting a range would let reads return damaged bytes as records."""
        if not self.path.exists():
            self._set([])
            return
        try:
            body = json.loads(self.path.read_bytes())
            ranges = [QuarantinedRange(int(r["start"]), int(r["end"]), str(r.get("reason", "")))
                      for r in body["ranges"]]
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"quarantine file {self.path} is unreadable ({exc}): fix or remove it "
                             "(removing it makes the damaged ranges readable as garbage)") from None
        self._set(ranges)

    def reconcile(self, found: Iterable[QuarantinedRange], min_offset: int, end: int) -> None:
        """After a recovery: keep the known ranges still inside the log [min_offset, end), add those
        the walk ``found``, merge overlaps, and save when anything changed."""
        known = self.ranges
        kept = [r for r in known if r.end > min_offset and r.start < end]
        merged = _merge([*kept, *found])
        if tuple(merged) != known:
            for dropped in set(known) - set(merged):
                if dropped.end <= min_offset or dropped.start >= end:
                    log.info("quarantined range %s is no longer in the log [%d, %d): forgotten",
                             dropped.describe(), min_offset, end)
            self._set(merged)
            self.save()

    def adopt(self, leader_ranges: Iterable[QuarantinedRange]) -> list[QuarantinedRange]:
        """A follower takes its leader's ranges (merged with its own), saved before it copies any byte
        of them; returns the ranges it did not know."""
        known = self.ranges
        new = [r for r in leader_ranges if r not in known]
        merged = _merge([*known, *new])
        if tuple(merged) != known:
            self._set(merged)
            self.save()
        return new

    def forget_from(self, cut: int) -> None:
        """The log was cut at ``cut``: a range at or past it is gone with its bytes (the offsets are
        written again with new records), one across it ends there."""
        known = self.ranges
        kept = [r if r.end <= cut else QuarantinedRange(r.start, cut, r.reason) for r in known if r.start < cut]
        if tuple(kept) != known:
            for dropped in set(known) - set(kept):
                log.info("quarantined range %s is past the cut at %d: forgotten", dropped.describe(), cut)
            self._set(kept)
            self.save()

    def save(self) -> None:
        body = {"ranges": [{"start": r.start, "end": r.end, "reason": r.reason} for r in self.ranges]}
        write_atomically(self.path, json.dumps(body, indent=1).encode())

    def overlapping(self, start: int, end: int) -> QuarantinedRange | None:
        """The first quarantined range that shares a byte with [start, end), if any."""
        ranges, starts = self._table
        index = bisect.bisect_right(starts, start) - 1
        for candidate in ranges[max(index, 0):]:
            if candidate.start >= end:
                return None
            if candidate.end > start:
                return candidate
        return None

    def next_start(self, offset: int) -> int | None:
        """Start of the first quarantined range at or after ``offset``."""
        starts = self._table[1]
        index = bisect.bisect_left(starts, offset)
        return starts[index] if index < len(starts) else None

    def _set(self, ranges: Sequence[QuarantinedRange]) -> None:
        ordered = tuple(sorted(ranges))
        self._table = (ordered, [r.start for r in ordered])


def _merge(ranges: Iterable[QuarantinedRange]) -> list[QuarantinedRange]:
    merged: list[QuarantinedRange] = []
    for current in sorted(ranges):
        if merged and current.start <= merged[-1].end:
            last = merged[-1]
            if current.end > last.end:
                merged[-1] = QuarantinedRange(last.start, current.end, last.reason)
        else:
            merged.append(current)
    return merged
