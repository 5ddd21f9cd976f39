"""The query service's data reads straight from the store files (``--read-from files``).

A shard is one pod whose containers (commitlog, indexer, query) share the store volume, as a RocketMQ
broker shares its files between CommitLog, ReputMessageService and PullMessageProcessor. The query
service maps the files read-only and serves pulls, gets by id, key queries and offsets by time from
them; gRPC stays for control: arrivals (with the dispatch bound), queue offsets, store info, topics.

:class:`LocalIndexer` and :class:`LocalCommitLog` are the gRPC clients with the data calls replaced, so
pull.py, lookup.py and queue_offsets.py do not know where the bytes come from.

What a reader may read (docs/architecture.md, "Reads from the files"):

- ConsumeQueue units only below the queue's max offset *the indexer published* (the WatchArrivals
  stream's max offsets, or GetQueueOffsets for a queue not seen yet or a pull at or past the known
  max), never up to what happens to be in the file: the unit being written may be half there. A
  unit that is not valid below that bound (a truncation lowered the queue meanwhile) ends the read,
  and the queue's bound is asked for again.
- Commitlog bytes below the higher of the commitlog's max offset (GetStoreInfo: with the transient
  store pool it is the *committed* offset, so the bytes are in the file, not only in the pool's
  buffer) and the indexer's reput offset (carried on every arrival: dispatched records were read
  back from the commitlog, so they are committed too), at or above its min offset; a quarantined
  range answers DATA_LOSS as the commitlog's Read does (GetStoreInfo lists the ranges).
- The queue's min offset comes from GetQueueOffsets and is asked again after MIN_OFFSET_TTL_S, so
  files deleted by expiry are noticed as the gRPC path notices them; a file that vanished is data
  that is gone (fewer units: OFFSET_FOUND_NULL, OFFSET_TOO_SMALL, MESSAGE_WAS_REMOVING as before).
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import struct
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from services.query.backends import (
    CommitLogClient,
    IndexerClient,
    KeyHits,
    QueueArrival,
    QueueEntries,
    QueueUnit,
    StoreInfo,
)
from services.store.config import MessageStoreConfig
from services.store.errors import DataLossError, InvalidArgumentError, OutOfRangeError, StoreError
from services.store.formats.consume_queue import CQ_STORE_UNIT_SIZE, UNIT, last_modified_ms, offset_in_file_by_time
from services.store.formats.index_reader import IndexReader
from services.store.formats.readonly_files import ReadOnlyFiles
from services.store.formats.record import IPV6_HOST_LENGTH, PHYSICAL_OFFSET_POS, SYSFLAG_POS, store_timestamp_pos
from services.store.formats.store_layout import COMMITLOG_DIR, CONSUMEQUEUE_DIR, INDEX_DIR

log = logging.getLogger(__name__)

QueueKey = tuple[str, int]
#: How long a queue's min offset (from GetQueueOffsets) is trusted before a read asks again.
MIN_OFFSET_TTL_S = 1.0
INT64_MAX = 2**63 - 1
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
# Enough of a record to reach STORETIMESTAMP even behind an IPv6 born host.
_STORE_TIME_PREFIX = SYSFLAG_POS + 4 + 8 + IPV6_HOST_LENGTH + 8


class LocalCommitLog(CommitLogClient):
    """Read/ReadBatch from the commitlog files; GetStoreInfo over gRPC (its answer sets the bounds)."""

    def __init__(self, address: str, store_root: Path, file_size: int) -> None:
        super().__init__(address)
        self.file_size = file_size
        self._files = ReadOnlyFiles(store_root / COMMITLOG_DIR, file_size)
        self._info: StoreInfo | None = None
        self._dispatched = 0

    async def close(self) -> None:
        self._files.close()
        await super().close()

    async def store_info(self) -> StoreInfo:
        info = await super().store_info()
        if info.mapped_file_size != self.file_size:
            raise StoreError(f"the commitlog service at {self.address} has {info.mapped_file_size}-byte files, "
                             f"this query service was configured with {self.file_size} (mappedFileSizeCommitLog): "
                             "give both the same settings")
        self._info = info
        self._files.forget_below(info.min_offset)
        return info

    def note_dispatched(self, reput_offset: int, reset: bool = False) -> None:
        """The indexer dispatched everything below ``reput_offset`` (``reset``: it went back, a truncation)."""
        self._dispatched = reput_offset if reset else max(self._dispatched, reput_offset)

    @property
    def readable_end(self) -> int:
        info = self._info
        return max(info.max_offset if info is not None else 0, self._dispatched)

    async def read(self, offset: int, size: int) -> bytes:
        await self.cover(offset + size)
        return self._read(offset, size)

    async def read_batch(self, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        if not ranges:
            return []
        end = max(offset + size for offset, size in ranges)
        await self.cover(end)
        info = self._info
        assert info is not None
        if info.quarantined or end > self.readable_end or \
                any(offset < info.min_offset or size <= 0 for offset, size in ranges):
            read = self._read
            return [read(offset, size) for offset, size in ranges]
        # The common case, checked once for the batch above: slices of the mapped files.
        data: list[bytes] = []
        file_size, files = self.file_size, self._files
        current_start: int = -1
        current: bytes | mmap.mmap = b""
        for offset, size in ranges:
            position = offset % file_size
            if offset - position != current_start:
                found = files.find(offset)
                if found is None:
                    raise OutOfRangeError(f"offset {offset} is not in the log (its file is gone)")
                current_start, current = found
            if position + size > file_size:
                raise InvalidArgumentError(f"[{offset}, {offset + size}) crosses the end of a commitlog file: a "
                                           "record never does")
            data.append(current[position:position + size])
        return data

    async def cover(self, end: int) -> None:
        """Make the bounds reach ``end`` if the commitlog has it (one GetStoreInfo when they do not yet)."""
        if self._info is None or end > self.readable_end:
            await self.store_info()

    def _read(self, offset: int, size: int) -> bytes:
        info = self._info
        assert info is not None
        if offset < 0 or size <= 0:
            raise InvalidArgumentError(f"offset {offset} and size {size}: the offset must not be negative and the "
                                       "size positive")
        if offset < info.min_offset:
            raise OutOfRangeError(f"offset {offset} is below the min offset {info.min_offset} (older files were "
                                  "deleted)")
        end = offset + size
        if end > self.readable_end:
            raise OutOfRangeError(f"[{offset}, {end}) goes past the max offset {self.readable_end}")
        for start, stop in info.quarantined:
            if start < end and offset < stop:
                raise DataLossError(f"[{offset}, {end}) reaches into the QUARANTINED commitlog range [{start}, "
                                    f"{stop}): recovery found those bytes damaged, no record there can be read")
        found = self._files.find(offset)
        if found is None:
            raise OutOfRangeError(f"offset {offset} is not in the log (its file is gone)")
        file_start, mapped = found
        position = offset - file_start
        if position + size > self.file_size:
            raise InvalidArgumentError(f"[{offset}, {end}) crosses the end of a commitlog file: a record never does")
        return mapped[position:position + size]

    def store_time_of(self, offset: int, size: int) -> int:
        """RocketMQ's pickupStoreTimestamp for a unit below a published bound (so its record was
        dispatched, hence committed): -1 when the record is deleted, quarantined or not there."""
        try:
            head = self._read(offset, min(size, _STORE_TIME_PREFIX))
            if _I64.unpack_from(head, PHYSICAL_OFFSET_POS)[0] != offset:
                return -1
            sys_flag = _I32.unpack_from(head, SYSFLAG_POS)[0]
            return int(_I64.unpack_from(head, store_timestamp_pos(sys_flag))[0])
        except (StoreError, struct.error, AssertionError):
            return -1

    @property
    def min_offset(self) -> int:
        return self._info.min_offset if self._info is not None else 0


@dataclass(slots=True)
class _Bound:
    """What the indexer published of one queue: units in [min_offset, max_offset) are complete."""

    min_offset: int
    max_offset: int
    fetched_s: float


class LocalIndexer(IndexerClient):
    """GetQueueEntries, GetOffsetByTime and QueryByKey from the indexer's files; the rest over gRPC."""

    def __init__(self, address: str, indexer_root: Path, config: MessageStoreConfig, commitlog: LocalCommitLog) -> None:
        super().__init__(address)
        self._cq_root = indexer_root / CONSUMEQUEUE_DIR
        self._cq_file_size = config.mapped_file_size_consume_queue
        self._commitlog = commitlog
        self._index = IndexReader(indexer_root / INDEX_DIR, config.max_hash_slot_num, config.max_index_num,
                                  config.max_msgs_num_batch)
        self._queues: dict[QueueKey, ReadOnlyFiles] = {}
        self._bounds: dict[QueueKey, _Bound] = {}
        #: bumped when every bound is forgotten, so a GetQueueOffsets answer from before is not kept
        self._generation = 0

    async def close(self) -> None:
        for files in self._queues.values():
            files.close()
        self._index.close()
        await super().close()

    # -- bounds ------------------------------------------------------------------------------------
    def forget_bounds(self) -> None:
        self._bounds.clear()
        self._generation += 1

    def forget_files(self, topic: str | None = None) -> None:
        """Unmap the ConsumeQueue files of ``topic`` (None: of every queue): the indexer deleted them,
        and a file of the same name made later is another file (a topic deleted and created again)."""
        for key in [k for k in self._queues if topic is None or k[0] == topic]:
            files = self._queues.pop(key)
            with contextlib.suppress(BufferError):  # a read holds a view of it: the mapping goes with the view
                files.close()
            self._bounds.pop(key, None)

    async def arrivals(self) -> AsyncIterator[QueueArrival]:
        """The arrival stream, also taken as the dispatch bound: max offsets only grow, the reput offset
        too, until a truncation notice. A new stream (an indexer restart) starts from no bounds."""
        self.forget_bounds()
        self.forget_files()  # a topic may have been deleted while no stream said so
        self._commitlog.note_dispatched(0, reset=True)  # the indexer may have rewound: GetStoreInfo bounds reads
        try:
            async for arrival in super().arrivals():
                if arrival.deleted:
                    self.forget_files(arrival.topic)
                elif arrival.truncated:
                    self.forget_bounds()
                    self._commitlog.note_dispatched(arrival.reput_offset, reset=True)
                else:
                    bound = self._bounds.get((arrival.topic, arrival.queue_id))
                    if bound is not None and arrival.max_offset > bound.max_offset:
                        bound.max_offset = arrival.max_offset
                    self._commitlog.note_dispatched(arrival.reput_offset)
                yield arrival
        finally:
            self.forget_bounds()  # while the stream is down nothing says a truncation did not happen

    async def _bound(self, key: QueueKey, reading_from: int | None = None) -> _Bound | None:
        """The queue's published bounds; asked of the indexer when unknown, older than the min offset's
        TTL, or when ``reading_from`` is at or past the known max (it may have grown since). None for a
        queue the indexer has never seen."""
        bound = self._bounds.get(key)
        if bound is not None and time.monotonic() - bound.fetched_s < MIN_OFFSET_TTL_S and \
                (reading_from is None or reading_from < bound.max_offset):
            return bound
        generation = self._generation
        found = await super().queue_offsets(*key)
        if found is None:
            self._bounds.pop(key, None)
            return None
        fresh = _Bound(found[0], found[1], time.monotonic())
        if generation == self._generation:
            current = self._bounds.get(key)
            if current is not None and current.max_offset > fresh.max_offset:
                fresh.max_offset = current.max_offset  # an arrival published more meanwhile
            self._bounds[key] = fresh
        return fresh

    def _files_of(self, key: QueueKey) -> ReadOnlyFiles:
        files = self._queues.get(key)
        if files is None:
            files = ReadOnlyFiles(self._cq_root / key[0] / str(key[1]), self._cq_file_size)
            self._queues[key] = files
        return files

    # -- data reads ----------------------------------------------------------------------------------
    async def queue_entries(self, topic: str, queue_id: int, from_offset: int, max_count: int) -> QueueEntries:
        key = (topic, queue_id)
        bound = await self._bound(key, from_offset)
        if bound is None:
            return QueueEntries([], 0, 0, known=False)
        if not bound.min_offset <= from_offset < bound.max_offset:
            return QueueEntries([], bound.min_offset, bound.max_offset)
        units, gone = self._units(key, from_offset, min(max_count, bound.max_offset - from_offset))
        if gone and not units:
            # The file is not there: deleted by expiry (the min offset moved) or not yet seen. Ask again.
            self._bounds.pop(key, None)
            bound = await self._bound(key, from_offset)
            if bound is None:
                return QueueEntries([], 0, 0, known=False)
            if bound.min_offset <= from_offset < bound.max_offset:
                units, _ = self._units(key, from_offset, min(max_count, bound.max_offset - from_offset))
        return QueueEntries(units, bound.min_offset, bound.max_offset)

    def _units(self, key: QueueKey, start: int, count: int) -> tuple[list[QueueUnit], bool]:
        """Up to ``count`` units from queue offset ``start`` (all below the published max), and whether
        a file was missing."""
        files = self._files_of(key)
        units: list[QueueUnit] = []
        queue_offset = start
        unit_size, file_size = CQ_STORE_UNIT_SIZE, self._cq_file_size
        while len(units) < count:
            position = queue_offset * unit_size
            found = files.find(position)
            if found is None:
                return units, True
            file_start, mapped = found
            here = min(count - len(units), (file_start + file_size - position) // unit_size)
            relative = position - file_start
            for index, (offset, size, tags_code) in enumerate(
                    UNIT.iter_unpack(mapped[relative:relative + here * unit_size])):
                if offset < 0 or size <= 0:
                    # Not a unit (RocketMQ's validity rule) below the published bound: the queue was cut
                    # (a truncation) since; the bound is asked for again on the next read.
                    log.info("%s/%d: no unit at queue offset %d below the published max: the queue was cut; "
                             "asking the indexer again", key[0], key[1], queue_offset + index)
                    self._bounds.pop(key, None)
                    return units, False
                units.append(QueueUnit(queue_offset + index, offset, size, tags_code))
            queue_offset += here
        return units, False

    async def offset_by_time(self, topic: str, queue_id: int, timestamp: int) -> int | None:
        """getOffsetInQueueByTime over the files: the file by mtime, then the binary search by store time
        (ConsumeQueue.get_offset_in_queue_by_time), within the published units."""
        if timestamp < 0:
            raise InvalidArgumentError(f"timestamp {timestamp} is negative")
        key = (topic, queue_id)
        bound = await self._bound(key)
        if bound is None:
            return None
        files = self._files_of(key)
        end_byte = bound.max_offset * CQ_STORE_UNIT_SIZE
        starts = [s for s in files.starts(end_byte) if s < end_byte]
        if not starts:
            return 0
        chosen = starts[-1]
        for start in starts:
            if last_modified_ms(files.path_of(start)) >= timestamp:
                chosen = start
                break
        found = files.find(chosen)
        if found is None:
            return 0
        read_position = min(self._cq_file_size, end_byte - chosen)
        # The records of the published units are committed: make the commitlog bound reach the last one
        # (its arrival, with the reput offset, may still be on its way).
        last_offset, last_size, _ = UNIT.unpack_from(found[1], read_position - CQ_STORE_UNIT_SIZE)
        await self._commitlog.cover(last_offset + last_size)
        return offset_in_file_by_time(found[1], chosen, read_position, bound.min_offset * CQ_STORE_UNIT_SIZE,
                                      timestamp, self._commitlog.store_time_of, self._commitlog.min_offset)

    async def query_by_key(self, topic: str, key: str, max_num: int, begin: int, end: int,
                           skip: int = 0) -> KeyHits:
        result = self._index.query_offset(topic, key, max_num, begin, end or INT64_MAX, skip)
        return KeyHits(result.phy_offsets, result.index_last_update_timestamp, result.index_last_update_phy_offset)
