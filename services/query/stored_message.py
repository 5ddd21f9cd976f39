"""A record read back from the commitlog, checked and made ready for a consumer.

Assert on both sides: the writer checked the record before it went to disk; here the bytes must be
a whole record that starts where the ConsumeQueue unit (or message id) says, with the body CRC the
writer stored. Bodies the producer compressed (sysflag 0x1) are inflated as the RocketMQ consumer
does, by the one rule every reader follows (``mqstore.client.compression``: whole zlib streams, with a
bound so a hostile body cannot inflate without limit); any other body flagged compressed is handed
over as stored with ``body_compressed``, never as an empty or partial body.

A pull decodes up to 1024 records, so the common layout (IPv4 hosts, v1 magic) takes a fast path:
one struct unpack for the 88 fixed bytes and cached host strings. Any other record goes through
:func:`services.store.formats.record.decode_record`; both paths give the same result (the fixture tests
compare every field of 3000 RocketMQ records).
"""

from __future__ import annotations

import itertools
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mqstore.client.compression import consumer_body
from services.query.errors import DataLossError
from services.store.formats.message import (
    BORNHOST_V6_FLAG,
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    STOREHOSTADDRESS_V6_FLAG,
    MessageRecord,
    string_to_properties,
)
from services.store.formats.record import (
    BORNHOST_POS,
    IPV4_HOST_LENGTH,
    MESSAGE_MAGIC_CODE,
    MESSAGE_MAGIC_CODE_V2,
    Buffer,
    RecordError,
    decode_record,
    host_lengths,
    read_size_and_magic,
)
from services.store.formats.socket_address import decode_address

MESSAGE_MAGIC_CODES = (MESSAGE_MAGIC_CODE, MESSAGE_MAGIC_CODE_V2)
# TOTALSIZE .. BODYLENGTH of a record with IPv4 born and store hosts (the layout in record.py).
_IPV4_HEAD = struct.Struct(f">iIiiiqqiq{IPV4_HOST_LENGTH}sq{IPV4_HOST_LENGTH}siqi")
_V6_BITS = BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG
_I16 = struct.Struct(">h")
_CRC_MASK = 0x7FFFFFFF
# Distinct hosts seen (producers and this store): bounded, reset when full.
_MAX_CACHED_HOSTS = 4096
_host_names: dict[bytes, str] = {}
_host_hex: dict[bytes, str] = {}


@dataclass(slots=True)
class StoredMessage:
    """Every field of the stored record, with ``body`` as the consumer sees it (inflated unless
    ``body_compressed``) and ``body_crc`` as stored (over the stored body)."""

    topic: str
    queue_id: int
    queue_offset: int
    commitlog_offset: int
    msg_id: str
    properties: dict[str, str]
    born_timestamp: int
    born_host: str
    store_timestamp: int
    store_host: str
    reconsume_times: int
    sys_flag: int
    flag: int
    body: bytes
    body_crc: int
    store_size: int
    prepared_transaction_offset: int
    body_compressed: bool

    @property
    def tags(self) -> str | None:
        return self.properties.get(PROPERTY_TAGS)

    @property
    def keys(self) -> str | None:
        return self.properties.get(PROPERTY_KEYS)

    @property
    def uniq_key(self) -> str | None:
        return self.properties.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX)


def record_size_at(data: bytes) -> int | None:
    """TOTALSIZE of the record ``data`` starts with, or None if it does not start with a message."""
    if len(data) < 8:
        return None
    size, magic = read_size_and_magic(data, 0)
    return size if magic in MESSAGE_MAGIC_CODES and size > 0 else None


def stored_message(data: bytes, commitlog_offset: int) -> StoredMessage:
    """Decode and check the record ``data`` holds, which must have been read at ``commitlog_offset``.
    Raises DataLossError when it is not that whole record or its body does not match its CRC."""
    if len(data) >= _IPV4_HEAD.size:
        head = _IPV4_HEAD.unpack_from(data)
        if head[1] == MESSAGE_MAGIC_CODE and not head[7] & _V6_BITS:
            return _fast(data, commitlog_offset, head)
    return _general(data, commitlog_offset)


def _fast(data: bytes, commitlog_offset: int, head: tuple[Any, ...]) -> StoredMessage:
    (size, _, crc, queue_id, flag, queue_offset, physical_offset, sys_flag, born_timestamp, born_raw,
     store_timestamp, store_raw, reconsume_times, prepared, body_length) = head
    _check_place(size, len(data), physical_offset, commitlog_offset)
    p = _IPV4_HEAD.size + body_length
    try:
        if body_length < 0 or p >= size:
            raise ValueError(f"body length {body_length}")
        body = data[_IPV4_HEAD.size:p]
        topic_end = p + 1 + data[p]
        topic = data[p + 1:topic_end].decode()
        properties_length = _I16.unpack_from(data, topic_end)[0]
        properties_end = topic_end + 2 + properties_length
        properties = data[topic_end + 2:properties_end].decode() if properties_length > 0 else ""
    except (ValueError, IndexError, struct.error) as exc:  # UnicodeDecodeError is a ValueError
        raise DataLossError(f"commitlog offset {commitlog_offset}: malformed record ({exc})") from None
    if properties_length < 0 or properties_end != size:
        raise DataLossError(f"commitlog offset {commitlog_offset}: fields add up to {properties_end} bytes, "
                            f"total size says {size}")
    _check_crc(body, crc, commitlog_offset)
    body_out, compressed = consumer_body(body, sys_flag)
    return StoredMessage(topic, queue_id, queue_offset, commitlog_offset, _msg_id(store_raw, commitlog_offset),
                         string_to_properties(properties) if properties else {}, born_timestamp, _host(born_raw),
                         store_timestamp, _host(store_raw), reconsume_times, sys_flag, flag, body_out, crc,
                         size, prepared, compressed)


def _general(data: bytes, commitlog_offset: int) -> StoredMessage:
    try:
        record: MessageRecord = decode_record(data)
    except RecordError as exc:
        raise DataLossError(f"commitlog offset {commitlog_offset}: not a whole record ({exc})") from None
    _check_place(record.store_size, len(data), record.commitlog_offset, commitlog_offset)
    _check_crc(record.body, record.body_crc, commitlog_offset)
    born_length, store_length = host_lengths(record.sys_flag)
    host_pos = BORNHOST_POS + born_length + 8
    body, compressed = consumer_body(record.body, record.sys_flag)
    return StoredMessage(record.topic, record.queue_id, record.queue_offset, commitlog_offset,
                         _msg_id(bytes(data[host_pos:host_pos + store_length]), commitlog_offset),
                         record.properties, record.born_timestamp, record.born_host, record.store_timestamp,
                         record.store_host, record.reconsume_times, record.sys_flag, record.flag, body, record.body_crc,
                         record.store_size, record.prepared_transaction_offset, compressed)


# The fields a raw pull checks, IPv4 v1 layout: TOTALSIZE, MAGICCODE, BODYCRC, QUEUEID, (FLAG), QUEUEOFFSET,
# PHYSICALOFFSET, SYSFLAG, (BORNTIMESTAMP .. PREPARED TRANSACTION OFFSET), BODYLENGTH: no host bytes copied.
_RAW_CHECK = struct.Struct(">iIii4xqqi44xi")
_NO_TAGS = ""
# A body shorter than this is copied for its CRC (cheaper than a memoryview); a longer one is not.
_COPY_BELOW = 64 * 1024


def checked_raw(data: Buffer, commitlog_offset: int, topic: bytes, queue_id: int, queue_offset: int,
                with_tags: bool) -> str | None:
    """The cheap check of a raw pull: ``data`` is the whole v1 IPv4-host record of (``topic``,
    ``queue_id``, ``queue_offset``) written at ``commitlog_offset``, its fields add up, its topic and
    properties are UTF-8 and its body matches its CRC - everything :func:`stored_message` and the unit
    check accept, without building a message. Returns the record's TAGS when ``with_tags`` ("" when it
    has none: a subscription never names an empty tag), else "" without decoding the properties. None
    when the record is not that common layout or fails a check: the caller then takes the decoding
    path, which accepts it or raises the precise error, so both modes fail alike."""
    if type(data) is not bytes:
        data = bytes(data)
    try:
        size, magic, crc, record_queue_id, record_queue_offset, physical_offset, sys_flag, body_length = \
            _RAW_CHECK.unpack_from(data)
    except struct.error:
        return None
    p = _RAW_CHECK.size + body_length
    topic_end = p + 1 + len(topic)
    if (magic != MESSAGE_MAGIC_CODE or sys_flag & _V6_BITS or size != len(data) or physical_offset != commitlog_offset
            or record_queue_id != queue_id or record_queue_offset != queue_offset or body_length < 0
            or topic_end + 2 > size or data[p] != len(topic) or not data.startswith(topic, p + 1)
            or data[topic_end] & 0x80 or topic_end + 2 + ((data[topic_end] << 8) | data[topic_end + 1]) != size):
        return None
    body = data[_RAW_CHECK.size:p] if body_length < _COPY_BELOW else memoryview(data)[_RAW_CHECK.size:p]
    if zlib.crc32(body) & _CRC_MASK != crc:
        return None
    properties = data[topic_end + 2:]
    if not with_tags and properties.isascii():
        return _NO_TAGS
    try:
        text = properties.decode()
    except UnicodeDecodeError:
        return None
    if not with_tags:
        return _NO_TAGS
    return string_to_properties(text).get(PROPERTY_TAGS, _NO_TAGS) if text else _NO_TAGS


def _check_place(size: int, available: int, physical_offset: int, commitlog_offset: int) -> None:
    if size != available:
        raise DataLossError(f"commitlog offset {commitlog_offset}: the record there is {size} bytes, "
                            f"{available} were expected")
    if physical_offset != commitlog_offset:
        raise DataLossError(f"commitlog offset {commitlog_offset}: the record there says it was written at "
                            f"{physical_offset}")


def _check_crc(body: bytes, stored_crc: int, commitlog_offset: int) -> None:
    actual = zlib.crc32(body) & _CRC_MASK
    if actual != stored_crc:
        raise DataLossError(f"commitlog offset {commitlog_offset}: body CRC {actual} does not match the stored "
                            f"{stored_crc}")


def _host(raw: bytes) -> str:
    name = _host_names.get(raw)
    if name is None:
        if len(_host_names) >= _MAX_CACHED_HOSTS:
            _host_names.clear()
        name = _host_names[raw] = decode_address(raw)
    return name


def _msg_id(store_raw: bytes, commitlog_offset: int) -> str:
    """The offset message id: store host then commitlog offset, upper-case hex (message_id.py's form)."""
    prefix = _host_hex.get(store_raw)
    if prefix is None:
        if len(_host_hex) >= _MAX_CACHED_HOSTS:
            _host_hex.clear()
        prefix = _host_hex[store_raw] = store_raw.hex().upper()
    return f"{prefix}{commitlog_offset & 0xFFFF_FFFF_FFFF_FFFF:016X}"


def unit_table(units: Sequence[tuple[int, int, int, int]]) -> Any:
    """ConsumeQueue units (queue offset, commitlog offset, size, tags code) as an n x 4 int64 array:
    :func:`numpy.fromiter` over the flattened tuples, five times faster than ``np.array(units)``."""
    return np.fromiter(itertools.chain.from_iterable(units), np.int64, count=4 * len(units)).reshape(-1, 4)


def checked_run(run: bytes, table: Any, topic: bytes, queue_id: int) -> bool:
    """:func:`checked_raw` (without tags) for the records of ``table`` (:func:`unit_table` rows) when
    they lie back to back in ``run``, which starts at the first one's commitlog offset: the fixed
    fields of all of them are compared at once (numpy gathers each field's bytes from every record),
    then each body's CRC and each properties' ASCII are checked in one tight loop of C calls. False
    when the units are not contiguous, or any record is not the common layout or fails a check: the
    caller then checks record by record, which finds the first bad one and says what is wrong with it."""
    if not len(table):
        return False
    queue_offsets, commitlog_offsets, size = table[:, 0], table[:, 1], table[:, 2]
    at = commitlog_offsets - commitlog_offsets[0]
    end = at + size
    if int(size.min()) < _RAW_CHECK.size + 3 + len(topic) or int(end[-1]) != len(run) or \
            not bool((at[1:] == end[:-1]).all()):
        return False
    u8 = np.frombuffer(run, np.uint8)

    def field(position: int, width: int, kind: str) -> Any:
        return u8[(at + position)[:, None] + np.arange(width)].view(kind).ravel()

    body_length = field(84, 4, ">i4").astype(np.int64)
    topic_end = at + _RAW_CHECK.size + body_length + 1 + len(topic)
    if not (bool((field(0, 4, ">i4") == size).all())
            and bool((field(4, 4, ">u4") == MESSAGE_MAGIC_CODE).all())
            and bool((field(12, 4, ">i4") == queue_id).all())
            and bool((field(20, 8, ">i8") == queue_offsets).all())
            and bool((field(28, 8, ">i8") == commitlog_offsets).all())
            and not bool((field(36, 4, ">i4") & _V6_BITS).any())
            and bool((body_length >= 0).all()) and bool((topic_end + 2 <= end).all())):
        return False
    topic_length_at = topic_end - len(topic) - 1
    if not bool((u8[topic_length_at] == len(topic)).all()) or \
            not bool((u8[topic_length_at[:, None] + 1 + np.arange(len(topic))] ==
                      np.frombuffer(topic, np.uint8)).all()):
        return False
    properties_length = (u8[topic_end].astype(np.int64) << 8) | u8[topic_end + 1]
    if bool((u8[topic_end] & 0x80).any()) or not bool((topic_end + 2 + properties_length == end).all()):
        return False
    view, crc32, mask = memoryview(run), zlib.crc32, _CRC_MASK
    body_start = (at + _RAW_CHECK.size).tolist()
    for start, stop, crc, properties_start, record_end in zip(
            body_start, (at + _RAW_CHECK.size + body_length).tolist(), field(8, 4, ">i4").tolist(),
            (topic_end + 2).tolist(), end.tolist(), strict=True):
        if crc32(view[start:stop]) & mask != crc or not run[properties_start:record_end].isascii():
            return False
    return True
