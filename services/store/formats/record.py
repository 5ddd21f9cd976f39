"""The CommitLog record codec: RocketMQ's v1 message layout (decoding also accepts v2).

All integers are big-endian. A v1 record with IPv4 hosts::

    0  TOTALSIZE 4        28 PHYSICALOFFSET 8     64 STOREHOSTADDRESS 8 (20 if sysFlag & 0x20)
    4  MAGICCODE 4        36 SYSFLAG 4            72 RECONSUMETIMES 4
    8  BODYCRC 4          40 BORNTIMESTAMP 8      76 PREPARED TRANSACTION OFFSET 8
    12 QUEUEID 4          48 BORNHOST 8 (20 if    84 BODYLENGTH 4, body
    16 FLAG 4                sysFlag & 0x10)         TOPICLENGTH 1 (v2: 2), topic
    20 QUEUEOFFSET 8      56 STORETIMESTAMP 8        PROPERTIESLENGTH 2, properties

Offsets after BORNHOST shift by 12 for every IPv6 host. The end of a file is marked by a BLANK
record: TOTALSIZE = bytes left in the file, MAGICCODE = BLANK_MAGIC_CODE; only those 8 bytes are
written, which is why a file always keeps 8 bytes free for it.
"""

from __future__ import annotations

import mmap
import re
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

try:
    # ISA-L's CRC-32 (carry-less multiply): the same checksum as zlib.crc32, in about a tenth of the
    # instructions for a 1 KiB body; the put path computes one per message.
    from isal.isal_zlib import crc32 as crc32
except ImportError:  # pragma: no cover - a platform without the isal wheel
    from zlib import crc32 as crc32

from services.store.formats.message import (
    BORNHOST_V6_FLAG,
    DEFAULT_DELAY_LEVELS_MS,
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_KEYS,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_SEPARATOR,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    SCHEDULE_TOPIC,
    STOREHOSTADDRESS_V6_FLAG,
    MessageRecord,
    string_to_properties,
    tags_code,
)
from services.store.formats.socket_address import decode_address

# Anything record bytes are parsed from: file mappings included, without copying.
Buffer = bytes | bytearray | memoryview | mmap.mmap

MESSAGE_MAGIC_CODE = 0xDAA320A7
MESSAGE_MAGIC_CODE_V2 = 0xDAA320AB
BLANK_MAGIC_CODE = 0xCBD43194
END_FILE_MIN_BLANK_LENGTH = 8

QUEUE_OFFSET_POS = 20
PHYSICAL_OFFSET_POS = 28
SYSFLAG_POS = 36
BORNHOST_POS = 48
IPV4_HOST_LENGTH = 8
IPV6_HOST_LENGTH = 20
MAX_TOPIC_LENGTH_V1 = 127
MAX_PROPERTIES_LENGTH = 32767

#: TOTALSIZE and MAGICCODE, the 8 bytes that start every record and BLANK: the one definition every
#: reader of the layout unpacks (a walk reads nothing else to step from record to record).
SIZE_AND_MAGIC = struct.Struct(">iI")
_PREFIX = struct.Struct(">iIiiiqqiq")  # TOTALSIZE .. BORNTIMESTAMP, 48 bytes
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_U8 = struct.Struct(">B")
_U16 = struct.Struct(">H")
_I16 = struct.Struct(">h")
_AFTER_STORE_HOST = struct.Struct(">iqi")  # RECONSUMETIMES, PREPARED TX OFFSET, BODYLENGTH


class RecordError(ValueError):
    """Bytes at an offset that are not a valid record."""


def body_crc(body: bytes) -> int:
    """BODYCRC as RocketMQ computes it: CRC32 masked to a non-negative Java int."""
    return crc32(body) & 0x7FFFFFFF


def host_lengths(sys_flag: int) -> tuple[int, int]:
    born = IPV6_HOST_LENGTH if sys_flag & BORNHOST_V6_FLAG else IPV4_HOST_LENGTH
    store = IPV6_HOST_LENGTH if sys_flag & STOREHOSTADDRESS_V6_FLAG else IPV4_HOST_LENGTH
    return born, store


def store_timestamp_pos(sys_flag: int) -> int:
    return BORNHOST_POS + host_lengths(sys_flag)[0]


def record_length(sys_flag: int, body_len: int, topic_len: int, properties_len: int, v2: bool = False) -> int:
    """Total stored size of a record (RocketMQ's calMsgLength)."""
    born, store = host_lengths(sys_flag)
    return 4 + 4 + 4 + 4 + 4 + 8 + 8 + 4 + 8 + born + 8 + store + 4 + 8 + 4 + body_len \
        + (2 if v2 else 1) + topic_len + 2 + properties_len


#: The smallest record there is (IPv4 hosts, empty body, topic and properties): a smaller TOTALSIZE
#: is no record.
MIN_RECORD_LENGTH = record_length(0, 0, 0, 0)


def largest_body_always_stored(max_message_size: int) -> int:
    """The largest body a record within ``max_message_size`` (maxMessageSize limits the whole record, as
    in RocketMQ 4.9.8) holds whatever its hosts, topic and properties: what a protocol that limits
    bodies alone can promise."""
    overhead = record_length(BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG, 0, MAX_TOPIC_LENGTH_V1, MAX_PROPERTIES_LENGTH)
    return max_message_size - overhead


def encode_blank(size: int) -> bytes:
    """The 8 bytes written at a file's end: TOTALSIZE (bytes left) and the BLANK magic."""
    return SIZE_AND_MAGIC.pack(size, BLANK_MAGIC_CODE)


# Fixed part of a record, TOTALSIZE through BODYLENGTH, per (born host, store host) length.
_HEADS = {(b, st): struct.Struct(f">iIiiiqqiq{b}sq{st}siqi")
          for b in (IPV4_HOST_LENGTH, IPV6_HOST_LENGTH) for st in (IPV4_HOST_LENGTH, IPV6_HOST_LENGTH)}
#: Bytes of the fixed part without the two host addresses (72: 88 with two IPv4 hosts).
HEAD_BASE_LENGTH = _HEADS[IPV4_HOST_LENGTH, IPV4_HOST_LENGTH].size - 2 * IPV4_HOST_LENGTH


def unfilled_head_struct(born_host_length: int, store_host_length: int) -> struct.Struct:
    """A v1 record's fixed part, TOTALSIZE through BODYLENGTH, with zero bytes where the writer fills
    in QUEUEOFFSET, PHYSICALOFFSET and STORETIMESTAMP under its lock (:func:`patch_offsets`). It packs
    TOTALSIZE, MAGICCODE, BODYCRC, QUEUEID, FLAG, SYSFLAG, BORNTIMESTAMP, BORNHOST, STOREHOSTADDRESS,
    RECONSUMETIMES, PREPARED TRANSACTION OFFSET and BODYLENGTH, and refuses any that does not fit."""
    return struct.Struct(f">iIiii16xiq{born_host_length}s8x{store_host_length}siqi")
_TAIL_LENGTHS = 1 + 2  # TOPICLENGTH (v1) + PROPERTIESLENGTH


def encode_record_parts(
    topic: bytes,
    queue_id: int,
    body: bytes,
    flag: int,
    properties: bytes,
    sys_flag: int,
    born_timestamp: int,
    born_host: bytes,
    store_host: bytes,
    reconsume_times: int = 0,
    prepared_transaction_offset: int = 0,
    queue_offset: int = 0,
    commitlog_offset: int = 0,
    store_timestamp: int = 0,
    crc: int | None = None,
) -> tuple[bytes, bytes, bytes]:
    """Encode one v1 record as (head, body, tail), so a batch can be joined with one copy of each body.

    ``born_host``/``store_host`` must match the sysFlag's IPv6 bits. The engine passes 0 for the fields
    it fills under the put lock (queue offset, commitlog offset, store timestamp): see :func:`patch_offsets`.
    """
    head_struct = _HEADS[len(born_host), len(store_host)]
    tail = b"".join((_U8.pack(len(topic)), topic, _I16.pack(len(properties)), properties))
    total = head_struct.size + len(body) + len(tail)
    head = head_struct.pack(
        total, MESSAGE_MAGIC_CODE, body_crc(body) if crc is None else crc, queue_id, flag,
        queue_offset, commitlog_offset, sys_flag, born_timestamp, born_host, store_timestamp, store_host,
        reconsume_times, prepared_transaction_offset, len(body),
    )
    return head, body, tail


def encode_record(**fields: Any) -> bytes:
    """Encode one v1 record (arguments as :func:`encode_record_parts`)."""
    return b"".join(encode_record_parts(**fields))


_OFFSETS = struct.Struct(">qq")


def patch_offsets(buf: bytearray, pos: int, queue_offset: int, commitlog_offset: int,
                  store_timestamp: int, timestamp_pos: int) -> None:
    """Fill the fields only known under the put lock into an encoded record at ``buf[pos:]``."""
    _OFFSETS.pack_into(buf, pos + QUEUE_OFFSET_POS, queue_offset, commitlog_offset)
    _I64.pack_into(buf, pos + timestamp_pos, store_timestamp)


def read_size_and_magic(buf: Buffer, pos: int) -> tuple[int, int]:
    """TOTALSIZE and MAGICCODE at ``pos`` (magic unsigned)."""
    size, magic = SIZE_AND_MAGIC.unpack_from(buf, pos)
    return int(size), int(magic)


def decode_record(buf: Buffer, pos: int = 0) -> MessageRecord:
    """Decode the record at ``buf[pos:]``. Raises RecordError if it is not a whole valid record
    (a BLANK record raises too: callers check the magic first)."""
    limit = len(buf)
    if pos + 8 > limit:
        raise RecordError(f"offset {pos}: fewer than 8 bytes left")
    size, magic = SIZE_AND_MAGIC.unpack_from(buf, pos)
    if magic not in (MESSAGE_MAGIC_CODE, MESSAGE_MAGIC_CODE_V2):
        raise RecordError(f"offset {pos}: magic code {magic:#010x} is not a message magic code")
    if size < MIN_RECORD_LENGTH or pos + size > limit:
        raise RecordError(f"offset {pos}: total size {size} does not fit the {limit - pos} bytes left")
    try:
        (_, _, crc, queue_id, flag, queue_offset, commitlog_offset, sys_flag,
         born_ts) = _PREFIX.unpack_from(buf, pos)
        born_len, store_len = host_lengths(sys_flag)
        p = pos + BORNHOST_POS
        born_host = decode_address(bytes(buf[p:p + born_len]))
        p += born_len
        store_ts = _I64.unpack_from(buf, p)[0]
        p += 8
        store_host = decode_address(bytes(buf[p:p + store_len]))
        p += store_len
        reconsume, prepared, body_len = _AFTER_STORE_HOST.unpack_from(buf, p)
        p += 16
        if body_len < 0 or p + body_len > pos + size:
            raise RecordError(f"offset {pos}: body length {body_len} exceeds the record")
        body = bytes(buf[p:p + body_len])
        p += body_len
        if magic == MESSAGE_MAGIC_CODE:
            topic_len = _U8.unpack_from(buf, p)[0]
            p += 1
        else:
            topic_len = _U16.unpack_from(buf, p)[0]
            p += 2
        topic = bytes(buf[p:p + topic_len]).decode("utf-8")
        p += topic_len
        props_len = _I16.unpack_from(buf, p)[0]
        p += 2
        if props_len < 0:
            raise RecordError(f"offset {pos}: negative properties length {props_len}")
        props = bytes(buf[p:p + props_len]).decode("utf-8")
        p += props_len
    except RecordError:
        raise
    except (struct.error, ValueError) as exc:  # ValueError: bad UTF-8, or a host cut short by the record end
        raise RecordError(f"offset {pos}: malformed record ({exc})") from None
    if p - pos != size:
        raise RecordError(f"offset {pos}: fields add up to {p - pos} bytes, total size says {size}")
    return MessageRecord(
        store_size=size, magic=magic, body_crc=crc, queue_id=queue_id, flag=flag,
        queue_offset=queue_offset, commitlog_offset=commitlog_offset, sys_flag=sys_flag,
        born_timestamp=born_ts, born_host=born_host, store_timestamp=store_ts, store_host=store_host,
        reconsume_times=reconsume, prepared_transaction_offset=prepared, body=body, topic=topic,
        properties=string_to_properties(props),
    )


@dataclass(slots=True)
class DispatchRequest:
    """What RocketMQ's checkMessageAndReturnSize yields: the facts the ConsumeQueue and IndexFile
    need. ``msg_size`` > 0 is a record, 0 a BLANK (move to the next file); ``success`` False stops a walk."""

    success: bool
    msg_size: int
    topic: str = ""
    queue_id: int = 0
    commitlog_offset: int = 0
    queue_offset: int = 0
    tags_code: int = 0
    store_timestamp: int = 0
    keys: str | None = None
    uniq_key: str | None = None
    sys_flag: int = 0
    prepared_transaction_offset: int = 0


INVALID = DispatchRequest(success=False, msg_size=-1)


def deliver_timestamp(delay_level: int, store_timestamp: int, delay_levels_ms: Sequence[int]) -> int:
    """ScheduleMessageService.computeDeliverTimestamp: store time + the level's delay."""
    if 1 <= delay_level <= len(delay_levels_ms):
        return store_timestamp + delay_levels_ms[delay_level - 1]
    return store_timestamp + 1000


def check_record(
    buf: Buffer,
    pos: int,
    check_crc: bool = True,
    delay_levels_ms: Sequence[int] = DEFAULT_DELAY_LEVELS_MS,
) -> DispatchRequest:
    """Validate the record at ``pos`` the way recovery and dispatch do (checkMessageAndReturnSize)."""
    if pos + 8 > len(buf):
        return INVALID
    size, magic = SIZE_AND_MAGIC.unpack_from(buf, pos)
    if magic == BLANK_MAGIC_CODE:
        return DispatchRequest(success=True, msg_size=0)
    try:
        record = decode_record(buf, pos)
    except RecordError:
        return DispatchRequest(success=False, msg_size=size if magic in (
            MESSAGE_MAGIC_CODE, MESSAGE_MAGIC_CODE_V2) else -1)
    if check_crc and body_crc(record.body) != record.body_crc:
        return INVALID
    try:
        return dispatch_request_of(record, delay_levels_ms)
    except ValueError:  # DELAY is not an int: RocketMQ's parseInt throws and the record counts as invalid
        return INVALID


_JAVA_INT = re.compile(r"[+-]?\d+")


def java_parse_int(text: str) -> int:
    """Integer.parseInt: optional sign and digits only (no blanks or underscores, which Python's int()
    would accept), within the signed 32-bit range. Raises ValueError otherwise."""
    if not _JAVA_INT.fullmatch(text):
        raise ValueError(f"{text!r} is not a Java int")
    value = int(text)
    if not -0x8000_0000 <= value <= 0x7FFF_FFFF:
        raise ValueError(f"{text!r} is out of the Java int range")
    return value


def real_destination(properties: Mapping[str, str]) -> tuple[str, int]:
    """REAL_TOPIC and REAL_QID of a parked record (delayed, timer, or a transaction's half): where it
    goes when it is delivered or committed. ValueError saying what is missing or wrong."""
    topic = properties.get(PROPERTY_REAL_TOPIC)
    queue_text = properties.get(PROPERTY_REAL_QUEUE_ID)
    if not topic or queue_text is None:
        raise ValueError("no REAL_TOPIC / REAL_QID")
    try:
        return topic, java_parse_int(queue_text)
    except ValueError:
        raise ValueError(f"REAL_QID {queue_text!r} is not an integer") from None


def delay_tags_code(delay: str, store_timestamp: int, code: int, delay_levels_ms: Sequence[int]) -> int:
    """The tags code of a record on SCHEDULE_TOPIC_XXXX whose DELAY property is ``delay``: its deliver
    time when the level (lowered to the highest) is above 0, else ``code`` (its TAGS' code). A DELAY
    that is not a Java int raises ValueError and makes the record invalid: 4.9.8's
    checkMessageAndReturnSize parses it with Integer.parseInt inside the try whose catch answers an
    invalid record (and putMessage's getDelayTimeLevel throws on it, so no such record is stored)."""
    try:
        level = min(java_parse_int(delay), len(delay_levels_ms))
    except ValueError:
        raise ValueError(f"DELAY {delay!r} on {SCHEDULE_TOPIC} is not an integer: an invalid record") from None
    return deliver_timestamp(level, store_timestamp, delay_levels_ms) if level > 0 else code


def dispatch_request_of(record: MessageRecord,
                        delay_levels_ms: Sequence[int] = DEFAULT_DELAY_LEVELS_MS) -> DispatchRequest:
    props = record.properties
    code = tags_code(props.get(PROPERTY_TAGS))
    delay = props.get(PROPERTY_DELAY_TIME_LEVEL)
    if record.topic == SCHEDULE_TOPIC and delay is not None:
        code = delay_tags_code(delay, record.store_timestamp, code, delay_levels_ms)
    return DispatchRequest(
        success=True, msg_size=record.store_size, topic=record.topic, queue_id=record.queue_id,
        commitlog_offset=record.commitlog_offset, queue_offset=record.queue_offset, tags_code=code,
        store_timestamp=record.store_timestamp, keys=props.get(PROPERTY_KEYS),
        uniq_key=props.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX), sys_flag=record.sys_flag,
        prepared_transaction_offset=record.prepared_transaction_offset,
    )


def _find_property(text: str, pattern: str) -> str | None:
    """The value of the property whose ``pattern`` (separator, name, name/value separator) is given,
    in ``text`` (which starts with the property separator)."""
    i = text.rfind(pattern)
    if i < 0:
        return None
    start = i + len(pattern)
    j = text.find(PROPERTY_SEPARATOR, start)
    value = text[start:j] if j >= 0 else text[start:]
    if value:
        return value
    # An empty last item is dropped by RocketMQ, so an earlier one may count.
    return string_to_properties(text[1:]).get(pattern[1:-1])


_TAGS_ITEM = f"{PROPERTY_SEPARATOR}{PROPERTY_TAGS}\x01"
_KEYS_ITEM = f"{PROPERTY_SEPARATOR}{PROPERTY_KEYS}\x01"
_UNIQ_ITEM = f"{PROPERTY_SEPARATOR}{PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX}\x01"
_DELAY_ITEM = f"{PROPERTY_SEPARATOR}{PROPERTY_DELAY_TIME_LEVEL}\x01"


def parse_dispatch_requests(data: Buffer, start_offset: int,
                            delay_levels_ms: Sequence[int] = DEFAULT_DELAY_LEVELS_MS) -> list[DispatchRequest]:
    """Dispatch requests of whole records laid back to back in ``data`` (a Tail chunk), the first at
    commitlog offset ``start_offset``. The dispatch path: bodies are skipped, never copied, and the
    record was already validated by the writer, so no CRC is computed here.

    Each property dispatch needs (TAGS, KEYS, UNIQ_KEY; DELAY on the schedule topic) is found by one
    search of the properties string instead of building the record's whole properties dict: an item
    starts after the property separator and no value contains it, so ``\\x02NAME\\x01`` in ``"\\x02" +
    properties`` is exactly an item named NAME, and the last one wins as in RocketMQ's map. An item of
    that name with an empty value (dropped by RocketMQ, so an earlier one may win) takes the full parse.

    Raises RecordError if the bytes are not whole records (a tailer must then resynchronise).
    """
    requests: list[DispatchRequest] = []
    append = requests.append
    unpack_v4 = _HEADS[IPV4_HOST_LENGTH, IPV4_HOST_LENGTH].unpack_from
    unpack_i16 = _I16.unpack_from
    v6_bits = BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG
    find = _find_property
    limit = len(data)
    pos = 0
    while pos < limit:
        try:
            (size, magic, _, queue_id, _, queue_offset, commitlog_offset, sys_flag, _, _, store_timestamp, _, _,
             prepared, body_len) = unpack_v4(data, pos)
            if sys_flag & v6_bits:  # the rare IPv6 layout: re-read with the right host lengths
                born, store = host_lengths(sys_flag)
                (*_, store_timestamp, _, _, prepared, body_len) = _HEADS[born, store].unpack_from(data, pos)
                p = pos + BORNHOST_POS + born + 8 + store + 16 + body_len
            else:
                p = pos + 88 + body_len
            if magic == MESSAGE_MAGIC_CODE:
                topic_len = data[p]
                p += 1
            elif magic == MESSAGE_MAGIC_CODE_V2:
                topic_len = _U16.unpack_from(data, p)[0]
                p += 2
            else:
                raise RecordError(f"offset {start_offset + pos}: magic code {magic:#010x} is not a message")
            topic = str(data[p:p + topic_len], "utf-8")
            p += topic_len
            props_len = unpack_i16(data, p)[0]
            p += 2
            if props_len > 0:
                text = PROPERTY_SEPARATOR + str(data[p:p + props_len], "utf-8")
                p += props_len
            else:
                text = ""
        except (struct.error, IndexError, UnicodeDecodeError) as exc:
            raise RecordError(f"offset {start_offset + pos}: malformed record ({exc})") from None
        if p - pos != size or commitlog_offset != start_offset + pos:
            raise RecordError(f"offset {start_offset + pos}: not a whole record that starts here")
        if text:
            tags = find(text, _TAGS_ITEM) if _TAGS_ITEM in text else None
            code = tags_code(tags) if tags else 0
            if topic == SCHEDULE_TOPIC:
                delay = find(text, _DELAY_ITEM)
                if delay is not None:
                    try:
                        code = delay_tags_code(delay, store_timestamp, code, delay_levels_ms)
                    except ValueError as exc:
                        raise RecordError(f"offset {start_offset + pos}: {exc}") from None
            append(DispatchRequest(True, size, topic, queue_id, commitlog_offset, queue_offset, code,
                                   store_timestamp, find(text, _KEYS_ITEM) if _KEYS_ITEM in text else None,
                                   find(text, _UNIQ_ITEM) if _UNIQ_ITEM in text else None, sys_flag, prepared))
        else:
            append(DispatchRequest(True, size, topic, queue_id, commitlog_offset, queue_offset, 0,
                                   store_timestamp, None, None, sys_flag, prepared))
        pos += size
    return requests
