"""The fields of a parked (delayed or timer) record that its re-put needs, decoded without the rest.

The scheduler re-puts every due message; decoding the whole record
(:func:`~services.store.formats.record.decode_record`) for it formatted both hosts, which the re-put
does not use (the store gives it a new store host). Here only the born host is formatted, through a
small cache (a shard sees few producer addresses). The checks are decode_record's. The topic and
queue are read too: a restart tells the scheduler's re-puts in the log by them (stored under their
REAL_TOPIC / REAL_QID) with this same decode.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from services.store.formats.message import string_to_properties
from services.store.formats.record import (
    BORNHOST_POS,
    MESSAGE_MAGIC_CODE,
    MESSAGE_MAGIC_CODE_V2,
    MIN_RECORD_LENGTH,
    SIZE_AND_MAGIC,
    Buffer,
    RecordError,
    host_lengths,
)
from services.store.formats.socket_address import decode_address

_PREFIX = struct.Struct(">iIiiiqqiq")  # TOTALSIZE .. BORNTIMESTAMP
_AFTER_STORE_HOST = struct.Struct(">iqi")  # RECONSUMETIMES, PREPARED TX OFFSET, BODYLENGTH
_U8 = struct.Struct(">B")
_U16 = struct.Struct(">H")
_I16 = struct.Struct(">h")
#: formatted born hosts by their stored bytes (bounded: cleared when full)
_HOSTS: dict[bytes, str] = {}
_HOSTS_MAX = 4096


class ParkedRecord(NamedTuple):
    """What a re-put copies from a parked record (the names are MessageRecord's)."""

    commitlog_offset: int
    queue_id: int
    flag: int
    sys_flag: int
    born_timestamp: int
    born_host: str
    reconsume_times: int
    body: bytes
    properties: dict[str, str]
    topic: str


def _born_host(raw: bytes) -> str:
    host = _HOSTS.get(raw)
    if host is None:
        if len(_HOSTS) >= _HOSTS_MAX:
            _HOSTS.clear()
        host = _HOSTS[raw] = decode_address(raw)
    return host


def decode_parked(buf: Buffer, pos: int = 0) -> ParkedRecord:
    """The re-put fields of the record at ``buf[pos:]``; RecordError when it is not a whole valid record."""
    limit = len(buf)
    if pos + 8 > limit:
        raise RecordError(f"offset {pos}: fewer than 8 bytes left")
    size, magic = SIZE_AND_MAGIC.unpack_from(buf, pos)
    if magic not in (MESSAGE_MAGIC_CODE, MESSAGE_MAGIC_CODE_V2):
        raise RecordError(f"offset {pos}: magic code {magic:#010x} is not a message magic code")
    if size < MIN_RECORD_LENGTH or pos + size > limit:
        raise RecordError(f"offset {pos}: total size {size} does not fit the {limit - pos} bytes left")
    end = pos + size
    try:
        (_, _, _, queue_id, flag, _, commitlog_offset, sys_flag, born_ts) = _PREFIX.unpack_from(buf, pos)
        born_len, store_len = host_lengths(sys_flag)
        p = pos + BORNHOST_POS
        raw_born = bytes(buf[p:p + born_len])
        if len(raw_born) != born_len:
            raise RecordError(f"offset {pos}: born host cut short by the record end")
        born_host = _born_host(raw_born)
        p += born_len + 8 + store_len  # STORETIMESTAMP, STOREHOSTADDRESS: the store writes new ones
        reconsume, _, body_len = _AFTER_STORE_HOST.unpack_from(buf, p)
        p += 16
        if body_len < 0 or p + body_len > end:
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
        if p + props_len > end:
            raise RecordError(f"offset {pos}: properties length {props_len} exceeds the record")
        props = bytes(buf[p:p + props_len]).decode("utf-8")
        p += props_len
    except RecordError:
        raise
    except (struct.error, ValueError) as exc:  # ValueError: bad UTF-8, or a host cut short by the record end
        raise RecordError(f"offset {pos}: malformed record ({exc})") from None
    if p != end:
        raise RecordError(f"offset {pos}: fields add up to {p - pos} bytes, total size says {size}")
    return ParkedRecord(commitlog_offset, queue_id, flag, sys_flag, born_ts, born_host, reconsume, body,
                        string_to_properties(props), topic)
