"""IndexFile: RocketMQ's on-disk hash index from ``topic#key`` to commitlog offsets.

Layout (all big-endian), byte-compatible with RocketMQ 4.9.8 (see docs/formats.md, "IndexFile")::

    header   40 B   beginTimestamp 8, endTimestamp 8, beginPhyOffset 8, endPhyOffset 8,
                    hashSlotCount 4, indexCount 4
    slots    4 B x hashSlotNum     newest entry number whose key hash % hashSlotNum is this slot
    entries 20 B x indexNum        keyHash 4, phyOffset 8, timeDiff 4 (s), prevIndex 4

Entry 0 is never used: indexCount starts at 1, so a full file holds indexNum - 1 entries. Each slot
heads a chain through prevIndex, newest first. Only key hashes are stored: callers check the real key
against the message. The file is sparse, so a 420 MB index file costs disk only as it fills.

Entries are appended in commitlog order, so the entries of the records from some commitlog offset on
are a suffix of the file: :meth:`IndexFile.rewind` removes such a suffix and leaves the bytes a file
built without it would have (RocketMQ has no such operation; mqstore's indexer recovers with it).
"""

from __future__ import annotations

import mmap
import os
import struct
import sys
import time
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import NamedTuple

import numpy as np

from services.store.formats.java_hash import index_key_hash_fast
from services.store.store_root import created_durably, remove_durably

INDEX_HEADER_SIZE = 40
HASH_SLOT_SIZE = 4
INDEX_ENTRY_SIZE = 20
INVALID_INDEX = 0
DEFAULT_HASH_SLOT_NUM = 5_000_000
DEFAULT_INDEX_NUM = 20_000_000
INT_MAX = 0x7FFF_FFFF
NAME_FORMAT_LENGTH = 17  # yyyyMMddHHmmssSSS

_HEADER = struct.Struct(">qqqqii")
_ENTRY = struct.Struct(">iqii")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_ENTRY_DTYPE = np.dtype([("key_hash", ">i4"), ("phy_offset", ">i8"), ("time_diff", ">i4"), ("prev_index", ">i4")])
#: Entries zeroed per step when a rewind clears what follows the kept ones.
_ZERO_CHUNK_ENTRIES = 4096

#: (keyHash, commitlog offset, store timestamp): one key of one message, ready to put.
IndexItem = tuple[int, int, int]


class IndexColumns(NamedTuple):
    """Index items as columns (int64 arrays of equal length): what :meth:`IndexFile.put_columns` takes."""

    key_hash: np.ndarray
    phy_offset: np.ndarray
    store_timestamp: np.ndarray

    @classmethod
    def of(cls, items: Sequence[IndexItem]) -> IndexColumns:
        if not items:
            return cls.empty()
        array_ = np.array(items, dtype=np.int64).reshape(-1, 3)
        return cls(array_[:, 0].copy(), array_[:, 1].copy(), array_[:, 2].copy())

    @classmethod
    def empty(cls) -> IndexColumns:
        return cls(np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.int64))

    @property
    def size(self) -> int:
        return len(self.key_hash)

    def tuples(self, start: int, end: int) -> list[IndexItem]:
        return list(zip(self.key_hash[start:end].tolist(), self.phy_offset[start:end].tolist(),
                        self.store_timestamp[start:end].tolist(), strict=True))


class IndexFileError(Exception):
    """An index file that cannot be opened as configured; the message says why."""


def index_file_size(hash_slot_num: int, index_num: int) -> int:
    return INDEX_HEADER_SIZE + hash_slot_num * HASH_SLOT_SIZE + index_num * INDEX_ENTRY_SIZE


def index_file_name(epoch_ms: int) -> str:
    """RocketMQ's UtilAll.timeMillisToHumanString: local time, ``yyyyMMddHHmmssSSS``."""
    return time.strftime("%Y%m%d%H%M%S", time.localtime(epoch_ms // 1000)) + f"{epoch_ms % 1000:03d}"


def next_index_file_name(name: str) -> str:
    """The name one millisecond after ``name``, by calendar arithmetic (no time zone involved)."""
    when = datetime.strptime(name, "%Y%m%d%H%M%S%f") + timedelta(milliseconds=1)
    return when.strftime("%Y%m%d%H%M%S") + f"{when.microsecond // 1000:03d}"


def is_index_file_name(name: str) -> bool:
    return len(name) == NAME_FORMAT_LENGTH and name.isdigit()


@dataclass(frozen=True, slots=True)
class IndexHeader:
    """The 40-byte header as stored (``index_count`` raw: 0 in a file never written)."""

    begin_timestamp: int
    end_timestamp: int
    begin_phy_offset: int
    end_phy_offset: int
    hash_slot_count: int
    index_count: int

    @classmethod
    def read(cls, buf: bytes | mmap.mmap) -> IndexHeader:
        return cls(*_HEADER.unpack_from(buf, 0))


class RewindResult(NamedTuple):
    """What :meth:`IndexFile.rewind` did. ``removed`` counts trusted entries (below the trusted
    header's indexCount) that pointed at or past the cut; ``repaired_slots`` counts slots whose chain
    ran through entries that were not readable (lost pages) and were recomputed from the kept ones."""

    removed: int
    repaired_slots: int
    changed: bool


@dataclass(frozen=True, slots=True)
class IndexEntry:
    number: int
    key_hash: int
    phy_offset: int
    time_diff: int
    prev_index: int


class IndexFile:
    """One index file, mapped. Not thread-safe: IndexService serialises writers and readers."""

    def __init__(self, path: Path, hash_slot_num: int = DEFAULT_HASH_SLOT_NUM,
                 index_num: int = DEFAULT_INDEX_NUM, *, create: bool = False,
                 prev_end_phy_offset: int = 0, prev_end_timestamp: int = 0, read_only: bool = False) -> None:
        """Open ``path``, or with ``create`` make it (sparse, all zero). A new file starts from the end
        of the previous one (RocketMQ's constructor): its header begin/end fields take the previous
        file's endPhyOffset and endTimestamp, so the first entry's timeDiff counts from there."""
        if hash_slot_num <= 0 or index_num <= 1:
            raise IndexFileError(f"bad index geometry: hashSlotNum {hash_slot_num}, indexNum {index_num}")
        self.path = path
        self.hash_slot_num = hash_slot_num
        self.index_num = index_num
        self.file_size = index_file_size(hash_slot_num, index_num)
        self._entries_pos = INDEX_HEADER_SIZE + hash_slot_num * HASH_SLOT_SIZE
        self._mm = self._map(create, read_only)
        self._read_only = read_only
        if create:
            self._start_after(prev_end_phy_offset, prev_end_timestamp)
        else:
            self._load_header()

    # -- mapping -------------------------------------------------------------------------------
    def _map(self, create: bool, read_only: bool) -> mmap.mmap:
        flags = os.O_RDONLY if read_only else os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        try:
            fd = os.open(self.path, flags, 0o644)
        except OSError as exc:
            raise IndexFileError(f"{self.path}: cannot open ({exc.strerror or exc})") from None
        try:
            if create:
                os.ftruncate(fd, self.file_size)  # sparse: blocks are allocated as entries arrive
                created_durably(fd, self.path)  # an fdatasync of entries does not make the name durable
            actual = os.fstat(fd).st_size
            if actual != self.file_size:
                raise IndexFileError(
                    f"{self.path}: {actual} bytes, but hashSlotNum {self.hash_slot_num} and indexNum "
                    f"{self.index_num} make {self.file_size}-byte index files")
            access = mmap.ACCESS_READ if read_only else mmap.ACCESS_WRITE
            return mmap.mmap(fd, self.file_size, access=access)
        finally:
            os.close(fd)

    def _start_after(self, prev_end_phy_offset: int, prev_end_timestamp: int) -> None:
        self.begin_phy_offset = self.end_phy_offset = max(prev_end_phy_offset, 0)
        self.begin_timestamp = self.end_timestamp = max(prev_end_timestamp, 0)
        self.hash_slot_count = 0
        self.index_count = 1
        self._write_header()

    def reload_header(self) -> None:
        """Re-read the header a writer in another process keeps moving (a read-only reader, before
        each lookup). Read twice until two reads agree, so a header the writer is rewriting at that
        moment is not taken half old, half new."""
        first = IndexHeader.read(self._mm)
        for _ in range(8):
            again = IndexHeader.read(self._mm)
            if again == first:
                break
            first = again
        self._set_header(first)

    def _load_header(self) -> None:
        self._set_header(IndexHeader.read(self._mm))

    def _set_header(self, h: IndexHeader) -> None:
        self.begin_timestamp, self.end_timestamp = h.begin_timestamp, h.end_timestamp
        self.begin_phy_offset, self.end_phy_offset = h.begin_phy_offset, h.end_phy_offset
        self.hash_slot_count = h.hash_slot_count
        # IndexHeader.load: 0 (never written) means 1; a count past the end would read past the mapping
        self.index_count = min(h.index_count, self.index_num) if h.index_count > 0 else 1

    def _write_header(self) -> None:
        _HEADER.pack_into(self._mm, 0, self.begin_timestamp, self.end_timestamp, self.begin_phy_offset,
                          self.end_phy_offset, self.hash_slot_count, self.index_count)

    # -- state ---------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.path.name

    @property
    def header(self) -> IndexHeader:
        return IndexHeader(self.begin_timestamp, self.end_timestamp, self.begin_phy_offset,
                           self.end_phy_offset, self.hash_slot_count, self.index_count)

    @property
    def is_write_full(self) -> bool:
        return self.index_count >= self.index_num

    def is_time_matched(self, begin: int, end: int) -> bool:
        """RocketMQ's isTimeMatched: [begin, end] covers the file's time span or has an end inside it."""
        b, e = self.begin_timestamp, self.end_timestamp
        return (begin < b and end > e) or b <= begin <= e or b <= end <= e

    # -- writing -------------------------------------------------------------------------------
    def put_key(self, key: str, phy_offset: int, store_timestamp: int) -> bool:
        """Index ``key`` (``topic#key``) for the message at ``phy_offset``; False when the file is full."""
        return self.put_items(((index_key_hash_fast(key), phy_offset, store_timestamp),), 0) == 1

    def put_items(self, items: Sequence[IndexItem], start: int = 0) -> int:
        """Put ``items[start:]`` until the file is full; returns the position of the first item not put.

        Entry by entry this is RocketMQ's putKey: the slot's value (reset to 0 when out of range) becomes
        the entry's prevIndex and the slot then names the new entry; timeDiff is whole seconds from
        beginTimestamp, read *before* the first entry sets it; hashSlotCount counts slots that were empty.
        The header is written once per call, the hot loop keeps it in locals.
        """
        if self._read_only:
            raise IndexFileError(f"{self.path}: opened read-only")
        mm, slots, limit, entries_pos = self._mm, self.hash_slot_num, self.index_num, self._entries_pos
        get_slot, set_slot, set_entry = _I32.unpack_from, _I32.pack_into, _ENTRY.pack_into
        count, slot_count = self.index_count, self.hash_slot_count
        begin_ts, begin_off = self.begin_timestamp, self.begin_phy_offset
        pos, n = start, len(items)
        phy_offset = store_timestamp = 0
        while pos < n and count < limit:
            key_hash, phy_offset, store_timestamp = items[pos]
            slot_pos = INDEX_HEADER_SIZE + (key_hash % slots) * HASH_SLOT_SIZE
            slot_value = get_slot(mm, slot_pos)[0]
            if slot_value <= INVALID_INDEX or slot_value > count:
                slot_value = INVALID_INDEX
                slot_count += 1
            time_diff = (store_timestamp - begin_ts) // 1000 if begin_ts > 0 else 0
            if time_diff < 0:  # Java truncates toward zero, then clamps: either way 0
                time_diff = 0
            elif time_diff > INT_MAX:
                time_diff = INT_MAX
            set_entry(mm, entries_pos + count * INDEX_ENTRY_SIZE, key_hash, phy_offset, time_diff, slot_value)
            set_slot(mm, slot_pos, count)
            if count <= 1:
                begin_off, begin_ts = phy_offset, store_timestamp
            count += 1
            pos += 1
        if pos > start:
            self.index_count, self.hash_slot_count = count, slot_count
            self.begin_timestamp, self.begin_phy_offset = begin_ts, begin_off
            self.end_phy_offset, self.end_timestamp = phy_offset, store_timestamp
            self._write_header()
        return pos

    def put_columns(self, items: IndexColumns, start: int = 0) -> int:
        """:meth:`put_items` for arrays: the same bytes, with numpy doing the per-entry work.

        Within a batch an entry's prevIndex is the batch's previous entry with the same slot (found by
        a stable sort on the slot), or, for the first one, the slot's value before the batch (reset to
        0 when out of range, counted in hashSlotCount when it was). The entries are written first, then
        the slots (each set to its last entry), then the header, so a reader in another process that
        sees a slot finds the entry it names complete. A fresh file's first entry sets the begin
        values, so it goes through :meth:`put_items`."""
        if self._read_only:
            raise IndexFileError(f"{self.path}: opened read-only")
        n = items.size
        pos = start
        if pos < n and self.index_count <= 1:
            pos = start + self.put_items(items.tuples(start, start + 1), 0)
        count = self.index_count
        m = min(n - pos, self.index_num - count)
        if m <= 0:
            return pos
        end = pos + m
        key_hash, phy_offset = items.key_hash[pos:end], items.phy_offset[pos:end]
        store_timestamp = items.store_timestamp[pos:end]
        slot = key_hash % self.hash_slot_num
        number = np.arange(count, count + m, dtype=np.int64)
        order = np.argsort(slot, kind="stable")
        sorted_slot = slot[order]
        first = np.ones(m, dtype=np.bool_)
        first[1:] = sorted_slot[1:] != sorted_slot[:-1]
        last = np.ones(m, dtype=np.bool_)
        last[:-1] = first[1:]
        prev_sorted = np.empty(m, dtype=np.int64)
        prev_sorted[1:] = number[order[:-1]]
        slots = np.frombuffer(self._mm, dtype=">i4", count=self.hash_slot_num, offset=INDEX_HEADER_SIZE)
        try:
            before = slots[sorted_slot[first]].astype(np.int64)
            empty = (before <= INVALID_INDEX) | (before > number[order[first]])
            before[empty] = INVALID_INDEX
            prev_sorted[first] = before
            prev = np.empty(m, dtype=np.int64)
            prev[order] = prev_sorted
            entries = np.empty(m, dtype=_ENTRY_DTYPE)
            entries["key_hash"] = key_hash
            entries["phy_offset"] = phy_offset
            begin_ts = self.begin_timestamp
            entries["time_diff"] = np.clip((store_timestamp - begin_ts) // 1000, 0, INT_MAX) if begin_ts > 0 else 0
            entries["prev_index"] = prev
            at = self._entries_pos + count * INDEX_ENTRY_SIZE
            self._mm[at:at + m * INDEX_ENTRY_SIZE] = entries.tobytes()
            slots[sorted_slot[last]] = number[order[last]]
        finally:
            del slots  # a view must go before the mapping can be closed
        self.index_count = count + m
        self.hash_slot_count += int(np.count_nonzero(empty))
        self.end_phy_offset, self.end_timestamp = int(phy_offset[-1]), int(store_timestamp[-1])
        self._write_header()
        return end

    # -- rewinding -----------------------------------------------------------------------------
    def rewind(self, cut_offset: int, trusted: IndexHeader | None = None,
               exact: IndexHeader | None = None) -> RewindResult:
        """Remove every entry whose commitlog offset is ``>= cut_offset``, leaving the file as if they
        had never been put: header, hash slots and entry bytes.

        ``trusted`` is a header whose entries 1 .. indexCount-1 are known to be in the file (the state a
        checkpoint saw after an msync; by default the file's own header). Entries past it may be there
        too (a kill during a put writes entries and slots before the header) or may be lost (a power
        loss keeps any subset of the dirty pages); either way they are after the cut, so they go.

        - The kept entries are those below the cut: a prefix, found by binary search (offsets are
          non-decreasing in a file).
        - A hash slot that names a removed entry is set back to what it held before the oldest removed
          entry of its chain was put: walking the chain from the slot head, newest first, through the
          removed entries' prevIndex to the first one below the cut (0 if none). A step through an
          unreadable entry (wrong hash for the slot, offset below the cut, prevIndex not older: a lost
          page reads as zeros) cannot be followed: such a slot is recomputed from the kept entries
          (the newest one with that slot).
        - hashSlotCount loses one for each removed trusted entry whose prevIndex is 0 (its put found
          the slot empty); indexCount is the first removed entry's number; endPhyOffset is the last kept
          entry's offset. endTimestamp is ``exact``'s when the file lands on exactly that state (a
          checkpoint), else the last kept entry's store time to the second (beginTimestamp + timeDiff;
          the milliseconds are not stored): the next put overwrites it with the exact value.
        - The removed entries' bytes are zeroed, as far as non-zero entries follow.

        A file left with no entry gets indexCount 1 and should be deleted by its owner (its begin
        values are the previous file's end, which only the owner knows).
        """
        if self._read_only:
            raise IndexFileError(f"{self.path}: opened read-only")
        state = trusted if trusted is not None else self.header
        trusted_count = min(max(state.index_count, 1), self.index_num)
        keep = self._first_entry_at_or_past(cut_offset, trusted_count)
        entries = np.frombuffer(self._mm, dtype=_ENTRY_DTYPE, count=self.index_num, offset=self._entries_pos)
        slots = np.frombuffer(self._mm, dtype=">i4", count=self.hash_slot_num, offset=INDEX_HEADER_SIZE)
        try:
            removed_trusted = entries[keep:trusted_count]
            emptied = int(np.count_nonzero(removed_trusted["prev_index"] == INVALID_INDEX))
            slots_changed, repaired = self._restore_slots(slots, entries, keep, cut_offset)
            del removed_trusted
        finally:
            del entries, slots  # views must go before the mapping can be closed
        zeroed = self._zero_entries_from(keep)
        if keep <= 1:
            header = IndexHeader(state.begin_timestamp, state.end_timestamp, state.begin_phy_offset,
                                 state.end_phy_offset, 0, 1)
        elif keep == trusted_count:
            header = state
        else:
            _, last_offset, last_diff, _ = _ENTRY.unpack_from(self._mm,
                                                              self._entries_pos + (keep - 1) * INDEX_ENTRY_SIZE)
            end_timestamp = state.begin_timestamp if keep == 2 else state.begin_timestamp + last_diff * 1000
            header = IndexHeader(state.begin_timestamp, end_timestamp, state.begin_phy_offset, last_offset,
                                 state.hash_slot_count - emptied, keep)
        if exact is not None and keep > 1 and replace(header, end_timestamp=exact.end_timestamp) == exact:
            header = exact
        changed = header != self.stored_header() or slots_changed or zeroed
        if changed or header != self.header:
            self.begin_timestamp, self.end_timestamp = header.begin_timestamp, header.end_timestamp
            self.begin_phy_offset, self.end_phy_offset = header.begin_phy_offset, header.end_phy_offset
            self.hash_slot_count, self.index_count = header.hash_slot_count, header.index_count
            self._write_header()
        return RewindResult(trusted_count - keep, repaired, changed)

    def _first_entry_at_or_past(self, cut_offset: int, count: int) -> int:
        """The number of the first entry in 1 .. count-1 whose offset is >= ``cut_offset`` (``count``
        if none): a binary search reading log2(count) entries, not the whole file."""
        low, high = 1, count
        read, base = _I64.unpack_from, self._entries_pos + 4
        while low < high:
            middle = (low + high) // 2
            if read(self._mm, base + middle * INDEX_ENTRY_SIZE)[0] < cut_offset:
                low = middle + 1
            else:
                high = middle
        return low

    def _restore_slots(self, slots: np.ndarray, entries: np.ndarray, keep: int, cut_offset: int) -> tuple[bool, int]:
        """Point every slot that names an entry numbered ``>= keep`` (or holds garbage) at the newest
        kept entry of its chain. An entry on the way must look like one the rewind removes: its key
        hash in this slot, its offset at or past the cut, its prevIndex older (a lost page reads as
        zeros). Returns (whether any slot changed, how many had to be recomputed)."""
        stale = np.flatnonzero((slots >= keep) | (slots < 0))
        if stale.size == 0:
            return False, 0
        values = slots[stale].astype(np.int64)
        values[values < 0] = INVALID_INDEX
        broken = np.zeros(stale.size, dtype=bool)
        for _ in range(self.index_num):  # a chain visits each entry at most once
            walking = np.flatnonzero((values >= keep) & ~broken)
            if walking.size == 0:
                break
            current = values[walking]
            readable = current < self.index_num
            at = np.where(readable, current, 0)
            step = entries[at]
            prev = step["prev_index"].astype(np.int64)
            ok = readable & (step["key_hash"].astype(np.int64) % self.hash_slot_num == stale[walking]) \
                & (step["phy_offset"] >= cut_offset) & (prev >= 0) & (prev < current)
            values[walking] = np.where(ok, prev, INVALID_INDEX)
            broken[walking[~ok]] = True
        repaired = int(np.count_nonzero(broken))
        if repaired:
            values[broken] = self._newest_kept(entries, keep, stale[broken])
        slots[stale] = values
        return True, repaired

    def _newest_kept(self, entries: np.ndarray, keep: int, wanted: np.ndarray) -> np.ndarray:
        """For each slot in ``wanted``, the number of the newest entry below ``keep`` hashed to it (0:
        none). Reads every kept entry: only for chains a lost page broke."""
        heads = np.zeros(wanted.size, dtype=np.int64)
        if keep <= 1:
            return heads
        slot_of = entries["key_hash"][1:keep].astype(np.int64) % self.hash_slot_num
        newest = np.full(self.hash_slot_num, INVALID_INDEX, dtype=np.int64)
        newest[slot_of] = np.arange(1, keep, dtype=np.int64)  # numbers ascend: the last write wins
        heads[:] = newest[wanted]
        return heads

    def _zero_entries_from(self, first: int) -> bool:
        """Zero entries from ``first`` on, a chunk at a time, until a chunk that is already all zero (a
        sparse file's untouched tail is never written). Returns whether anything was zeroed."""
        zeroed = False
        number = first
        while number < self.index_num:
            count = min(_ZERO_CHUNK_ENTRIES, self.index_num - number)
            start = self._entries_pos + number * INDEX_ENTRY_SIZE
            chunk = np.frombuffer(self._mm, dtype=np.uint32, count=count * INDEX_ENTRY_SIZE // 4, offset=start)
            try:
                if not chunk.any():
                    break
                chunk[:] = 0
            finally:
                del chunk
            zeroed = True
            number += count
        return zeroed

    # -- reading -------------------------------------------------------------------------------
    def select_phy_offsets(self, key: str, max_num: int, begin: int, end: int,
                           phy_offsets: list[int] | None = None) -> list[int]:
        """Offsets indexed under ``key`` (``topic#key``) stored in [begin, end]; see :meth:`select_by_hash`."""
        return self.select_by_hash(index_key_hash_fast(key), max_num, begin, end, phy_offsets)

    def select_by_hash(self, key_hash: int, max_num: int, begin: int, end: int,
                       phy_offsets: list[int] | None = None) -> list[int]:
        """Walk the slot's chain newest first, appending to ``phy_offsets`` (until it holds ``max_num``)
        the offsets of entries with this key hash whose store time (beginTimestamp + timeDiff s) is in
        [begin, end]. As RocketMQ's selectPhyOffset, the walk stops at an entry older than ``begin``,
        a negative timeDiff, or a prevIndex that is 0, out of range or a self-loop.

        Opened read-only (a reader in another process than the writer), the walk also follows entries
        past the header's indexCount: a put writes the entry, then the slot, then (once per batch) the
        header, so a slot the reader sees always names a complete entry, while the header may lag."""
        out = [] if phy_offsets is None else phy_offsets
        mm, begin_ts = self._mm, self.begin_timestamp
        count = self.index_num - 1 if self._read_only else self.index_count
        slot_value = _I32.unpack_from(mm, INDEX_HEADER_SIZE + (key_hash % self.hash_slot_num) * HASH_SLOT_SIZE)[0]
        if slot_value <= INVALID_INDEX or slot_value > count or count <= 1:
            return out
        read_entry, entries_pos = _ENTRY.unpack_from, self._entries_pos
        current = slot_value
        while len(out) < max_num:
            try:
                hash_read, phy_offset, time_diff, prev = read_entry(mm, entries_pos + current * INDEX_ENTRY_SIZE)
            except struct.error:  # a damaged chain pointing past the file ends the walk (RocketMQ logs it)
                break
            if time_diff < 0:
                break
            time_read = begin_ts + time_diff * 1000
            if hash_read == key_hash and begin <= time_read <= end:
                out.append(phy_offset)
            if prev <= INVALID_INDEX or prev > count or prev == current or time_read < begin:
                break
            current = prev
        return out

    def stored_header(self) -> IndexHeader:
        """The header bytes as they are in the file (indexCount 0 in a file never written)."""
        return IndexHeader.read(self._mm)

    def entries(self) -> Iterator[IndexEntry]:
        """Entries 1 .. indexCount-1, as stored (for inspection and tests)."""
        read_entry, pos = _ENTRY.unpack_from, self._entries_pos
        for i in range(1, min(self.index_count, self.index_num)):
            yield IndexEntry(i, *read_entry(self._mm, pos + i * INDEX_ENTRY_SIZE))

    def slots(self) -> Iterator[tuple[int, int]]:
        """(slot, value) of every non-empty slot, in slot order."""
        values = array("i", self._mm[INDEX_HEADER_SIZE:self._entries_pos])
        if sys.byteorder == "little":
            values.byteswap()
        return ((slot, value) for slot, value in enumerate(values) if value != 0)

    def body(self) -> bytes:
        """Slot table and entries, the bytes after the header (for byte-for-byte comparisons)."""
        return self._mm[INDEX_HEADER_SIZE:]

    # -- lifecycle -----------------------------------------------------------------------------
    def flush(self) -> None:
        """Write the header and make the mapping durable (RocketMQ's IndexFile.flush). With fdatasync on
        the file rather than mmap.flush: Linux's msync(MS_SYNC) of a shared file mapping is an fdatasync
        of the file, but CPython's mmap.flush holds the GIL through it, stalling the dispatcher for the
        whole write-back (a py-spy profile of the indexer shows it); os.fdatasync releases the GIL."""
        if self._read_only:
            return
        self._write_header()
        try:
            fd = os.open(self.path, os.O_RDWR)
        except OSError:
            self._mm.flush()  # the name is gone (replaced or deleted under us): msync the mapping itself
            return
        try:
            os.fdatasync(fd)
        finally:
            os.close(fd)

    def close(self) -> None:
        if not self._mm.closed:
            self._mm.close()

    def destroy(self) -> None:
        """Unmap and delete the file."""
        self.close()
        remove_durably(self.path)

    def __repr__(self) -> str:
        return f"IndexFile({self.name}, count={self.index_count}, end={self.end_phy_offset})"
