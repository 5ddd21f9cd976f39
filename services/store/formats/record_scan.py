"""Fast checks over whole files of records: where the valid log ends, why, and what lies beyond.

Recovery walks up to a few GiB of records at start-up, and :func:`check_record` (which decodes every
field into Python objects, ~20 µs a record) would take minutes for that. :func:`scan_file` checks the
same conditions at C speed where it can:

* one loop step per record reads the fixed fields with one struct unpack, compares MAGICCODE,
  PHYSICALOFFSET (a record must sit at the offset it claims: stale data left past an older end of log
  does not), checks that BODYLENGTH, TOPICLENGTH and PROPERTIESLENGTH add up to TOTALSIZE, and the
  body CRC (zlib over the body's slice of the mapping);
* the text fields are checked for all the records of the file at once with numpy: a topic and
  properties of pure ASCII are valid UTF-8, so only the few records with other bytes, and those of
  SCHEDULE_TOPIC_XXXX (whose DELAY must parse), are decoded one by one;
* the rare layouts the loop does not read (IPv6 hosts, the v2 magic code) go through check_record.

The result is the position check_record would stop at (the cut points are the same), with the
records' start positions for callers that need them.

When a walk stops short of a clean end, :func:`diagnose` says why and :func:`survey` looks past the
bad record for intact ones (the writer's data that a cut there drops), so recovery and ``mqstore
inspect commitlog`` can tell a clean end (zeros), a torn tail (nothing valid after it) and a
damaged record with intact data after it.
"""

from __future__ import annotations

import mmap
import os
import struct
import zlib
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from services.store.formats.message import (
    BORNHOST_V6_FLAG,
    DEFAULT_DELAY_LEVELS_MS,
    PROPERTY_DELAY_TIME_LEVEL,
    SCHEDULE_TOPIC,
    STOREHOSTADDRESS_V6_FLAG,
    string_to_properties,
)
from services.store.formats.record import (
    BLANK_MAGIC_CODE,
    MESSAGE_MAGIC_CODE,
    MESSAGE_MAGIC_CODE_V2,
    MIN_RECORD_LENGTH,
    PHYSICAL_OFFSET_POS,
    SIZE_AND_MAGIC,
    Buffer,
    RecordError,
    body_crc,
    check_record,
    decode_record,
    dispatch_request_of,
    java_parse_int,
)

# TOTALSIZE MAGICCODE BODYCRC, PHYSICALOFFSET SYSFLAG, BODYLENGTH of a record with IPv4 hosts.
_FIXED_V4 = struct.Struct(">iIi16xqi44xi")
_BODY_POS_V4 = _FIXED_V4.size  # 88: the body follows BODYLENGTH
_I16 = struct.Struct(">h")
_I64 = struct.Struct(">q")
_V6_FLAGS = BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG
_CRC_MASK = 0x7FFFFFFF
_SCHEDULE = SCHEDULE_TOPIC.encode()
_MAGIC_PREFIX = struct.pack(">I", MESSAGE_MAGIC_CODE)[:3]  # shared by the v1 and v2 magic codes
_MESSAGE_MAGICS = (MESSAGE_MAGIC_CODE, MESSAGE_MAGIC_CODE_V2)
_NO_TAIL = -1  # in FileScan.tails: a record check_record validated whole (no text check left)


@dataclass(slots=True)
class FileScan:
    """The valid records of one file from a start position.

    ``end`` is the buffer position just past the last valid record (where a BLANK record sits when
    ``blank``: the file's data is complete and a walk goes on in the next file). ``starts`` holds the
    position of every valid record, in order.
    """

    end: int
    blank: bool
    starts: array[int]

    @property
    def records(self) -> int:
        return len(self.starts)


def scan_file(buf: Buffer, start: int, base_offset: int, check_crc: bool = True,
              delay_levels_ms: Sequence[int] = DEFAULT_DELAY_LEVELS_MS) -> FileScan:
    """Walk the records of ``buf`` (one whole file, commitlog offset ``base_offset`` at position 0)
    from ``start``, stopping where recovery does: at a BLANK record, at the first position that
    :func:`check_record` rejects, or at a record whose PHYSICALOFFSET is not its own offset."""
    length = len(buf)
    fixed = _FIXED_V4.unpack_from
    i16 = _I16.unpack_from
    crc32 = zlib.crc32
    starts: array[int] = array("q")
    tails: array[int] = array("q")
    add_start, add_tail = starts.append, tails.append
    last_fixed = length - _BODY_POS_V4
    v1, v6_flags, mask, body_pos = MESSAGE_MAGIC_CODE, _V6_FLAGS, _CRC_MASK, _BODY_POS_V4
    pos = start
    blank = False
    while True:
        if pos > last_fixed:  # no room for a record, at most for a BLANK
            blank = pos + 8 <= length and SIZE_AND_MAGIC.unpack_from(buf, pos)[1] == BLANK_MAGIC_CODE
            break
        size, magic, crc, physical, sys_flag, body_len = fixed(buf, pos)
        if magic != v1 or sys_flag & v6_flags:
            if magic == BLANK_MAGIC_CODE:
                blank = True
                break
            request = check_record(buf, pos, check_crc, delay_levels_ms)  # IPv6 hosts, v2, or garbage
            if not request.success or request.msg_size <= 0 or request.commitlog_offset != base_offset + pos:
                break
            add_start(pos)
            add_tail(_NO_TAIL)
            pos += request.msg_size
            continue
        tail = pos + body_pos + body_len  # TOPICLENGTH
        end = pos + size
        if physical != base_offset + pos or size < MIN_RECORD_LENGTH or end > length or body_len < 0 \
                or tail + 3 > end:
            break
        if check_crc and crc32(buf[pos + body_pos:tail]) & mask != crc:
            break
        props = tail + 3 + buf[tail]  # past TOPICLENGTH, the topic and PROPERTIESLENGTH
        if props > end or props + i16(buf, props - 2)[0] != end:
            break
        add_start(pos)
        add_tail(tail)
        pos = end
    if starts:
        bad = _first_bad_text(buf, starts, tails, pos, delay_levels_ms)
        if bad is not None:
            cut = starts[bad]
            del starts[bad:]
            return FileScan(cut, False, starts)
    return FileScan(pos, blank, starts)


def _first_bad_text(buf: Buffer, starts: array[int], tails: array[int], end: int,
                    delay_levels_ms: Sequence[int]) -> int | None:
    """Index (in ``starts``) of the first loop-checked record whose topic or properties are not UTF-8,
    or whose DELAY does not parse while its topic is SCHEDULE_TOPIC_XXXX; None if there is none.

    Vectorised: one ``maximum.reduceat`` over the file gives the highest byte of every topic and of
    every properties string; only records with a byte >= 0x80 there, or a 19-byte topic that is the
    schedule topic, are decoded."""
    data = np.frombuffer(buf, dtype=np.uint8, count=min(len(buf), end + 1))
    try:
        all_starts = np.frombuffer(starts, dtype=np.int64)
        all_tails = np.frombuffer(tails, dtype=np.int64)
        checked = np.flatnonzero(all_tails != _NO_TAIL)
        if not len(checked):
            return None
        ends = np.empty_like(all_starts)  # a record ends where the next starts; the last one at ``end``
        ends[:-1] = all_starts[1:]
        ends[-1] = end
        tail = all_tails[checked]
        props_end = ends[checked]
        topic_start = tail + 1
        topic_len = data[tail].astype(np.int64)
        topic_end = topic_start + topic_len
        props_start = topic_end + 2
        bounds = np.stack((topic_start, topic_end, props_start, props_end), axis=1).ravel()
        np.minimum(bounds, len(data) - 1, out=bounds)  # only a record ending at the file's last byte is clipped
        highest = np.maximum.reduceat(data, bounds).reshape(-1, 4)
        flagged = ((highest[:, 0] >= 0x80) & (topic_len > 0)) | ((highest[:, 2] >= 0x80) & (props_end > props_start))
        if end >= len(data):
            flagged[-1] = True
        schedule = np.flatnonzero(topic_len == len(_SCHEDULE))
        if len(schedule):
            names = data[topic_start[schedule][:, None] + np.arange(len(_SCHEDULE))]
            flagged[schedule[(names == np.frombuffer(_SCHEDULE, dtype=np.uint8)).all(axis=1)]] = True
        for index in np.flatnonzero(flagged).tolist():
            record = int(checked[index])
            if not _text_ok(buf, tails[record], int(ends[record]), delay_levels_ms):
                return record
        return None
    finally:
        del data  # the mapping can only be closed once no array exports it


def _text_ok(buf: Buffer, tail: int, end: int, delay_levels_ms: Sequence[int]) -> bool:
    """What check_record would decide about the text fields of the record whose TOPICLENGTH is at ``tail``."""
    topic_len = buf[tail]
    try:
        topic = str(buf[tail + 1:tail + 1 + topic_len], "utf-8")
        properties = str(buf[tail + 3 + topic_len:end], "utf-8")
        if topic == SCHEDULE_TOPIC:
            delay = string_to_properties(properties).get(PROPERTY_DELAY_TIME_LEVEL)
            if delay is not None:
                java_parse_int(delay)
    except ValueError:  # UnicodeDecodeError included
        return False
    return True


def record_positions(buf: Buffer, start: int, stop: int) -> tuple[array[int], int, bool]:
    """Start positions of the records in ``buf[start:stop]``, data a recovery already validated: only
    TOTALSIZE and MAGICCODE are read. Returns (starts, end position, ended at a BLANK record).
    Raises RecordError where there is no record."""
    starts: array[int] = array("q")
    add = starts.append
    size_magic = SIZE_AND_MAGIC.unpack_from
    v1, v2 = _MESSAGE_MAGICS
    pos = start
    while pos < stop:
        size, magic = size_magic(buf, pos)
        if magic != v1 and magic != v2 or size <= 0:
            if magic == BLANK_MAGIC_CODE:
                return starts, pos, True
            raise RecordError(f"position {pos}: no record there (magic code {magic:#010x}, size {size})")
        add(pos)
        pos += size
    return starts, pos, False


@dataclass(frozen=True, slots=True)
class Stop:
    """Why a walk stopped at commitlog ``offset``. ``clean`` for a normal end of the data (zero bytes,
    or no room left in the file); ``size`` is the TOTALSIZE the bad record claims when it fits in its
    file (how far it reached), else 0."""

    offset: int
    reason: str
    clean: bool
    size: int = 0


def diagnose(buf: Buffer, pos: int, base_offset: int, check_crc: bool = True,
             delay_levels_ms: Sequence[int] = DEFAULT_DELAY_LEVELS_MS) -> Stop:
    """Why the record at ``pos`` ends a walk (:func:`scan_file` stopped there)."""
    offset = base_offset + pos
    left = len(buf) - pos
    if left < 8:
        return Stop(offset, "no room for a record: the file ends without a BLANK record", True)
    size, magic = SIZE_AND_MAGIC.unpack_from(buf, pos)
    if size == 0 and magic == 0:
        return Stop(offset, "all zero bytes (end of data)", True)
    if magic not in _MESSAGE_MAGICS:
        return Stop(offset, f"bad magic code {magic:#010x} (TOTALSIZE {size})", False)
    if not 0 < size <= left:
        return Stop(offset, f"bad TOTALSIZE {size} ({left} bytes left in the file)", False)
    try:
        record = decode_record(buf, pos)
    except RecordError as exc:  # its text starts with the position; the caller has the offset
        return Stop(offset, f"torn or garbled record ({str(exc).partition(': ')[2]})", False, size)
    if record.commitlog_offset != offset:
        return Stop(offset, f"PHYSICALOFFSET mismatch: the record claims offset {record.commitlog_offset} "
                            "(stale data)", False, size)
    if check_crc and body_crc(record.body) != record.body_crc:
        return Stop(offset, f"body CRC mismatch (BODYCRC {record.body_crc}, the body's is "
                            f"{body_crc(record.body)})", False, size)
    try:
        dispatch_request_of(record, delay_levels_ms)
    except ValueError as exc:
        return Stop(offset, f"bad DELAY property ({exc})", False, size)
    return Stop(offset, "record rejected", False, size)


@dataclass(frozen=True, slots=True)
class Damage:
    """A walk that stopped at a bad record rather than at the end of the data.

    ``dropped_bytes`` runs from the bad record to the end of the last data found after it (intact
    records in its file and in later files, or else the bad record's own TOTALSIZE): what a cut there
    throws away. ``intact_records`` counts the valid records after it. None of them: a torn tail."""

    offset: int
    reason: str
    dropped_bytes: int
    intact_records: int

    @property
    def torn_tail(self) -> bool:
        return self.intact_records == 0

    def describe(self) -> str:
        if self.torn_tail:
            return (f"torn record at offset {self.offset} ({self.reason}): {self.dropped_bytes} bytes, "
                    "no valid record after it (a write cut short by a crash)")
        return (f"damaged record at offset {self.offset} ({self.reason}) with {self.intact_records} intact "
                f"records after it: {self.dropped_bytes} bytes up to offset {self.offset + self.dropped_bytes}")


# What survey searches: a mapping or bytes (a memoryview has no find).
Searchable = bytes | bytearray | mmap.mmap


@dataclass(frozen=True, slots=True)
class FileView:
    """One file for :func:`survey`: its commitlog offset, its bytes, and an open descriptor of it if
    there is one, so that the search past a bad record skips the file's holes and unwritten extents
    (SEEK_DATA) instead of faulting in up to a GiB of zero pages."""

    base: int
    buf: Searchable
    fd: int | None = None


def survey(stop: Stop, files: Iterable[FileView], check_crc: bool = True,
           delay_levels_ms: Sequence[int] = DEFAULT_DELAY_LEVELS_MS) -> Damage | None:
    """What lies past ``stop``: None for a clean end, else the Damage.

    ``files`` yields the file holding the stop, then every later file. After a bad record its file
    is searched for the next record (MAGICCODE, and PHYSICALOFFSET equal to its offset, and valid),
    and walked on; later files are walked from their start. Zero bytes end a file's data: the
    preallocated rest of a file is not searched, so a clean end costs nothing, and a clean end
    followed by data in later files is a Damage too (a gap)."""
    data_end = stop.offset + stop.size
    intact = 0
    for index, view in enumerate(files):
        if index == 0:
            if stop.clean:
                continue
            records, end = _survey_file(view, stop.offset - view.base + 1, True, check_crc, delay_levels_ms)
        else:
            records, end = _survey_file(view, 0, False, check_crc, delay_levels_ms)
        if records:
            intact += records
            data_end = max(data_end, end)
    if stop.clean and not intact:
        return None
    reason = f"{stop.reason}, yet later files hold records" if stop.clean else stop.reason
    return Damage(stop.offset, reason, data_end - stop.offset, intact)


def _survey_file(view: FileView, pos: int, search: bool, check_crc: bool,
                 delay_levels_ms: Sequence[int]) -> tuple[int, int]:
    """(valid records from ``pos`` on, commitlog offset where the last one ends), skipping bad ones."""
    buf, base = view.buf, view.base
    records = data_end = 0
    while True:
        if search:
            found = next_record(view, pos, check_crc, delay_levels_ms)
            if found is None:
                break
            pos = found
        scan = scan_file(buf, pos, base, check_crc, delay_levels_ms)
        if scan.records:
            records += scan.records
            data_end = base + scan.end
        if scan.blank or diagnose(buf, scan.end, base, check_crc, delay_levels_ms).clean:
            break
        pos, search = scan.end + 1, True
    return records, data_end


def next_record(view: FileView, pos: int, check_crc: bool = True,
                delay_levels_ms: Sequence[int] = DEFAULT_DELAY_LEVELS_MS) -> int | None:
    """The first position from ``pos`` holding a valid record that sits at its own offset (MAGICCODE,
    PHYSICALOFFSET and the checks of check_record): where a walk resynchronises past a bad record."""
    buf, base, fd = view.buf, view.base, view.fd
    length = len(buf)
    data_end = length if fd is None else 0  # the searched data region ends here (the next hole)
    while pos < length:
        if pos >= data_end and fd is not None:  # jump over the hole
            try:
                pos = os.lseek(fd, pos, os.SEEK_DATA)
            except OSError:  # ENXIO: nothing but holes from pos on
                return None
            data_end = min(length, os.lseek(fd, pos, os.SEEK_HOLE))
        found = buf.find(_MAGIC_PREFIX, pos + 4, data_end)
        if found < 0:
            pos = data_end
            continue
        candidate = found - 4
        pos = candidate + 1
        if candidate + PHYSICAL_OFFSET_POS + 8 > length:
            return None
        if SIZE_AND_MAGIC.unpack_from(buf, candidate)[1] not in _MESSAGE_MAGICS \
                or _I64.unpack_from(buf, candidate + PHYSICAL_OFFSET_POS)[0] != base + candidate:
            continue
        if check_record(buf, candidate, check_crc, delay_levels_ms).success:
            return candidate
    return None
