"""Columnar decoding of a split: every record's fields as NumPy/Arrow columns, no per-record objects.

The per-record decoder (``decode_record`` into a ``MessageRecord``, then Python lists into Arrow)
costs about 18 µs a record, which caps export at one core's ~55 MB/s. Here the split's record bytes
are copied once, the fixed headers of all records are gathered at their offsets with NumPy, and the
variable parts (body, topic, properties, property names and values) become Arrow arrays copied out of
that one buffer in C: short ranges by a vectorised gather, long ones (bodies) through a binary-view
array that points into it. Properties are gathered back to back and split into items at the
separator bytes with NumPy (``\\x01`` and ``\\x02`` never occur inside a UTF-8 multi-byte
character, so byte positions are character boundaries).

Only the common layout takes this path: a v1 record with IPv4 hosts whose lengths add up, whose
properties have no duplicate or dropped (empty name or value) items and, with ``--decompress``, an
uncompressed body. Every other record goes through the per-record decoder, so the rows are exactly
the ones it yields (``tests/pipeline/test_columnar.py`` compares the two on generated stores).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as _pc

from pipeline.scan import ScanSummary, SplitTally
from pipeline.split_reader import MappedSplit, Split, iter_record_positions, scan_split
from services.store.formats.message import (
    BORNHOST_V6_FLAG,
    COMPRESSED_FLAG,
    KEY_SEPARATOR,
    NAME_VALUE_SEPARATOR,
    PROPERTY_SEPARATOR,
    STOREHOSTADDRESS_V6_FLAG,
    MessageRecord,
)
from services.store.formats.record import MESSAGE_MAGIC_CODE, MIN_RECORD_LENGTH, RecordError, crc32, decode_record
from services.store.formats.socket_address import decode_address

# Field offsets of a v1 record with IPv4 hosts (services/store/formats/record.py).
_SIZE, _MAGIC, _CRC, _QUEUE_ID, _FLAG, _QUEUE_OFFSET, _PHYSICAL_OFFSET, _SYS_FLAG = 0, 4, 8, 12, 16, 20, 28, 36
_BORN_TS, _BORN_HOST, _STORE_TS, _STORE_HOST, _RECONSUME, _PREPARED, _BODY_LEN = 40, 48, 56, 64, 72, 76, 84
_BODY = 88
_V6_BITS = BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG
_SEP = ord(PROPERTY_SEPARATOR)
_NAME_SEP = ord(NAME_VALUE_SEPARATOR)
# pyarrow-stubs type arrays by element type with overloads that NumPy-built arrays do not match:
# this module's arrays are typed Column, and compute functions and buffers are called untyped.
Column = Any
pc: Any = _pc
_py_buffer: Any = pa.py_buffer
_map_array: Any = pa.MapArray.from_arrays
list_array: Any = pa.ListArray.from_arrays
_GATHER_BYTES_PER_RANGE = 64
_HEX_DIGITS = np.frombuffer(b"0123456789ABCDEF", dtype=np.uint8)


_HEADER = np.dtype({
    "names": ["size", "magic", "crc", "queue_id", "flag", "queue_offset", "physical_offset", "sys_flag", "born_ms",
              "born_host", "store_ms", "store_host", "reconsume", "prepared", "body_len"],
    "formats": [">i4", ">u4", ">i4", ">i4", ">i4", ">i8", ">i8", ">i4", ">i8", ">u8", ">i8", ">u8", ">i4", ">i8",
                ">i4"],
    "offsets": [_SIZE, _MAGIC, _CRC, _QUEUE_ID, _FLAG, _QUEUE_OFFSET, _PHYSICAL_OFFSET, _SYS_FLAG, _BORN_TS,
                _BORN_HOST, _STORE_TS, _STORE_HOST, _RECONSUME, _PREPARED, _BODY_LEN],
    "itemsize": _BODY,
})


def _headers(data: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """The fixed header of every record at ``positions``, gathered in one copy of ``_BODY`` bytes a
    record (rows of a sliding window over ``data``) and read through a big-endian record dtype: one
    gather instead of one per field and byte."""
    windows = np.lib.stride_tricks.as_strided(data, (data.size - _BODY + 1, _BODY), (1, 1), writeable=False)
    return np.ascontiguousarray(windows[positions]).view(_HEADER)[:, 0]


def _field(headers: np.ndarray, name: str) -> np.ndarray:
    """One header field of every record, as a native-endian array."""
    column = headers[name]
    return column.astype(column.dtype.newbyteorder("="))


def _gather(raw: bytes, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, bytes]:
    """The byte ranges ``[starts[i], ends[i])`` of ``raw`` back to back, and their offsets in it."""
    lengths = ends - starts
    offsets = np.zeros(starts.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if offsets[-1] <= _GATHER_BYTES_PER_RANGE * starts.size:  # short ranges: one vectorised gather
        source = np.frombuffer(raw, dtype=np.uint8)
        return offsets, source[np.repeat(starts - offsets[:-1], lengths) + np.arange(offsets[-1])].tobytes()
    return offsets, b"".join(_slices(raw, starts, ends))


def _slices(raw: bytes, starts: np.ndarray, ends: np.ndarray) -> list[memoryview]:
    """Zero-copy views of the byte ranges ``[starts[i], ends[i])`` of ``raw``."""
    view = memoryview(raw)
    return [view[s:e] for s, e in zip(starts.tolist(), ends.tolist(), strict=True)]


def ranges(raw: bytes, starts: np.ndarray, ends: np.ndarray, kind: pa.DataType) -> Column:
    """The byte ranges ``[starts[i], ends[i])`` of ``raw`` as one Arrow array of ``kind`` (binary or
    string). Long ranges (bodies) are described in place, as a binary-view array over ``raw`` built with
    NumPy, and cast: Arrow copies them in one C loop, with no Python object per range."""
    total = int((ends - starts).sum())
    if total <= _GATHER_BYTES_PER_RANGE * starts.size or len(raw) >= 2**31:
        return _column(*_gather(raw, starts, ends), kind)
    viewed = _binary_views(raw, starts, ends)
    if total < 2**31:
        return viewed.cast(pa.binary()).view(kind)
    large = pa.large_binary() if kind == pa.binary() else pa.large_string()
    return viewed.cast(pa.large_binary()).view(large).cast(kind)


def _binary_views(raw: bytes, starts: np.ndarray, ends: np.ndarray) -> Column:
    """``[starts[i], ends[i])`` of ``raw`` as a binary-view array: 16 bytes a value, its length, then
    up to 12 bytes inline (zero padded) or its first 4 bytes, buffer 0 and its offset in ``raw``."""
    data = np.frombuffer(raw, dtype=np.uint8)
    lengths = ends - starts
    views = np.zeros((starts.size, 16), dtype=np.uint8)
    views[:, :4] = lengths.astype("<i4").view(np.uint8).reshape(-1, 4)
    head = data[np.minimum(starts[:, None] + np.arange(12), data.size - 1)]  # past the end: masked or unused
    inline = lengths <= 12
    views[inline, 4:] = np.where(np.arange(12) < lengths[inline, None], head[inline], 0)
    views[~inline, 4:8] = head[~inline, :4]
    views[~inline, 12:] = starts[~inline].astype("<i4").view(np.uint8).reshape(-1, 4)
    return pa.Array.from_buffers(pa.binary_view(), starts.size, [None, _py_buffer(views), _py_buffer(raw)])


def _column(offsets: np.ndarray, data: bytes, kind: pa.DataType) -> Column:
    """An Arrow array of ``kind`` (binary or string) over values back to back in ``data``."""
    if offsets[-1] < 2**31:
        return pa.Array.from_buffers(kind, offsets.size - 1, [None, _py_buffer(offsets.astype(np.int32)),
                                                              _py_buffer(data)])
    large = pa.large_binary() if kind == pa.binary() else pa.large_string()
    return pa.Array.from_buffers(large, offsets.size - 1, [None, _py_buffer(offsets), _py_buffer(data)]).cast(kind)


def sorted_distinct(values: np.ndarray) -> np.ndarray:
    """``np.unique(values)``: the distinct values, ascending, found by a sort. NumPy 2's ``np.unique``
    without ``return_*`` options builds a hash table instead, 20-30x slower on millions of values
    (2.1 s against 0.04 s for an export's 1.9 million commitlog offsets, which arrive as sorted runs)."""
    ordered = np.sort(values.astype(values.dtype.newbyteorder("="), copy=False), kind="stable")
    if ordered.size < 2:
        return ordered
    return ordered[np.concatenate(([True], ordered[1:] != ordered[:-1]))]


def host_strings(raw: np.ndarray) -> Column:
    """``ip:port`` strings of 8-byte IPv4 host fields (big-endian u64), formatted once per distinct host."""
    distinct, inverse = np.unique(raw, return_inverse=True)
    names: Column = pa.array([decode_address(int(value).to_bytes(8, "big")) for value in distinct.tolist()],
                             pa.string())
    return names.take(pa.array(inverse.astype(np.int64).ravel()))


def _message_ids(store_hosts: np.ndarray, offsets: np.ndarray) -> Column:
    """Offset message ids: the 8 store host bytes and the 8 offset bytes as 32 upper-case hex digits."""
    raw = np.empty((offsets.size, 16), dtype=np.uint8)
    raw[:, :8] = store_hosts.astype(">u8").view(np.uint8).reshape(-1, 8)
    raw[:, 8:] = offsets.astype(">i8").view(np.uint8).reshape(-1, 8)
    hexed = np.empty((offsets.size, 32), dtype=np.uint8)
    hexed[:, 0::2] = _HEX_DIGITS[raw >> 4]
    hexed[:, 1::2] = _HEX_DIGITS[raw & 0xF]
    value_offsets = np.arange(0, 32 * offsets.size + 1, 32, dtype=np.int32)
    return pa.Array.from_buffers(pa.string(), offsets.size,
                                 [None, _py_buffer(value_offsets), _py_buffer(hexed.tobytes())])


@dataclass
class Properties:
    """Properties of the fast records, parsed: kept items per record and names/values by item."""

    counts: np.ndarray  # kept items per record
    record: np.ndarray  # record (row) of each kept item
    names: Column
    values: Column
    bad: np.ndarray  # rows whose properties need the per-record parse (duplicate names)

    def lookup(self, name: str) -> Column:
        """The value of property ``name`` per record, null where absent (names are unique per record)."""
        found = np.flatnonzero(pc.equal(self.names, name).to_numpy(zero_copy_only=False))
        index = np.full(self.counts.size, -1, dtype=np.int64)
        index[self.record[found]] = found
        return self.values.take(pa.array(index, mask=index < 0))


def _properties(raw: bytes, starts: np.ndarray, ends: np.ndarray) -> Properties:
    """RocketMQ's string2messageProperties over every record at once: items split at ``\\x02``, each
    at its first ``\\x01``; items with an empty name or value are dropped. The properties are first
    gathered back to back (a tenth of a split), so the separator search never reads the bodies and
    every separator found is one of a record's properties."""
    rows = starts.size
    bounds, raw = _gather(raw, starts, ends)
    starts, ends = bounds[:-1], bounds[1:]
    data = np.frombuffer(raw, dtype=np.uint8)
    separators = np.flatnonzero(data == _SEP)
    name_seps = np.flatnonzero(data == _NAME_SEP)
    owner = np.searchsorted(starts, separators, side="right") - 1  # the last record starting at or before it
    item_starts = np.concatenate([starts, separators + 1])
    item_ends = np.concatenate([separators, ends])
    item_record = np.concatenate([np.arange(rows), owner])
    order = np.lexsort((item_starts, item_record))
    item_starts, item_record = item_starts[order], item_record[order]
    item_ends = np.sort(item_ends)  # items are back to back within a record, records in order
    k = np.searchsorted(name_seps, item_starts, side="left")
    first = np.where(k < name_seps.size, name_seps[np.minimum(k, max(name_seps.size - 1, 0))], -1) \
        if name_seps.size else np.full(item_starts.size, -1)
    keep = (first >= 0) & (first < item_ends) & (first > item_starts) & (item_ends > first + 1)
    bad = _bad_text_rows(raw, item_starts[~keep], item_ends[~keep], item_record[~keep], rows)
    item_starts, item_ends, first, item_record = item_starts[keep], item_ends[keep], first[keep], item_record[keep]
    names = ranges(raw, item_starts, first, pa.string())
    values = ranges(raw, first + 1, item_ends, pa.string())
    counts = np.bincount(item_record, minlength=rows)
    if item_record.size:
        # A name twice in one record: the last value wins in a dict, at the first one's place.
        encoded = pc.dictionary_encode(names)
        pair = item_record.astype(np.int64) * len(encoded.dictionary) + encoded.indices.to_numpy()
        distinct, counts_of_pair = np.unique(pair, return_counts=True)
        if distinct.size != pair.size:
            bad[distinct[counts_of_pair > 1] // len(encoded.dictionary)] = True
    return Properties(counts, item_record, names, values, bad)


def _bad_text_rows(raw: bytes, starts: np.ndarray, ends: np.ndarray, record: np.ndarray, rows: int) -> np.ndarray:
    """Rows with an item that is dropped (no separator, empty name or value) yet not UTF-8: the
    per-record decoder decodes the properties string whole and refuses such a record, so the fast path
    must hand it over. Non-empty dropped items are rare (a trailing separator leaves an empty one)."""
    bad = np.zeros(rows, dtype=np.bool_)
    for at in np.flatnonzero(ends > starts).tolist():
        try:
            raw[int(starts[at]):int(ends[at])].decode("utf-8")
        except UnicodeDecodeError:
            bad[record[at]] = True
    return bad


def keys_lists(keys: Column) -> Column:
    """The KEYS property split on spaces with empty words dropped ([] without KEYS)."""
    split = pc.split_pattern(pc.fill_null(keys, ""), KEY_SEPARATOR)
    words = pc.list_flatten(split)
    parents = pc.list_parent_indices(split).to_numpy()
    nonempty = pc.greater(pc.binary_length(words), 0)
    kept_parents = parents[nonempty.to_numpy(zero_copy_only=False)]
    counts = np.bincount(kept_parents, minlength=len(keys))
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    return list_array(pa.array(offsets), words.filter(nonempty))


@dataclass
class FastRecords:
    """What the columnar pass made of a split's records."""

    positions: np.ndarray  # absolute file positions of the fast records
    fields: dict[str, Any]  # header fields (numpy), per fast record
    body: Column
    topic: Column
    properties: Properties
    slow: list[int]  # absolute file positions for the per-record decoder


def bodies_checked(raw: bytes, starts: np.ndarray, ends: np.ndarray, stored: np.ndarray) -> tuple[Column, np.ndarray]:
    """The bodies ``raw[start:end]`` as a binary column, and whether each matches its stored BODYCRC
    (ISA-L's CRC-32, one C call each)."""
    computed = np.fromiter(map(crc32, _slices(raw, starts, ends)), dtype=np.int64, count=starts.size)
    return ranges(raw, starts, ends, pa.binary()), np.asarray((computed & 0x7FFFFFFF) == stored)


def decode_fast(view: memoryview, positions: np.ndarray, decompress: bool, bodies: bool = True) -> FastRecords:
    """Columns of the records at ``positions`` (file positions, ascending) that take the fast path.
    ``bodies=False`` (reindex) leaves out the body column and the CRC check."""
    if positions.size == 0:
        empty = np.empty(0, dtype=np.int64)
        return FastRecords(empty, {}, pa.array([], pa.binary()), pa.array([], pa.string()),
                           _properties(b"", empty, empty), [])
    base = int(positions[0])
    last_size = int.from_bytes(view[int(positions[-1]):int(positions[-1]) + 4], "big", signed=True)
    raw = bytes(view[base:int(positions[-1]) + last_size])
    data = np.frombuffer(raw, dtype=np.uint8)
    pos = positions - base
    headers = _headers(data, pos)
    size = _field(headers, "size").astype(np.int64)
    end = pos + size
    magic = _field(headers, "magic")
    sys_flag = _field(headers, "sys_flag")
    body_len = _field(headers, "body_len").astype(np.int64)
    body_start = pos + _BODY
    body_end = body_start + body_len
    ok = (magic == MESSAGE_MAGIC_CODE) & ((sys_flag & _V6_BITS) == 0) & (size >= MIN_RECORD_LENGTH) \
        & (body_len >= 0) & (body_end + 3 <= end)
    if decompress:
        ok &= (sys_flag & COMPRESSED_FLAG) == 0
    safe_body_end = np.where(ok, body_end, pos)
    topic_len = data[safe_body_end].astype(np.int64)
    topic_start = safe_body_end + 1
    topic_end = topic_start + topic_len
    ok &= topic_end + 2 <= end
    props_at = np.where(ok, topic_end, pos)
    props_len = (data[props_at].astype(np.int64) << 8 | data[props_at + 1]).astype(np.int16).astype(np.int64)
    props_start = props_at + 2
    ok &= (props_len >= 0) & (props_start + props_len == end)
    rows = np.flatnonzero(ok)
    props = _properties(raw, props_start[rows], (props_start + props_len)[rows])
    topic = ranges(raw, topic_start[rows], topic_end[rows], pa.string())
    try:
        topic.validate(full=True)
        props.names.validate(full=True)
        props.values.validate(full=True)
    except pa.ArrowInvalid:  # bad UTF-8 somewhere: the per-record decoder says where
        return FastRecords(np.empty(0, dtype=np.int64), {}, pa.array([], pa.binary()), pa.array([], pa.string()),
                           props, positions.tolist())
    if props.bad.any():
        good = ~props.bad
        rows = rows[good]
        props = _properties(raw, props_start[rows], (props_start + props_len)[rows])
        topic = ranges(raw, topic_start[rows], topic_end[rows], pa.string())
    slow_mask = np.ones(positions.size, dtype=np.bool_)
    slow_mask[rows] = False
    h = headers[rows]
    fields: dict[str, Any] = {
        "store_size": size[rows],
        "body_crc": _field(h, "crc"),
        "queue_id": _field(h, "queue_id"),
        "flag": _field(h, "flag"),
        "queue_offset": _field(h, "queue_offset"),
        "commitlog_offset": _field(h, "physical_offset"),
        "sys_flag": sys_flag[rows],
        "born_ms": _field(h, "born_ms"),
        "born_host": _field(h, "born_host"),
        "store_ms": _field(h, "store_ms"),
        "store_host": _field(h, "store_host"),
        "reconsume_times": _field(h, "reconsume"),
        "prepared_transaction_offset": _field(h, "prepared"),
    }
    fields["body_size"] = body_len[rows]
    if not bodies:
        return FastRecords(positions[rows], fields, None, topic, props, positions[slow_mask].tolist())
    body, fields["crc_ok"] = bodies_checked(raw, body_start[rows], body_end[rows], fields["body_crc"])
    return FastRecords(positions[rows], fields, body, topic, props, positions[slow_mask].tolist())




def walk_split(split: Split, summary: ScanSummary, decompress: bool
               ) -> Iterator[tuple[memoryview, FastRecords]]:
    """Map the split, lay it out (gaps to ``summary``) and decode its records' columns. Yields once,
    with the mapping still open (for the slow records and CRCs)."""
    with MappedSplit(split) as view:
        layout = scan_split(view, split)
        summary.gaps.update((gap.offset, gap) for gap in layout.gaps)
        positions = np.fromiter(iter_record_positions(view, layout.runs), dtype=np.int64)
        yield view, decode_fast(view, positions, decompress)


def decode_slow(view: memoryview, split: Split, positions: list[int], summary: ScanSummary
                ) -> list[tuple[int, MessageRecord]]:
    """The per-record decoder for the records the fast path left; undecodable ones go to ``summary``."""
    decoded = []
    for position in positions:
        offset = split.file_offset + position
        try:
            decoded.append((offset, decode_record(view, position)))
        except RecordError as exc:
            summary.bad_records[offset] = str(exc).partition(": ")[2] or str(exc)
    return decoded


def tally(split: Split, summary: ScanSummary, offsets: np.ndarray, sizes: np.ndarray) -> None:
    """Count the split's decoded records in ``summary`` (under its index, so a retry counts once)."""
    if offsets.size:
        summary.max_end = max(summary.max_end, int((offsets + sizes).max()))
    summary.splits[split.index] = SplitTally(int(offsets.size), int(sizes.sum()), int(offsets.sum()))


def export_batches(split: Split, decompress: bool, summary: ScanSummary, batch_rows: int,
                   schema: pa.Schema, slow_rows: Callable[[list[MessageRecord]], pa.RecordBatch]
                   ) -> Iterator[pa.RecordBatch]:
    """export's rows of every record the split owns, as Arrow batches of at most ``batch_rows`` rows
    in commitlog order. ``slow_rows`` turns per-record-decoded records into rows (export's own code)."""
    for view, fast in walk_split(split, summary, decompress):
        f = fast.fields
        table = None
        if fast.positions.size:
            props = fast.properties
            offsets = np.concatenate([[0], np.cumsum(props.counts)]).astype(np.int32)
            store_ms = f["store_ms"]
            table = pa.Table.from_arrays([
                fast.topic,
                pa.array(f["queue_id"], pa.int32()),
                pa.array(f["queue_offset"], pa.int64()),
                pa.array(f["commitlog_offset"], pa.int64()),
                pa.array(f["store_size"], pa.int32()),
                _message_ids(f["store_host"], f["commitlog_offset"]),
                props.lookup("UNIQ_KEY"),
                keys_lists(props.lookup("KEYS")),
                props.lookup("TAGS"),
                _map_array(pa.array(offsets), props.names, props.values),
                fast.body,
                pa.array(np.zeros(fast.positions.size, dtype=np.bool_)),
                pa.array(f["body_crc"], pa.int32()),
                pa.array(f["crc_ok"]),
                pa.array(f["flag"], pa.int32()),
                pa.array(f["sys_flag"], pa.int32()),
                pa.array(f["born_ms"] * 1000, pa.timestamp("us", tz="UTC")),
                pa.array(store_ms * 1000, pa.timestamp("us", tz="UTC")),
                host_strings(f["born_host"]),
                host_strings(f["store_host"]),
                pa.array(f["reconsume_times"], pa.int32()),
                pa.array(f["prepared_transaction_offset"], pa.int64()),
                pa.array((store_ms // 86_400_000).astype(np.int32), pa.date32()),
            ], schema=schema)
        decoded = decode_slow(view, split, fast.slow, summary)
        if decoded:
            slow = pa.Table.from_batches([slow_rows([record for _, record in decoded])], schema=schema)
            table = slow if table is None else pa.concat_tables([table, slow])
            table = table.take(pc.sort_indices(table["commitlog_offset"]))
        record_offsets = np.concatenate([fast.positions + split.file_offset,
                                         np.array([o for o, _ in decoded], dtype=np.int64)])
        record_sizes = np.concatenate([f.get("store_size", np.empty(0, dtype=np.int64)),
                                       np.array([r.store_size for _, r in decoded], dtype=np.int64)])
        tally(split, summary, record_offsets, record_sizes)
        if table is not None:
            yield from table.combine_chunks().to_batches(max_chunksize=batch_rows)
