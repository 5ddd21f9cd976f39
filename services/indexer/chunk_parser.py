"""The dispatch path's parser: DispatchRequests of a chunk of whole records, reading only what the
ConsumeQueue and the IndexFile need.

``services.store.record.parse_dispatch_requests`` gives the same requests (a test holds the two equal
on every kind of record) but builds each record's whole properties dict; a record usually carries a
few properties of which dispatch needs at most three (TAGS, KEYS, UNIQ_KEY; DELAY on the schedule
topic). Here each is found by one search of the properties string: an item starts after the property
separator and no value contains that separator, so ``\\x02NAME\\x01`` in ``"\\x02" + properties`` is
exactly an item named NAME, and the last one wins as in RocketMQ's map. An item of that name with an
empty value (dropped by RocketMQ, so an earlier one may win) takes the full parse instead.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from services.store.message import (
    BORNHOST_V6_FLAG,
    DEFAULT_DELAY_LEVELS_MS,
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_KEYS,
    PROPERTY_SEPARATOR,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    SCHEDULE_TOPIC,
    STOREHOSTADDRESS_V6_FLAG,
    string_to_properties,
    tags_code,
)
from services.store.record import (
    BORNHOST_POS,
    IPV4_HOST_LENGTH,
    IPV6_HOST_LENGTH,
    MESSAGE_MAGIC_CODE,
    MESSAGE_MAGIC_CODE_V2,
    DispatchRequest,
    RecordError,
    deliver_timestamp,
    host_lengths,
    java_parse_int,
)

# A record's fixed part, TOTALSIZE through BODYLENGTH, per (born host, store host) length (record.py's layout).
_HEADS = {(b, st): struct.Struct(f">iIiiiqqiq{b}sq{st}siqi")
          for b in (IPV4_HOST_LENGTH, IPV6_HOST_LENGTH) for st in (IPV4_HOST_LENGTH, IPV6_HOST_LENGTH)}
_I16 = struct.Struct(">h")
_U16 = struct.Struct(">H")
_SEP = PROPERTY_SEPARATOR


def _find(text: str, pattern: str) -> str | None:
    """The value of the property whose ``pattern`` (separator, name, name/value separator) is given,
    in ``text`` (which starts with the property separator)."""
    i = text.rfind(pattern)
    if i < 0:
        return None
    start = i + len(pattern)
    j = text.find(_SEP, start)
    value = text[start:j] if j >= 0 else text[start:]
    if value:
        return value
    # An empty last item is dropped by RocketMQ, so an earlier one may count.
    return string_to_properties(text[1:]).get(pattern[1:-1])


_TAGS = f"{_SEP}{PROPERTY_TAGS}\x01"
_KEYS = f"{_SEP}{PROPERTY_KEYS}\x01"
_UNIQ = f"{_SEP}{PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX}\x01"
_DELAY = f"{_SEP}{PROPERTY_DELAY_TIME_LEVEL}\x01"


def parse_chunk(data: bytes | memoryview, start_offset: int,
                delay_levels_ms: Sequence[int] = DEFAULT_DELAY_LEVELS_MS) -> list[DispatchRequest]:
    """As ``parse_dispatch_requests``: the requests of whole records back to back in ``data``, the
    first at commitlog offset ``start_offset``; RecordError if they are not whole records."""
    requests: list[DispatchRequest] = []
    append = requests.append
    unpack_v4 = _HEADS[IPV4_HOST_LENGTH, IPV4_HOST_LENGTH].unpack_from
    unpack_i16 = _I16.unpack_from
    v6_bits = BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG
    find = _find
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
                text = _SEP + str(data[p:p + props_len], "utf-8")
                p += props_len
            else:
                text = ""
        except (struct.error, IndexError, UnicodeDecodeError) as exc:
            raise RecordError(f"offset {start_offset + pos}: malformed record ({exc})") from None
        if p - pos != size or commitlog_offset != start_offset + pos:
            raise RecordError(f"offset {start_offset + pos}: not a whole record that starts here")
        if text:
            tags = find(text, _TAGS) if _TAGS in text else None
            code = tags_code(tags) if tags else 0
            if topic == SCHEDULE_TOPIC:
                delay = find(text, _DELAY)
                if delay is not None:
                    try:
                        level = min(java_parse_int(delay), len(delay_levels_ms))
                    except ValueError:
                        level = 0
                    if level > 0:
                        code = deliver_timestamp(level, store_timestamp, delay_levels_ms)
            append(DispatchRequest(True, size, topic, queue_id, commitlog_offset, queue_offset, code,
                                   store_timestamp, find(text, _KEYS) if _KEYS in text else None,
                                   find(text, _UNIQ) if _UNIQ in text else None, sys_flag, prepared))
        else:
            append(DispatchRequest(True, size, topic, queue_id, commitlog_offset, queue_offset, 0,
                                   store_timestamp, None, None, sys_flag, prepared))
        pos += size
    return requests
