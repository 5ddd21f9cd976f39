"""Which consumer groups have not consumed a commitlog range yet, from the files other services keep.

The commitlog service deletes its oldest files early when the disk fills up (``clean_commitlog.py``);
before it does, it asks here whose unconsumed messages a file holds, to name them in its warning or,
with ``protectUnconsumedData``, to keep the file. Two sources, both read-only and both owned by other
processes:

* the query service's committed offsets (``consumer_offsets_file.py``): per group, topic and queue,
  the next queue offset the group will consume;
* the indexer's ConsumeQueue (``consume_queue.py``'s format): which queue offsets point into the
  range. Units are ordered by commitlog offset within a queue, so two binary searches (a few
  ``pread``s of 20 bytes) find the queue offsets [first, end) of a queue that lie in the range, and a
  group with committed offset ``c`` has ``end - max(c, first)`` unconsumed messages there.

Messages the indexer has not dispatched yet are in no ConsumeQueue and are not counted. A group that
never committed an offset is not in the table and cannot be named. When a source cannot be read the
answer says "unknown" and why, never "none".
"""

from __future__ import annotations

import errno
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from services.store.errors import InvalidArgumentError
from services.store.formats.consume_queue import CQ_STORE_UNIT_SIZE, JAVA_INT_MAX
from services.store.formats.consumer_offsets_file import (
    OffsetTable,
    offsets_file_candidates,
    read_offset_table,
    split_key,
)
from services.store.formats.store_layout import StoreLayoutError, resolve_store
from services.store.formats.table_journal import journal_path
from services.store.rules.names import check_topic_name

_OFFSET_AND_SIZE = struct.Struct(">qi")
_STORE_FILE_NAME_DIGITS = 20
#: How many (group, topic, queue) holdings a description names before "and N more".
DESCRIBED_HOLDINGS = 8


@dataclass(frozen=True, slots=True)
class Holding:
    """A group's unconsumed messages of one queue within a commitlog range: queue offsets
    [max(committed, first), end)."""

    group: str
    topic: str
    queue_id: int
    committed: int
    first: int
    end: int

    @property
    def unconsumed(self) -> int:
        return max(0, self.end - max(self.committed, self.first))

    def describe(self) -> str:
        return (f"{self.group} (topic {self.topic} queue {self.queue_id}: committed offset {self.committed}, "
                f"{self.unconsumed} unconsumed messages at queue offsets [{max(self.committed, self.first)}, "
                f"{self.end}))")


@dataclass(frozen=True, slots=True)
class Holders:
    """Who has not consumed commitlog offsets [start, end). ``unknown`` (non-empty) says why that
    cannot be told; ``offsets_file`` is the consumer offsets file read (None: there is none)."""

    start: int
    end: int
    holdings: tuple[Holding, ...] = ()
    unknown: str = ""
    offsets_file: Path | None = None
    looked_at: tuple[Path, ...] = field(default=())

    @property
    def groups(self) -> list[str]:
        return sorted({h.group for h in self.holdings})

    @property
    def holds(self) -> bool:
        """Some group has not consumed the range, or it cannot be told."""
        return bool(self.holdings or self.unknown)

    def describe(self) -> str:
        if self.unknown:
            return f"unknown ({self.unknown})"
        if not self.holdings:
            if self.offsets_file is None:
                return f"none known (no consumer offsets file at {' or '.join(map(str, self.looked_at))})"
            return "none"
        named = "; ".join(h.describe() for h in self.holdings[:DESCRIBED_HOLDINGS])
        more = len(self.holdings) - DESCRIBED_HOLDINGS
        return named + (f"; and {more} more" if more > 0 else "")


class QueueUnits:
    """One queue's ConsumeQueue files (``<consumequeue>/<topic>/<queue id>/``), read with ``pread``:
    the indexer writes them meanwhile, and a read never changes them. Opened per question."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._fds: dict[int, int] = {}  # file start (byte offset of its first unit) -> fd
        self._file_size = 0
        self._first_unit = self._end_unit = 0

    def __enter__(self) -> QueueUnits:
        try:
            names = sorted(p.name for p in self.directory.iterdir()
                           if len(p.name) == _STORE_FILE_NAME_DIGITS and p.name.isdigit())
        except FileNotFoundError:
            return self  # no ConsumeQueue for this queue: no units
        try:
            for name in names:
                path = self.directory / name
                fd = os.open(path, os.O_RDONLY)
                self._fds[int(name)] = fd
                size = os.fstat(fd).st_size
                if self._file_size and size != self._file_size or size <= 0 or size % CQ_STORE_UNIT_SIZE:
                    raise ValueError(f"{path} is {size} bytes, unlike the queue's other files")
                self._file_size = size
        except BaseException:
            self.__exit__()
            raise
        starts = sorted(self._fds)
        if not starts:
            return self
        for before, after in zip(starts, starts[1:], strict=False):
            if after != before + self._file_size:
                raise ValueError(f"{self.directory}: a ConsumeQueue file is missing after {before:020d}")
        self._first_unit = starts[0] // CQ_STORE_UNIT_SIZE
        self._end_unit = self._first_valid_end(self._first_unit, (starts[-1] + self._file_size) // CQ_STORE_UNIT_SIZE)
        return self

    def __exit__(self, *_: object) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def _unit(self, queue_offset: int) -> tuple[int, int]:
        """(commitlog offset, size) of the unit of ``queue_offset``."""
        position = queue_offset * CQ_STORE_UNIT_SIZE
        start = position - position % self._file_size
        data = os.pread(self._fds[start], _OFFSET_AND_SIZE.size, position - start)
        if len(data) < _OFFSET_AND_SIZE.size:
            return -1, 0
        offset, size = _OFFSET_AND_SIZE.unpack(data)
        return offset, size

    def _first_valid_end(self, low: int, high: int) -> int:
        """The first unit in [low, high) that is not valid (RocketMQ's rule: commitlog offset >= 0 and
        size > 0), ``high`` when all are: the data is a prefix, zeros follow it."""
        while low < high:
            middle = (low + high) // 2
            offset, size = self._unit(middle)
            if offset >= 0 and size > 0:
                low = middle + 1
            else:
                high = middle
        return low

    def first_at_or_after(self, commitlog_offset: int) -> int:
        """The first queue offset whose message lies at or past ``commitlog_offset`` (the queue's end
        when none does). Filler units (before a queue's first message) count as below everything."""
        low, high = self._first_unit, self._end_unit
        while low < high:
            middle = (low + high) // 2
            offset, size = self._unit(middle)
            if size == JAVA_INT_MAX and offset == 0:
                offset = -1
            if offset < commitlog_offset:
                low = middle + 1
            else:
                high = middle
        return low

    @property
    def empty(self) -> bool:
        return self._first_unit == self._end_unit

    def span(self, start: int, end: int) -> tuple[int, int]:
        """Queue offsets [first, end) of the queue's messages in commitlog offsets [start, end)."""
        if self.empty:
            return 0, 0
        return self.first_at_or_after(start), self.first_at_or_after(end)


class UnconsumedReader:
    """Answers :meth:`holders` for the store at ``store_root`` (the commitlog service's root). The
    offsets file is parsed again only when it changed."""

    def __init__(self, store_root: Path) -> None:
        self.store_root = store_root
        self.looked_at = offsets_file_candidates(store_root)
        self._cached: tuple[tuple[_Signature | None, _Signature | None], OffsetTable] | None = None

    def holders(self, start: int, end: int) -> Holders:
        """Who has not consumed commitlog offsets [start, end)."""
        return self.holders_of([(start, end)])[0]

    def holders_of(self, ranges: Sequence[tuple[int, int]]) -> list[Holders]:
        """:meth:`holders` of each commitlog range, every queue's ConsumeQueue opened once for all of
        them (a cleaning round asks about up to 10 files)."""
        try:
            found = self._offsets()
        except (OSError, ValueError) as exc:
            return self._unknown(ranges, f"the consumer offsets cannot be read: {exc}", None)
        if found is None:
            return [Holders(start, end, looked_at=self.looked_at) for start, end in ranges]
        path, table = found
        try:
            consumequeue = resolve_store(self.store_root).consumequeue
        except StoreLayoutError as exc:
            return self._unknown(ranges, f"no ConsumeQueue to read: {exc}", path)
        if table and not consumequeue.is_dir():
            return self._unknown(ranges, f"no ConsumeQueue at {consumequeue}", path)
        try:
            holdings = _holdings(consumequeue, table, ranges)
        except (OSError, ValueError) as exc:
            return self._unknown(ranges, f"the ConsumeQueue cannot be read: {exc}", path)
        return [Holders(start, end, tuple(found_in), offsets_file=path, looked_at=self.looked_at)
                for (start, end), found_in in zip(ranges, holdings, strict=True)]

    def _unknown(self, ranges: Sequence[tuple[int, int]], why: str, path: Path | None) -> list[Holders]:
        return [Holders(start, end, unknown=why, offsets_file=path, looked_at=self.looked_at) for start, end in ranges]

    def _offsets(self) -> tuple[Path, OffsetTable] | None:
        """The first consumer offsets file that exists (or whose .bak does), parsed; None if none does."""
        for path in self.looked_at:
            signature = (_signature(path) or _signature(path.with_name(path.name + ".bak")),
                         _signature(journal_path(path)))  # the commits appended since the file was written
            if signature == (None, None):
                continue
            if self._cached is not None and self._cached[0] == signature:
                return path, self._cached[1]
            table = read_offset_table(path)
            self._cached = signature, table
            return path, table
        return None


_Signature = tuple[Path, int, int, int]


def _signature(path: Path) -> _Signature | None:
    """What changes when the writer replaces the file (it renames a new one over it)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ENOTDIR:
            return None
        raise
    return path, st.st_ino, st.st_mtime_ns, st.st_size


def _holdings(consumequeue: Path, table: OffsetTable, ranges: Sequence[tuple[int, int]]) -> list[list[Holding]]:
    """For each range, every (group, queue) of ``table`` with unconsumed messages in it. Each queue's
    ConsumeQueue is opened once and searched once per distinct range bound (adjacent files share
    one), whatever the number of groups committed on it."""
    by_queue: dict[tuple[str, int], list[tuple[str, int]]] = {}
    for key, queues in table.items():
        topic, group = split_key(key)
        try:
            check_topic_name(topic)  # it names a directory: an edited file must not lead elsewhere
        except InvalidArgumentError:
            continue
        for queue_id, committed in queues.items():
            by_queue.setdefault((topic, queue_id), []).append((group, committed))
    found: list[list[Holding]] = [[] for _ in ranges]
    bounds = sorted({bound for pair in ranges for bound in pair})
    for (topic, queue_id), groups in sorted(by_queue.items()):
        with QueueUnits(consumequeue / topic / str(queue_id)) as units:
            if units.empty:
                continue
            at = {bound: units.first_at_or_after(bound) for bound in bounds}
        for index, (start, end) in enumerate(ranges):
            first, past = at[start], at[end]
            if first == past:
                continue
            for group, committed in sorted(groups):
                holding = Holding(group, topic, queue_id, committed, first, past)
                if holding.unconsumed:
                    found[index].append(holding)
    return found
