"""Timer messages (RocketMQ 5's "wheel timer"): a message delivered at an arbitrary time.

A producer sets one of (RocketMQ 5's MessageConst names, checked in this order, as HookUtils does):

* ``TIMER_DELAY_SEC``: seconds from now (the store's clock on arrival),
* ``TIMER_DELAY_MS``: milliseconds from now,
* ``TIMER_DELIVER_MS``: the absolute deliver time, ms since the epoch.

On arrival the commitlog service works out the deliver time. A time not yet come is parked: the
record is stored under :data:`TIMER_TOPIC` queue 0 with ``TIMER_OUT_MS`` (the deliver time),
``REAL_TOPIC`` and ``REAL_QID`` added (RocketMQ 5's transformTimerMessage); the scheduler re-puts it
when due. A time that has come is stored at once under its own topic, as RocketMQ 5 does. A time
further ahead than ``timerMaxDelaySec`` (default 7 days), or a value that is not a whole number, is
refused and nothing is written.

Differences from RocketMQ 5, on purpose: the deliver time is kept to the millisecond (RocketMQ rounds
it down to ``timerPrecisionMs``, 1 s by default, and so delivers up to a second early), and a DELAY
level wins over timer properties (RocketMQ 5 does the same: it clears the timer properties then).

What the scheduler re-puts (RocketMQ 5's TimerMessageStore.convert/convertMessage): the parked
record's body, flag, sys_flag, born time and host, reconsume times and *every* property, including
``TIMER_OUT_MS``, ``REAL_TOPIC`` and ``REAL_QID`` (convertMessage serialises the properties before it
clears those two), plus ``TIMER_ENQUEUE_MS`` (when the scheduler took the message into its wheel)
and ``TIMER_DEQUEUE_MS`` (when it delivered it). A record carrying ``TIMER_OUT_MS`` is never parked
again (RocketMQ 5's "double check").
"""

from __future__ import annotations

import struct
from collections.abc import Mapping

from services.store.formats.message import NAME_VALUE_SEPARATOR, PROPERTY_SEPARATOR
from services.store.formats.record import (
    BORNHOST_POS,
    MESSAGE_MAGIC_CODE,
    SIZE_AND_MAGIC,
    SYSFLAG_POS,
    Buffer,
    RecordError,
    host_lengths,
)

#: RocketMQ 5's TimerMessageStore.TIMER_TOPIC (rmq_sys_wheel_timer), one queue.
TIMER_TOPIC = "rmq_sys_wheel_timer"
TIMER_QUEUE_ID = 0

PROPERTY_TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
PROPERTY_TIMER_DELAY_SEC = "TIMER_DELAY_SEC"
PROPERTY_TIMER_DELAY_MS = "TIMER_DELAY_MS"
PROPERTY_TIMER_OUT_MS = "TIMER_OUT_MS"
PROPERTY_TIMER_ENQUEUE_MS = "TIMER_ENQUEUE_MS"
PROPERTY_TIMER_DEQUEUE_MS = "TIMER_DEQUEUE_MS"

#: the properties a producer sets to ask for a timer message
TIMER_REQUEST_PROPERTIES = (PROPERTY_TIMER_DELAY_SEC, PROPERTY_TIMER_DELAY_MS, PROPERTY_TIMER_DELIVER_MS)

DEFAULT_TIMER_MAX_DELAY_SEC = 7 * 24 * 3600
_LONG_MAX = 2**63 - 1


class TimerPropertyError(ValueError):
    """A timer property the store must refuse: the message says which and what to give instead."""


def _parse_long(name: str, text: str) -> int:
    """Java's Long.parseLong: optional sign and ASCII digits only, within 64 bits."""
    body = text[1:] if text[:1] in "+-" else text
    if not body or not body.isascii() or not body.isdigit():
        what = "milliseconds since the epoch" if name == PROPERTY_TIMER_DELIVER_MS else "a whole duration"
        raise TimerPropertyError(f"{name} property {text[:40]!r} is not a whole number: give {what}")
    value = int(text)
    if not -_LONG_MAX - 1 <= value <= _LONG_MAX:
        raise TimerPropertyError(f"{name} property {text[:40]!r} does not fit a 64-bit number")
    return value


def timer_deliver_ms(properties: Mapping[str, str], now_ms: int, max_delay_sec: int) -> int | None:
    """The deliver time (ms) a producer's timer properties ask for; None when the message has none or
    was parked once already (``TIMER_OUT_MS``). TimerPropertyError for a value the store refuses."""
    if PROPERTY_TIMER_OUT_MS in properties:
        return None
    if PROPERTY_TIMER_DELAY_SEC in properties:
        name = PROPERTY_TIMER_DELAY_SEC
        deliver = now_ms + _parse_long(name, properties[name]) * 1000
    elif PROPERTY_TIMER_DELAY_MS in properties:
        name = PROPERTY_TIMER_DELAY_MS
        deliver = now_ms + _parse_long(name, properties[name])
    elif PROPERTY_TIMER_DELIVER_MS in properties:
        name = PROPERTY_TIMER_DELIVER_MS
        deliver = _parse_long(name, properties[name])
    else:
        return None
    if deliver - now_ms > max_delay_sec * 1000:
        raise TimerPropertyError(
            f"{name} {properties[name][:40]!r} asks for delivery {(deliver - now_ms) / 1000:.0f} s from now, beyond "
            f"the limit of {max_delay_sec} s (timerMaxDelaySec): send it closer to its time")
    return deliver


_SYS_FLAG = struct.Struct(">i")
_BODY_LENGTH = struct.Struct(">i")
_U8 = struct.Struct(">B")
_U16 = struct.Struct(">H")
_I16 = struct.Struct(">h")
_OUT_ITEM = f"{PROPERTY_SEPARATOR}{PROPERTY_TIMER_OUT_MS}{NAME_VALUE_SEPARATOR}".encode()


def record_timer_out_ms(buf: Buffer, pos: int) -> int | None:
    """TIMER_OUT_MS of the record at ``pos`` (a whole record, as the indexer dispatched it), read from
    its properties alone: the scheduler takes timer messages in at the store's put rate, and decoding
    whole records (hosts, body) there would double its work. None when the property is missing or not
    a number; RecordError when the record is malformed."""
    try:
        size, magic = SIZE_AND_MAGIC.unpack_from(buf, pos)
        sys_flag = _SYS_FLAG.unpack_from(buf, pos + SYSFLAG_POS)[0]
        born_len, store_len = host_lengths(sys_flag)
        p = pos + BORNHOST_POS + born_len + 8 + store_len + 12
        p += 4 + _BODY_LENGTH.unpack_from(buf, p)[0]
        if magic == MESSAGE_MAGIC_CODE:
            p += 1 + _U8.unpack_from(buf, p)[0]
        else:
            p += 2 + _U16.unpack_from(buf, p)[0]
        props_len = _I16.unpack_from(buf, p)[0]
        p += 2
    except struct.error as exc:
        raise RecordError(f"offset {pos}: malformed record ({exc})") from None
    if props_len < 0 or p + props_len > pos + size:
        raise RecordError(f"offset {pos}: properties length {props_len} exceeds the record")
    props = PROPERTY_SEPARATOR.encode() + bytes(buf[p:p + props_len])
    i = props.rfind(_OUT_ITEM)
    if i < 0:
        return None
    start = i + len(_OUT_ITEM)
    end = props.find(PROPERTY_SEPARATOR.encode(), start)
    text = props[start:end if end >= 0 else len(props)]
    return int(text) if text.isdigit() else None
