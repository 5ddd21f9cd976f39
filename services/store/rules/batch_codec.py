"""RocketMQ's batch encoding (MessageDecoder.encodeMessages): many messages as one bytes blob.

A batch travels from producer to commitlog as these bytes instead of one protobuf object per message:
the gateway checks the blob in one pass (:func:`scan_blob`) and forwards it untouched, and only the
commitlog builds messages from it (:func:`decode_blob`). Per entry, big-endian::

    int32 total size | int32 magic (0) | int32 body CRC (0) | int32 flag | int32 body length | body
    | int16 properties length | properties (UTF-8, name \\x01 value pairs separated by \\x02)

Only flag, body and properties are per message; topic, queue, born time and host and sys_flag are the
request's, as in RocketMQ's batch send. Every entry is checked against the rules of a message of a
batch in either form (:func:`services.store.rules.producer_message.check_batch_entry`: no transactional
message, a compressed body that inflates, ...) with its index, so an error names "message #i" and nothing
of the batch is stored. The rules on properties are the engine's: no empty names or values, no
separator inside a name or value (on the blob: exactly one \\x01 per pair), at most 32,767 bytes.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

#: The most messages one batch carries (a SendBatch, an AppendBatch, a RocketMQ 5 receive), from the API.
from mqstore.client.limits import MAX_BATCH_MESSAGES as MAX_BATCH_MESSAGES
from services.store.errors import InvalidArgumentError
from services.store.formats.message import (
    COMPRESSED_FLAG,
    NAME_VALUE_SEPARATOR,
    PROPERTY_SEPARATOR,
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    Message,
)
from services.store.rules.producer_message import check_batch_entry

HEAD = struct.Struct(">iiiii")  # total size, magic, body CRC, flag, body length
PROPERTIES_LENGTH = struct.Struct(">h")
#: An entry without body and properties.
ENTRY_OVERHEAD = HEAD.size + PROPERTIES_LENGTH.size
#: The int16 properties length.
MAX_PROPERTIES_BYTES = 32767
_PAIR = NAME_VALUE_SEPARATOR.encode()
_ITEM = PROPERTY_SEPARATOR.encode()
_UNIQ = _ITEM + PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX.encode() + _PAIR
_UNIQ_NAME = _UNIQ[1:]
#: The fast passes leave an entry with this property to the precise ones, which apply check_batch_entry
#: (and a compressed batch, whose bodies must inflate).
_TRANSACTIONAL_NAME = PROPERTY_TRANSACTION_PREPARED.encode() + _PAIR
#: Well-formed properties: name \x01 value pairs separated by \x02 (a trailing \x02 allowed), every name
#: and value non-empty and free of both separators.
_PROPERTIES = re.compile(rb"[^\x01\x02]+\x01[^\x01\x02]+(?:\x02[^\x01\x02]+\x01[^\x01\x02]+)*\x02?")
#: The same, in ASCII (the usual case: no UTF-8 check needed).
_ASCII_PART = rb"[\x00\x03-\x7f]+"
_ASCII_PROPERTIES = re.compile(_ASCII_PART + rb"\x01" + _ASCII_PART + rb"(?:\x02" + _ASCII_PART + rb"\x01" + _ASCII_PART
                               + rb")*\x02?")
#: A UNIQ_KEY as RocketMQ clients make it: 32 or 56 hex digits (the property value, up to its end).
_UNIQ_VALUE = re.compile(rb"(?:[0-9A-Fa-f]{56}|[0-9A-Fa-f]{32})(?:\x02|\Z)")
_UNIQ_VALUE_TEXT = re.compile(r"[0-9A-Fa-f]{56}|[0-9A-Fa-f]{32}")


def properties_bytes(properties: Mapping[str, str]) -> bytes:
    """messageProperties2String as UTF-8 (no trailing separator, as RocketMQ 4.9.8 stores them)."""
    return PROPERTY_SEPARATOR.join([f"{k}{NAME_VALUE_SEPARATOR}{v}" for k, v in properties.items()]).encode()


def encode_entry(body: bytes, flag: int = 0, properties: bytes = b"") -> bytes:
    """One entry of a blob; ``properties`` already encoded (:func:`properties_bytes`)."""
    size = ENTRY_OVERHEAD + len(body) + len(properties)
    return b"".join((HEAD.pack(size, 0, 0, flag, len(body)), body, PROPERTIES_LENGTH.pack(len(properties)),
                     properties))


def encode_blob(messages: Iterable[tuple[bytes, int, Mapping[str, str]]]) -> bytes:
    """``(body, flag, properties)`` per message."""
    return b"".join([encode_entry(body, flag, properties_bytes(props)) for body, flag, props in messages])


@dataclass(slots=True)
class BlobEntry:
    """Where one entry's parts are in the blob (the gateway's view: nothing is copied)."""

    index: int
    start: int
    end: int
    properties_start: int
    #: The UNIQ_KEY the producer gave, or "" (the gateway adds one).
    uniq_key: str


def _fail(index: int, detail: str) -> InvalidArgumentError:
    return InvalidArgumentError.of_message(index, detail)


def _check_properties(props: bytes, index: int) -> str:
    """The entry's properties checked as the engine would check its dict; returns its UNIQ_KEY or ""."""
    if not props:
        return ""
    if props.endswith(_ITEM):  # RocketMQ 4.9 clients before 4.9.8 end every pair with \x02
        props = props[:-1]
    pairs = props.count(_ITEM) + 1
    if props.count(_PAIR) != pairs or props[:1] in (_ITEM, _PAIR) or props.endswith(_PAIR) or \
            _ITEM + _ITEM in props or _PAIR + _ITEM in props or _ITEM + _PAIR in props or _PAIR + _PAIR in props:
        raise _fail(index, "properties must be name \\x01 value pairs separated by \\x02, with names and values "
                           "non-empty and free of \\x01 and \\x02")
    try:
        props.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _fail(index, f"properties are not UTF-8 ({exc.reason} at byte {exc.start})") from None
    at = (_ITEM + props).find(_UNIQ)
    if at < 0:
        return ""
    begin = at + len(_UNIQ) - 1
    end = props.find(_ITEM, begin)
    if (_ITEM + props).find(_UNIQ, at + 1) >= 0:
        raise _fail(index, "the UNIQ_KEY property appears twice: give it once")
    return props[begin:end if end >= 0 else len(props)].decode("ascii", "replace")


def _frame(blob: bytes, pos: int, index: int) -> tuple[int, int, int, int]:
    """Entry ``index`` at ``pos``: (its end, flag, body start, properties start), its framing checked."""
    size = len(blob)
    if size - pos < ENTRY_OVERHEAD:
        raise _fail(index, f"the blob ends {size - pos} bytes into this entry, shorter than an entry's "
                           f"{ENTRY_OVERHEAD}-byte frame: the blob is truncated")
    total, _magic, _crc, flag, body_length = HEAD.unpack_from(blob, pos)
    end = pos + total
    if total < ENTRY_OVERHEAD or end > size:
        raise _fail(index, f"total size {total} at blob byte {pos} must be at least {ENTRY_OVERHEAD} and "
                           f"within the blob's {size} bytes (is the blob truncated?)")
    body_at = pos + HEAD.size
    props_at = body_at + body_length
    if body_length < 0 or props_at + PROPERTIES_LENGTH.size > end:
        raise _fail(index, f"body length {body_length} does not fit the entry's total size {total}")
    if body_length == 0:
        raise _fail(index, "the message body is empty: give a body of at least one byte")
    (props_length,) = PROPERTIES_LENGTH.unpack_from(blob, props_at)
    props_start = props_at + PROPERTIES_LENGTH.size
    if props_length < 0 or props_start + props_length != end:
        raise _fail(index, f"properties length {props_length} and body length {body_length} do not add up to "
                           f"the entry's total size {total} (total = {ENTRY_OVERHEAD} + body + properties, "
                           f"properties at most {MAX_PROPERTIES_BYTES} bytes)")
    return end, flag, body_at, props_start


def _too_many(max_messages: int) -> InvalidArgumentError:
    return InvalidArgumentError(f"the batch has more than {max_messages} messages, the limit: split it")


def _properties_of(props: bytes) -> dict[str, str]:
    """Properties :func:`_check_properties` accepted, as a dict (a repeated name: its last value, as
    RocketMQ's string2messageProperties reads it; the commitlog refuses repeats)."""
    if not props:
        return {}
    items = props.decode("utf-8").split(PROPERTY_SEPARATOR)
    if not items[-1]:
        items.pop()
    return {name: value for name, _, value in (item.partition(NAME_VALUE_SEPARATOR) for item in items)}


def _scan_precise(blob: bytes, max_messages: int, sys_flag: int = 0) -> list[BlobEntry]:
    """Every entry checked step by step: the rules' definition, and the error naming the first bad
    entry precisely (:func:`scan_blob` falls back to it on anything unusual)."""
    entries: list[BlobEntry] = []
    pos = index = 0
    size = len(blob)
    while pos < size:
        if index >= max_messages:
            raise _too_many(max_messages)
        end, flag, body_at, props_start = _frame(blob, pos, index)
        props = blob[props_start:end]
        uniq_key = _check_properties(props, index)
        check_batch_entry(_properties_of(props), flag, blob[body_at:props_start - PROPERTIES_LENGTH.size], sys_flag,
                          index)
        entries.append(BlobEntry(index, pos, end, props_start, uniq_key))
        pos = end
        index += 1
    if not entries:
        raise InvalidArgumentError("the batch is empty: give at least one message")
    return entries


@dataclass(slots=True)
class BlobScan:
    """What the gateway needs of a checked blob: how many messages, and those without a UNIQ_KEY."""

    count: int
    missing: list[BlobEntry]


class _Unusual(Exception):
    """The fast pass met something it leaves to the precise one (which raises the error, if any)."""


def scan_blob(blob: bytes, max_messages: int, sys_flag: int = 0) -> BlobScan:
    """The gateway's pass: every entry of ``blob`` checked (framing, the rules of a batch's message with
    the request's ``sys_flag``) without copying its body; InvalidArgumentError names the first bad one.
    An empty blob or more than ``max_messages`` entries is refused too.

    Per entry the work is a frame unpack, one regex match of the properties (name \x01 value pairs,
    each part non-empty and free of separators) and a look for UNIQ_KEY; UTF-8 is checked once for the
    whole batch. Anything else (an error, a name merely ending in UNIQ_KEY) goes through
    :func:`_scan_precise`, which defines the rules and names the bad entry: so do a compressed batch
    and an entry with a ``TRAN_MSG`` property."""
    try:
        if sys_flag & COMPRESSED_FLAG:
            raise _Unusual
        return _scan_fast(blob, max_messages)
    except (_Unusual, struct.error, UnicodeDecodeError):
        entries = _scan_precise(blob, max_messages, sys_flag)
        return BlobScan(len(entries), [e for e in entries if not e.uniq_key])


def _scan_fast(blob: bytes, max_messages: int) -> BlobScan:
    size = len(blob)
    pos = index = 0
    missing: list[BlobEntry] = []
    unpack, unpack_length = HEAD.unpack_from, PROPERTIES_LENGTH.unpack_from
    ascii_form, well_formed = _ASCII_PROPERTIES.fullmatch, _PROPERTIES.fullmatch
    uniq_name, uniq_value, find = _UNIQ_NAME, _UNIQ_VALUE.match, blob.find
    while pos < size:
        total, _, _, flag, body_length = unpack(blob, pos)
        end = pos + total
        props_start = pos + ENTRY_OVERHEAD + body_length
        if body_length <= 0 or flag < 0 or total < ENTRY_OVERHEAD or end > size or props_start > end or \
                index >= max_messages or unpack_length(blob, props_start - 2)[0] != end - props_start:
            raise _Unusual
        if props_start < end:
            # Matched in place (no copy); non-ASCII properties are also checked for UTF-8.
            if ascii_form(blob, props_start, end) is None:
                if well_formed(blob, props_start, end) is None:
                    raise _Unusual
                blob[props_start:end].decode("utf-8")
            if find(_TRANSACTIONAL_NAME, props_start, end) >= 0:
                raise _Unusual
            at = find(uniq_name, props_start, end)
            if at < 0:
                missing.append(BlobEntry(index, pos, end, props_start, ""))
            elif (at > props_start and blob[at - 1] != 2) or find(uniq_name, at + 1, end) >= 0 or \
                    uniq_value(blob, at + len(uniq_name), end) is None:
                raise _Unusual
        else:
            missing.append(BlobEntry(index, pos, end, props_start, ""))
        pos = end
        index += 1
    if not index:
        raise _Unusual
    return BlobScan(index, missing)


def with_uniq_keys(blob: bytes, missing: list[BlobEntry], keys: Mapping[int, str]) -> bytes:
    """``blob`` with a UNIQ_KEY added to each entry of ``missing`` (``keys`` by entry index); only those
    entries are re-encoded."""
    parts: list[bytes] = []
    done = 0
    for entry in missing:
        i, key = entry.index, keys[entry.index]
        props = blob[entry.properties_start:entry.end]
        if props and not props.endswith(_ITEM):
            props += _ITEM
        props += _UNIQ[1:] + key.encode()
        if len(props) > MAX_PROPERTIES_BYTES:
            raise _fail(i, f"properties are {len(props)} bytes with the UNIQ_KEY the gateway adds, more than "
                           f"{MAX_PROPERTIES_BYTES}")
        _, _, _, flag, body_length = HEAD.unpack_from(blob, entry.start)
        body_at = entry.start + HEAD.size
        parts += (blob[done:entry.start], encode_entry(blob[body_at:body_at + body_length], flag, props))
        done = entry.end
    parts.append(blob[done:])
    return b"".join(parts)


def decode_blob(blob: bytes, topic: str, queue_id: int, born_timestamp: int, born_host: str, sys_flag: int,
                max_messages: int) -> list[Message]:
    """The commitlog's pass: messages for the engine, every entry checked as :func:`scan_blob` checks it
    (the topic-wide fields are the caller's to check). A fast pass, with the precise one for errors, a
    compressed batch and an entry with a ``TRAN_MSG`` property."""
    try:
        if sys_flag & COMPRESSED_FLAG:
            raise _Unusual
        return _decode_fast(blob, topic, queue_id, born_timestamp, born_host, sys_flag, max_messages)
    except (_Unusual, struct.error, ValueError):  # UnicodeDecodeError is a ValueError
        return _decode_precise(blob, topic, queue_id, born_timestamp, born_host, sys_flag, max_messages)


def _decode_fast(blob: bytes, topic: str, queue_id: int, born_timestamp: int, born_host: str, sys_flag: int,
                 max_messages: int) -> list[Message]:
    size = len(blob)
    pos = index = 0
    messages: list[Message] = []
    append = messages.append
    unpack, unpack_length = HEAD.unpack_from, PROPERTIES_LENGTH.unpack_from
    uniq_name, uniq_ok = PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX, _UNIQ_VALUE_TEXT.fullmatch
    item_sep, pair_sep, transactional = PROPERTY_SEPARATOR, NAME_VALUE_SEPARATOR, PROPERTY_TRANSACTION_PREPARED
    while pos < size:
        total, _, _, flag, body_length = unpack(blob, pos)
        end = pos + total
        props_start = pos + ENTRY_OVERHEAD + body_length
        if body_length <= 0 or flag < 0 or total < ENTRY_OVERHEAD or end > size or props_start > end or \
                index >= max_messages or unpack_length(blob, props_start - 2)[0] != end - props_start:
            raise _Unusual
        if props_start < end:
            items = blob[props_start:end].decode("utf-8").split(item_sep)
            if not items[-1]:
                items.pop()
            # dict() refuses an item without exactly one pair separator (ValueError); the rest of the
            # well-formedness is: no repeated, empty name or empty value.
            properties = dict([item.split(pair_sep) for item in items])
            if len(properties) != len(items) or "" in properties or "" in properties.values() or \
                    transactional in properties:
                raise _Unusual
            uniq_key = properties.get(uniq_name)
            if uniq_key is not None and uniq_ok(uniq_key) is None:
                raise _Unusual
        else:
            properties = {}
        append(Message(topic, queue_id, blob[pos + HEAD.size:props_start - 2], flag, properties, born_timestamp,
                       born_host, sys_flag, 0, 0))
        pos = end
        index += 1
    if not index:
        raise _Unusual
    return messages


def _decode_precise(blob: bytes, topic: str, queue_id: int, born_timestamp: int, born_host: str, sys_flag: int,
                    max_messages: int) -> list[Message]:
    messages: list[Message] = []
    pos = index = 0
    size = len(blob)
    item_sep, pair_sep = PROPERTY_SEPARATOR, NAME_VALUE_SEPARATOR
    while pos < size:
        if index >= max_messages:
            raise _too_many(max_messages)
        end, flag, body_at, props_start = _frame(blob, pos, index)
        properties: dict[str, str] = {}
        if props_start < end:
            try:
                text = blob[props_start:end].decode("utf-8")
            except UnicodeDecodeError as exc:
                raise _fail(index, f"properties are not UTF-8 ({exc.reason} at byte {exc.start})") from None
            items = text.split(item_sep)
            if not items[-1]:  # a trailing \x02 (RocketMQ clients before 4.9.8)
                items.pop()
            for item in items:
                name, _, value = item.partition(pair_sep)
                if not name or not value or pair_sep in value:
                    raise _fail(index, "properties must be name \\x01 value pairs separated by \\x02, with names "
                                       "and values non-empty and free of \\x01 and \\x02")
                properties[name] = value
            if len(properties) != len(items):
                raise _fail(index, "a property name appears twice: give each once")
        body = blob[body_at:props_start - PROPERTIES_LENGTH.size]
        check_batch_entry(properties, flag, body, sys_flag, index)
        messages.append(Message(topic, queue_id, body, flag, properties, born_timestamp, born_host, sys_flag, 0, 0))
        pos = end
        index += 1
    if not messages:
        raise InvalidArgumentError("the batch is empty: give at least one message")
    return messages


def uniq_keys_of(blob: bytes, max_messages: int) -> list[str]:
    """Each entry's UNIQ_KEY ("" where none): for answers that list every message."""
    return [entry.uniq_key for entry in _scan_precise(blob, max_messages)]
