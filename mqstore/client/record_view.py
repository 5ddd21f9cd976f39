"""A raw pull answer read lazily: views over the received bytes that decode a field when it is asked for.

:func:`~mqstore.client.records.decode_records` builds every field of every message (hosts, ids,
properties) whether the consumer reads it or not; a consumer that reads the body and an offset pays
for all of it. :class:`PulledRecords` finds the records once (one walk over their TOTALSIZE fields)
and hands out :class:`RecordView` objects: each checks its record's layout the first time a field is
read, checks the body CRC when the body is read, decodes topic and properties when they are read, and
builds the whole :class:`~mqstore.client.models.Message` only on :meth:`RecordView.message`. A field
gives exactly what the same field of ``decode_records`` gives (the same rules, the same code), and
bytes ``decode_records`` refuses raise DataLossError here too: bytes that do not split into records
when the answer is split, a damaged field when it is read.

For bulk consumers the answer also reads by column: :meth:`PulledRecords.queue_offsets` and the
other offsets and timestamps as ``array('q')``, :meth:`PulledRecords.bodies` as memoryviews of the
received bytes (a compressed body the store would inflate is inflated, as ``decode_records`` does).
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Iterator, Sequence
from typing import Any, overload

from mqstore.client.compression import COMPRESSED_FLAG, consumer_body
from mqstore.client.models import PROPERTY_KEYS, PROPERTY_TAGS, PROPERTY_UNIQ_KEY, Message
from mqstore.client.records import (
    _MIN_RECORD,
    Layout,
    _malformed,
    checked_body,
    layout_message,
    record_layout,
    record_properties,
    record_topic,
)

_TOTAL_SIZE = struct.Struct(">i")
# Positions in Layout.head (the fixed fields, in the record's order).
_CRC, _QUEUE_ID, _FLAG, _QUEUE_OFFSET, _COMMITLOG_OFFSET, _SYS_FLAG, _BORN_TS, _STORE_TS, _RECONSUME = \
    2, 3, 4, 5, 6, 7, 8, 10, 12


class RecordView:
    """One record of a raw pull answer, decoded field by field on demand (each decoded field is kept)."""

    __slots__ = ("_data", "_pos", "_end", "_queue_id", "_layout", "_body", "_properties", "_message")

    def __init__(self, data: bytes, pos: int, end: int, queue_id: int | None) -> None:
        self._data = data
        self._pos = pos
        self._end = end
        self._queue_id = queue_id
        self._layout: Layout | None = None
        self._body: bytes | None = None
        self._properties: dict[str, str] | None = None
        self._message: Message | None = None

    def __repr__(self) -> str:
        return f"RecordView(at byte {self._pos} of {len(self._data)})"

    @property
    def layout(self) -> Layout:
        """The record's fixed fields and field boundaries, checked to add up (DataLossError if not)."""
        layout = self._layout
        if layout is None:
            layout = self._layout = record_layout(self._data, self._pos, self._end)
        return layout

    def _head(self, index: int) -> Any:
        return self.layout.head[index]

    @property
    def queue_id(self) -> int:
        return self._queue_id if self._queue_id is not None else int(self._head(_QUEUE_ID))

    @property
    def queue_offset(self) -> int:
        return int(self._head(_QUEUE_OFFSET))

    @property
    def commitlog_offset(self) -> int:
        return int(self._head(_COMMITLOG_OFFSET))

    @property
    def store_size(self) -> int:
        return self.layout.record_end - self._pos

    @property
    def flag(self) -> int:
        return int(self._head(_FLAG))

    @property
    def sys_flag(self) -> int:
        return int(self._head(_SYS_FLAG))

    @property
    def body_crc(self) -> int:
        return int(self._head(_CRC))

    @property
    def born_timestamp(self) -> int:
        return int(self._head(_BORN_TS))

    @property
    def store_timestamp(self) -> int:
        return int(self._head(_STORE_TS))

    @property
    def reconsume_times(self) -> int:
        return int(self._head(_RECONSUME))

    @property
    def body(self) -> bytes:
        """The body as a consumer gets it: CRC-checked, inflated when the store would inflate it."""
        body = self._body
        if body is None:
            layout = self.layout
            body = checked_body(self._data, layout)
            sys_flag = layout.head[_SYS_FLAG]
            if sys_flag & COMPRESSED_FLAG:
                body = consumer_body(body, sys_flag)[0]
            self._body = body
        return body

    @property
    def topic(self) -> str:
        return record_topic(self._data, self.layout)

    @property
    def properties(self) -> dict[str, str]:
        properties = self._properties
        if properties is None:
            properties = self._properties = record_properties(self._data, self.layout)
        return properties

    @property
    def tags(self) -> str:
        return self.properties.get(PROPERTY_TAGS, "")

    @property
    def keys(self) -> tuple[str, ...]:
        keys = self.properties.get(PROPERTY_KEYS)
        return tuple(keys.split()) if keys else ()

    @property
    def uniq_key(self) -> str:
        return self.properties.get(PROPERTY_UNIQ_KEY, "")

    @property
    def msg_id(self) -> str:
        return self.message().msg_id

    @property
    def raw(self) -> bytes:
        """The record's bytes as stored."""
        return self._data[self._pos:self.layout.record_end]

    def message(self) -> Message:
        """Every field, decoded: the Message ``decode_records`` gives for this record."""
        message = self._message
        if message is None:
            message = self._message = layout_message(self._data, self.layout, self._queue_id)
        return message


class PulledRecords(Sequence[RecordView]):
    """The records of a raw pull answer (``PullMessageResponse.records``), found once and decoded lazily.

    Finding them reads each record's TOTALSIZE only; bytes that do not split into records of at least
    the smallest record's size raise DataLossError here, anything else when the field is read.
    ``queue_id``: the queue id the pull named (None keeps each record's), as for ``decode_records``."""

    __slots__ = ("_data", "_starts", "_queue_id")

    def __init__(self, data: bytes, queue_id: int | None = None) -> None:
        if type(data) is not bytes:
            data = bytes(data)
        self._data = data
        self._queue_id = queue_id
        starts: list[int] = []
        append, size_at, end, pos = starts.append, _TOTAL_SIZE.unpack_from, len(data), 0
        while pos < end:
            size = size_at(data, pos)[0] if end - pos >= _MIN_RECORD else 0
            if size < _MIN_RECORD or size > end - pos:
                record_layout(data, pos, end)  # raises what decode_records raises for these bytes
                raise _malformed(pos, f"total size {size}, {end - pos} bytes left")
            append(pos)
            pos += size
        self._starts = starts

    def __len__(self) -> int:
        return len(self._starts)

    @overload
    def __getitem__(self, index: int) -> RecordView: ...

    @overload
    def __getitem__(self, index: slice) -> list[RecordView]: ...

    def __getitem__(self, index: int | slice) -> RecordView | list[RecordView]:
        if isinstance(index, slice):
            return [self._view(i) for i in range(*index.indices(len(self._starts)))]
        return self._view(range(len(self._starts))[index])

    def __iter__(self) -> Iterator[RecordView]:
        data, queue_id, starts = self._data, self._queue_id, self._starts
        ends = [*starts[1:], len(data)] if starts else []
        for pos, end in zip(starts, ends, strict=True):
            yield RecordView(data, pos, end, queue_id)

    def _view(self, index: int) -> RecordView:
        starts = self._starts
        end = starts[index + 1] if index + 1 < len(starts) else len(self._data)
        return RecordView(self._data, starts[index], end, self._queue_id)

    @property
    def data(self) -> bytes:
        """The answer's bytes, as received."""
        return self._data

    def messages(self) -> list[Message]:
        """Every record decoded: what ``decode_records`` returns for the same bytes."""
        return [view.message() for view in self]

    # -- columns ---------------------------------------------------------------------------------------
    def _column(self, index: int) -> array[int]:
        return array("q", [view.layout.head[index] for view in self])

    def queue_offsets(self) -> array[int]:
        return self._column(_QUEUE_OFFSET)

    def commitlog_offsets(self) -> array[int]:
        return self._column(_COMMITLOG_OFFSET)

    def store_timestamps(self) -> array[int]:
        return self._column(_STORE_TS)

    def born_timestamps(self) -> array[int]:
        return self._column(_BORN_TS)

    def bodies(self) -> list[memoryview]:
        """Every body, CRC-checked: views of the received bytes (an inflated body: of its own bytes)."""
        data = memoryview(self._data)
        bodies: list[memoryview] = []
        for view in self:
            layout = view.layout
            sys_flag = layout.head[_SYS_FLAG]
            if sys_flag & COMPRESSED_FLAG:
                bodies.append(memoryview(view.body))
                continue
            checked_body(self._data, layout)
            bodies.append(data[layout.body_start:layout.body_end])
        return bodies
