"""Stored records as a raw pull returns them, decoded into :class:`~mqstore.client.models.Message`.

A pull with ``raw_records`` (the default of the consumers) answers with the commitlog's records as
they are on disk, concatenated (RocketMQ's zero-copy pull): the store skips building one protobuf
message per record and the client decodes here, with :mod:`struct`, what the store would have
decoded. The result equals what a decoded pull gives (``Message.from_proto``), field for field:
bodies the producer compressed (SYSFLAG 0x1, zlib) are inflated by the store's own rule
(:mod:`mqstore.client.compression`; a body it does not inflate keeps its bytes and flag), and the
body CRC is checked again, so bytes damaged after the store's own check are refused, not delivered.

The layout (RocketMQ's v1 record, big-endian; a RocketMQ 5 store's v2 record differs only in a
2-byte TOPICLENGTH)::

    0  TOTALSIZE 4        28 PHYSICALOFFSET 8     64 STOREHOSTADDRESS 8 (20 if sysFlag & 0x20)
    4  MAGICCODE 4        36 SYSFLAG 4            72 RECONSUMETIMES 4
    8  BODYCRC 4          40 BORNTIMESTAMP 8      76 PREPARED TRANSACTION OFFSET 8
    12 QUEUEID 4          48 BORNHOST 8 (20 if    84 BODYLENGTH 4, body
    16 FLAG 4                sysFlag & 0x10)         TOPICLENGTH 1 (v2: 2), topic
    20 QUEUEOFFSET 8      56 STORETIMESTAMP 8        PROPERTIESLENGTH 2, properties

(offsets after BORNHOST shift by 12 for every IPv6 host). This module is the client's own copy of
the format: the client imports no server code.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import struct
import zlib
from collections.abc import Callable
from typing import Any, NamedTuple

from mqstore.client.compression import COMPRESSED_FLAG, consumer_body
from mqstore.client.errors import DataLossError
from mqstore.client.models import PROPERTY_KEYS, PROPERTY_TAGS, PROPERTY_UNIQ_KEY, Message

MESSAGE_MAGIC_CODE = 0xDAA320A7
MESSAGE_MAGIC_CODE_V2 = 0xDAA320AB
BORNHOST_V6_FLAG = 0x10
STOREHOSTADDRESS_V6_FLAG = 0x20
NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"
SYSFLAG_POS = 36
_V6_BITS = BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG
_CRC_MASK = 0x7FFFFFFF
# TOTALSIZE .. BODYLENGTH, keyed by the sysflag's IPv6 bits (its lowest byte is at SYSFLAG_POS + 3).
_HEADS = {bits: struct.Struct(f">iIiiiqqiq{20 if bits & BORNHOST_V6_FLAG else 8}sq"
                              f"{20 if bits & STOREHOSTADDRESS_V6_FLAG else 8}siqi")
          for bits in (0, BORNHOST_V6_FLAG, STOREHOSTADDRESS_V6_FLAG, _V6_BITS)}
_SYSFLAG_LOW_BYTE = SYSFLAG_POS + 3
_MIN_RECORD = _HEADS[0].size + 1 + 2
# Hosts and topics repeat from record to record: decoded once each (bounded, reset when full).
_MAX_CACHED = 4096
_hosts: dict[bytes, str] = {}
_id_prefixes: dict[bytes, str] = {}
_topics: dict[bytes, str] = {}


def decode_records(data: bytes, queue_id: int | None = None) -> list[Message]:
    """Every record of a raw pull answer, in order. ``queue_id``: the queue id the pull named (a
    record holds its shard's queue id, which the gateway's route may number differently); None keeps
    the record's. Raises DataLossError for bytes that are not whole records or a body that does not
    match its CRC. :class:`~mqstore.client.record_view.PulledRecords` reads the same bytes lazily."""
    messages: list[Message] = []
    append = messages.append
    end = len(data)
    pos = 0
    while pos < end:
        layout = record_layout(data, pos, end)
        append(layout_message(data, layout, queue_id))
        pos = layout.record_end
    return messages


class Layout(NamedTuple):
    """Where one record's fields are: its fixed fields (``head``, :data:`_HEADS`' order) and the
    boundaries of its body, topic and properties, as absolute positions in the answer."""

    head: tuple[Any, ...]
    pos: int
    body_start: int
    body_end: int
    topic_start: int
    topic_end: int
    properties_start: int
    record_end: int


# Layout(...) runs a generated Python __new__; a pull answer builds up to 1024 of them.
_new_layout: Callable[[type[Layout], tuple[Any, ...]], Layout] = tuple.__new__


def record_layout(data: bytes, pos: int, end: int) -> Layout:
    """The record at ``pos``, checked to be whole: its sizes add up within ``end`` and its magic is a
    message's (the body CRC and the text's UTF-8 are checked when those fields are decoded)."""
    if end - pos < _MIN_RECORD:
        raise DataLossError("DATA_LOSS", f"raw records at byte {pos}: {end - pos} bytes left, too few for a record")
    head_struct = _HEADS[data[pos + _SYSFLAG_LOW_BYTE] & _V6_BITS]
    try:
        head = head_struct.unpack_from(data, pos)
    except struct.error:
        raise _malformed(pos, f"{end - pos} bytes left, too few for the fixed fields") from None
    size, magic, body_length = head[0], head[1], head[14]
    record_end = pos + size
    body_start = pos + head_struct.size
    body_end = body_start + body_length
    if size < _MIN_RECORD or record_end > end or body_length < 0 or body_end >= record_end:
        raise _malformed(pos, f"total size {size}, body length {body_length}, {end - pos} bytes left")
    if magic == MESSAGE_MAGIC_CODE:
        topic_start = body_end + 1
        topic_end = topic_start + data[body_end]
    elif magic == MESSAGE_MAGIC_CODE_V2:
        topic_start = body_end + 2
        topic_end = topic_start + ((data[body_end] << 8) | data[body_end + 1])
    else:
        raise _malformed(pos, f"magic code {magic:#x} is not a message's")
    properties_start = topic_end + 2
    if properties_start > record_end:
        raise _malformed(pos, "the topic runs past the record's end")
    properties_length = (data[topic_end] << 8) | data[topic_end + 1]
    if properties_start + properties_length != record_end:
        raise _malformed(pos, f"fields add up to {properties_start + properties_length - pos} bytes, "
                              f"total size says {size}")
    return _new_layout(Layout, (head, pos, body_start, body_end, topic_start, topic_end, properties_start,
                                record_end))


def checked_body(data: bytes, layout: Layout) -> bytes:
    """The record's body as stored, after its CRC check (DataLossError when it does not match)."""
    body = data[layout.body_start:layout.body_end]
    crc = layout.head[2]
    if zlib.crc32(body) & _CRC_MASK != crc:
        raise DataLossError("DATA_LOSS", f"the record at commitlog offset {layout.head[6]} (queue offset "
                                         f"{layout.head[5]}): its body does not match its CRC {crc}")
    return body


def record_topic(data: bytes, layout: Layout) -> str:
    raw_topic = data[layout.topic_start:layout.topic_end]
    try:
        return _topics.get(raw_topic) or _topic(raw_topic)
    except UnicodeDecodeError as exc:
        raise _malformed(layout.pos, f"topic or properties are not UTF-8 ({exc})") from None


def record_properties(data: bytes, layout: Layout) -> dict[str, str]:
    if layout.properties_start == layout.record_end:
        return {}
    try:
        return _properties(data[layout.properties_start:layout.record_end].decode())
    except UnicodeDecodeError as exc:
        raise _malformed(layout.pos, f"topic or properties are not UTF-8 ({exc})") from None


def layout_message(data: bytes, layout: Layout, queue_id: int | None) -> Message:
    """The record as :class:`Message` (what a decoded pull gives for it)."""
    head, _, body_start, body_end, topic_start, topic_end, properties_start, record_end = layout
    (size, _, crc, record_queue_id, flag, queue_offset, commitlog_offset, sys_flag, born_timestamp,
     born_raw, store_timestamp, store_raw, reconsume_times, _, _) = head
    # checked_body, record_topic and record_properties inlined: this runs once per pulled message.
    body = data[body_start:body_end]
    if zlib.crc32(body) & _CRC_MASK != crc:
        checked_body(data, layout)  # raises its error
    topic = _topics.get(data[topic_start:topic_end]) or record_topic(data, layout)
    properties = record_properties(data, layout) if properties_start != record_end else {}
    compressed = False
    if sys_flag & COMPRESSED_FLAG:
        body, compressed = consumer_body(body, sys_flag)
    uniq_key = properties.get(PROPERTY_UNIQ_KEY, "")
    offset_msg_id = _offset_msg_id(store_raw, commitlog_offset)
    keys = properties.get(PROPERTY_KEYS)
    return _message(
        topic, record_queue_id if queue_id is None else queue_id, queue_offset, uniq_key or offset_msg_id,
        offset_msg_id, uniq_key, properties.get(PROPERTY_TAGS, ""), tuple(keys.split()) if keys else (),
        properties, body, born_timestamp, _hosts.get(born_raw) or _host(born_raw), store_timestamp,
        _hosts.get(store_raw) or _host(store_raw), commitlog_offset, reconsume_times, flag, sys_flag, crc, size,
        compressed)


def _slot_constructor() -> Callable[..., Message]:
    """``Message(*fields)`` without the frozen dataclass's ``__init__``, which sets each of its 21
    fields through ``object.__setattr__``: the slots' own descriptors set them in half the time (a
    pull decodes up to 1024 messages). Every field is given, in declaration order."""
    names = [f.name for f in dataclasses.fields(Message)]
    scope: dict[str, Any] = {"new": object.__new__, "Message": Message}
    scope.update({f"set_{name}": getattr(Message, name).__set__ for name in names})
    lines = [f"def build({', '.join(names)}):", "    m = new(Message)"]
    lines += [f"    set_{name}(m, {name})" for name in names]
    lines.append("    return m")
    exec("\n".join(lines), scope)  # noqa: S102 - code built from the dataclass's own field names
    built: Callable[..., Message] = scope["build"]
    return built


_message = _slot_constructor()


def _malformed(pos: int, what: str) -> DataLossError:
    return DataLossError("DATA_LOSS", f"raw records at byte {pos}: not a whole record ({what})")


def _properties(text: str) -> dict[str, str]:
    """RocketMQ's string2messageProperties (4.9.x), as the store parses them: an item splits at its first
    name/value separator; items with an empty name or value are dropped."""
    properties: dict[str, str] = {}
    for item in text.split(PROPERTY_SEPARATOR):
        name, _, value = item.partition(NAME_VALUE_SEPARATOR)
        if name and value:
            properties[name] = value
    return properties


def _topic(raw: bytes) -> str:
    if len(_topics) >= _MAX_CACHED:
        _topics.clear()
    topic = _topics[raw] = raw.decode()
    return topic


def _host(raw: bytes) -> str:
    """``ip:port``, ``[ipv6]:port`` for an IPv6 host: 4 or 16 address bytes, then a 4-byte port."""
    ip = ipaddress.ip_address(raw[:-4])
    port = int.from_bytes(raw[-4:], "big", signed=True)
    name = f"{ip}:{port}" if ip.version == 4 else f"[{ip}]:{port}"
    if len(_hosts) >= _MAX_CACHED:
        _hosts.clear()
    _hosts[raw] = name
    return name


def _offset_msg_id(store_raw: bytes, commitlog_offset: int) -> str:
    """The offset message id: store host bytes, then the commitlog offset, upper-case hex."""
    prefix = _id_prefixes.get(store_raw)
    if prefix is None:
        if len(_id_prefixes) >= _MAX_CACHED:
            _id_prefixes.clear()
        prefix = _id_prefixes[store_raw] = store_raw.hex().upper()
    return f"{prefix}{commitlog_offset & 0xFFFF_FFFF_FFFF_FFFF:016X}"
