"""Validate a producer's Message and encode it into a record, outside the put lock.

Only the queue offset, the commitlog offset and the store timestamp are left to fill in under the
lock, so the time the lock is held per message stays a few struct writes.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable
from typing import NamedTuple

from services.commitlog.put_result import PutMessageError, PutMessageStatus
from services.store.formats.message import (
    BORNHOST_V6_FLAG,
    NAME_VALUE_SEPARATOR,
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_SEPARATOR,
    PROPERTY_WAIT_STORE_MSG_OK,
    SCHEDULE_TOPIC,
    STOREHOSTADDRESS_V6_FLAG,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_NOT_TYPE,
    TRANSACTION_PREPARED_TYPE,
    Message,
    transaction_type,
)
from services.store.formats.record import (
    BORNHOST_POS,
    END_FILE_MIN_BLANK_LENGTH,
    HEAD_BASE_LENGTH,
    IPV4_HOST_LENGTH,
    MAX_PROPERTIES_LENGTH,
    MAX_TOPIC_LENGTH_V1,
    MESSAGE_MAGIC_CODE,
    crc32,
    java_parse_int,
    unfilled_head_struct,
)
from services.store.formats.socket_address import AddressError, encode_address
from services.store.rules.due_message import DueMessage
from services.store.rules.timer_message import (
    DEFAULT_TIMER_MAX_DELAY_SEC,
    PROPERTY_TIMER_DELAY_MS,
    PROPERTY_TIMER_DELAY_SEC,
    PROPERTY_TIMER_DELIVER_MS,
    PROPERTY_TIMER_OUT_MS,
    TIMER_QUEUE_ID,
    TIMER_REQUEST_PROPERTIES,
    TIMER_TOPIC,
    TimerPropertyError,
    timer_deliver_ms,
)

_V6_FLAGS = BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG
_PROPS_LENGTH = struct.Struct(">h")  # PROPERTIESLENGTH: refuses more than MAX_PROPERTIES_LENGTH
_NO_PROPERTIES_LENGTH = _PROPS_LENGTH.pack(0)
#: a message with any of these is parked (DELAY under SCHEDULE_TOPIC_XXXX, a timer under rmq_sys_wheel_timer)
_PARKING_PROPERTIES = frozenset({PROPERTY_DELAY_TIME_LEVEL, PROPERTY_TIMER_DELIVER_MS, PROPERTY_TIMER_DELAY_SEC,
                                 PROPERTY_TIMER_DELAY_MS})


class EncodedMessage(NamedTuple):
    """A checked message as its record bytes. Under the put lock only the queue offset, the
    commitlog offset and the store timestamp (at ``timestamp_pos``) are filled in, after the record
    is copied into the file. A tuple: made without a Python-level call, unpacked in one step under the lock."""

    record: bytes
    size: int
    topic: str
    queue_id: int
    timestamp_pos: int
    wait_store_msg_ok: bool
    #: Takes a queue offset (not a PREPARED or ROLLBACK transaction record: RocketMQ stores 0 for those).
    advances_queue: bool


class _BornHost(NamedTuple):
    """What a record's head needs of one born host address, worked out once per address."""

    address: bytes
    #: The sysFlag's IPv6 bits: BORNHOST_V6_FLAG for this address, STOREHOSTADDRESS_V6_FLAG for the store's.
    v6_flags: int
    #: Packs the head for this born host length (``unfilled_head_struct``).
    pack_head: Callable[..., bytes]
    head_size: int
    timestamp_pos: int


class MessageEncoder:
    def __init__(self, store_host: str, max_message_size: int, mapped_file_size: int,
                 max_delay_level: int, timer_max_delay_sec: int = DEFAULT_TIMER_MAX_DELAY_SEC) -> None:
        self.store_host = encode_address(store_host)
        self._store_v6 = STOREHOSTADDRESS_V6_FLAG if len(self.store_host) > IPV4_HOST_LENGTH else 0
        self.max_message_size = max_message_size
        self._max_record = min(max_message_size, mapped_file_size - END_FILE_MIN_BLANK_LENGTH)
        self.max_delay_level = max_delay_level
        self.timer_max_delay_sec = timer_max_delay_sec
        self._born_hosts: dict[str, _BornHost] = {}
        # Per topic: TOPICLENGTH and the topic's bytes, the constant start of every record's tail.
        self._topics: dict[str, bytes] = {}
        # Property names that passed the check (no separator, not empty): a message with only these
        # names needs only its values checked.
        self._property_names: set[str] = set()

    def encode(self, msg: Message, born_timestamp_default: int = 0, index: int | None = None) -> EncodedMessage:
        """Raise PutMessageError (nothing written) for a message the store must refuse. A message
        without a born timestamp gets ``born_timestamp_default``, or the time now if that is 0.

        This runs once per message on the put path, so it calls no Python-level helpers on the common
        path, works out what depends on the born host, the topic and the property names once per
        value, and leaves the 32/64-bit range checks of the integer fields to the head's struct (C)."""
        topic, queue_id, properties, body = msg.topic, msg.queue_id, msg.properties, msg.body
        if queue_id < 0 or msg.born_timestamp < 0:
            raise self._range_error(msg, index)
        born_host, v6_flags, pack_head, head_size, timestamp_pos = \
            self._born_hosts.get(msg.born_host) or self._born_host(msg.born_host, index)
        # Clearing and setting bits 4 and 5 keeps an out-of-range sysFlag out of range: the head's
        # struct refuses it as it refuses the other fields.
        sys_flag = (msg.sys_flag & ~_V6_FLAGS) | v6_flags
        if properties:
            # (the scheduler's re-put, a DueMessage, keeps DELAY / TIMER_* as they are)
            if not _PARKING_PROPERTIES.isdisjoint(properties) and type(msg) is not DueMessage:
                topic, queue_id, properties = self._schedule(topic, queue_id, properties, sys_flag, index)
            try:  # name \x01 value pairs joined by \x02, in C (a comprehension is a Python-level call)
                props_text = PROPERTY_SEPARATOR.join(map(NAME_VALUE_SEPARATOR.join, properties.items()))
                values = "".join(properties.values())
            except TypeError:  # a name or value that is not a str: stored as its str(), as RocketMQ would
                props_text = PROPERTY_SEPARATOR.join([f"{k}{NAME_VALUE_SEPARATOR}{v}" for k, v in properties.items()])
                values = NAME_VALUE_SEPARATOR  # the full check
            # Names seen before were checked then, so only the values are looked at here (a memchr for
            # each separator); anything else takes the full check (str.count costs ~140 ns a call).
            if NAME_VALUE_SEPARATOR in values or PROPERTY_SEPARATOR in values or "" in properties.values() \
                    or not self._property_names.issuperset(properties):
                self._check_properties(properties, props_text, index)
            props = props_text.encode("utf-8")
            try:
                props_length = _PROPS_LENGTH.pack(len(props))
            except struct.error:
                raise PutMessageError(PutMessageStatus.PROPERTIES_SIZE_EXCEEDED,
                                      f"properties are {len(props)} bytes, more than {MAX_PROPERTIES_LENGTH}",
                                      index) from None
            wait = properties.get(PROPERTY_WAIT_STORE_MSG_OK) != "false"
        else:
            props, props_length, wait = b"", _NO_PROPERTIES_LENGTH, True
        topic_part = self._topics.get(topic) or self._topic_part(topic, index)
        body_len = len(body)
        size = head_size + body_len + len(topic_part) + 2 + len(props)
        if size > self._max_record:
            raise _illegal(f"message is {size} bytes stored, more than the limit {self._max_record} "
                           "(maxMessageSize, or the commitlog file size less 8)", index)
        try:
            # QUEUEOFFSET, PHYSICALOFFSET and STORETIMESTAMP are zero bytes here: filled in under the put lock.
            head = pack_head(size, MESSAGE_MAGIC_CODE, crc32(body) & 0x7FFFFFFF, queue_id, msg.flag, sys_flag,
                             msg.born_timestamp or born_timestamp_default or time.time_ns() // 1_000_000,
                             born_host, self.store_host, msg.reconsume_times, msg.prepared_transaction_offset,
                             body_len)
        except struct.error:
            raise self._range_error(msg, index) from None
        # EncodedMessage(...) without the NamedTuple's Python-level __new__.
        return tuple.__new__(EncodedMessage, (b"".join((head, body, topic_part, props_length, props)), size, topic,
                                              queue_id, timestamp_pos, wait, not sys_flag & TRANSACTION_PREPARED_TYPE))

    def _check_properties(self, properties: dict[str, str], props_text: str, index: int | None) -> None:
        # A separator inside a name or value shows up as one separator too many.
        if props_text.count(NAME_VALUE_SEPARATOR) != len(properties) or \
                props_text.count(PROPERTY_SEPARATOR) != len(properties) - 1:
            raise _illegal("property names and values must not contain \\x01 or \\x02", index)
        if "" in properties or "" in properties.values():
            raise _illegal("property names and values must not be empty (RocketMQ drops such pairs)", index)
        if len(self._property_names) < 1024:
            self._property_names.update(properties)

    @staticmethod
    def _range_error(msg: Message, index: int | None) -> PutMessageError:
        return _illegal(f"flag {msg.flag}, sys_flag {msg.sys_flag}, reconsume_times {msg.reconsume_times} "
                        f"and queue id {msg.queue_id} must fit a 32-bit int, born timestamp "
                        f"{msg.born_timestamp} and prepared transaction offset {msg.prepared_transaction_offset} "
                        "a 64-bit one; queue id and born timestamp must not be negative", index)

    def _born_host(self, born_host: str, index: int | None) -> _BornHost:
        try:
            address = encode_address(born_host)
        except AddressError as exc:
            raise _illegal(str(exc), index) from None
        born_len, store_len = len(address), len(self.store_host)
        entry = _BornHost(address, self._store_v6 | (BORNHOST_V6_FLAG if born_len > IPV4_HOST_LENGTH else 0),
                          unfilled_head_struct(born_len, store_len).pack, HEAD_BASE_LENGTH + born_len + store_len,
                          BORNHOST_POS + born_len)
        if len(self._born_hosts) < 4096:
            self._born_hosts[born_host] = entry
        return entry

    def _topic_part(self, topic: str, index: int | None) -> bytes:
        encoded = topic.encode("utf-8")
        if len(encoded) > MAX_TOPIC_LENGTH_V1:  # the record's TOPICLENGTH is one byte
            raise _illegal(f"topic {topic[:40]!r}... is {len(encoded)} bytes, longer than "
                           f"{MAX_TOPIC_LENGTH_V1}", index)
        part = bytes((len(encoded),)) + encoded
        if len(self._topics) < 65536:
            self._topics[topic] = part
        return part

    def _schedule(self, topic: str, queue_id: int, properties: dict[str, str], sys_flag: int,
                  index: int | None) -> tuple[str, int, dict[str, str]]:
        """A DELAY level > 0 parks the message in SCHEDULE_TOPIC_XXXX, queue level - 1, remembering
        where it goes (RocketMQ's CommitLog.putMessage does this for non-transactional and commit messages).

        A level above the highest of ``messageDelayLevel`` is lowered to it and stored so, as RocketMQ
        4.9.8 does (``msg.setDelayTimeLevel(maxDelayLevel)``): its clients send such levels and expect
        the longest delay, not an error.

        Without a DELAY level, timer properties park it in rmq_sys_wheel_timer queue 0 until its
        deliver time (RocketMQ 5's HookUtils.handleScheduleMessage, services/store/rules/timer_message.py);
        with one, they are cleared (the level wins, as in RocketMQ 5)."""
        if transaction_type(sys_flag) not in (TRANSACTION_NOT_TYPE, TRANSACTION_COMMIT_TYPE):
            return topic, queue_id, properties
        delay = properties.get(PROPERTY_DELAY_TIME_LEVEL)
        if delay is None:
            return self._schedule_timer(topic, queue_id, properties, index)
        levels = self.max_delay_level
        try:
            level = java_parse_int(delay)
        except ValueError:
            raise _illegal(f"{PROPERTY_DELAY_TIME_LEVEL} property {delay!r} is not an integer: give a delay level "
                           f"1..{levels} (messageDelayLevel), or 0 for none", index) from None
        if level <= 0:
            return self._schedule_timer(topic, queue_id, properties, index)
        if any(name in properties for name in TIMER_REQUEST_PROPERTIES):
            properties = {k: v for k, v in properties.items() if k not in TIMER_REQUEST_PROPERTIES}
        if levels <= 0:
            raise _illegal(f"{PROPERTY_DELAY_TIME_LEVEL} level {level} cannot be served: messageDelayLevel defines "
                           "no delay levels on this store; send without DELAY", index)
        if level > levels:
            level = levels
            properties = {**properties, PROPERTY_DELAY_TIME_LEVEL: str(level)}
        properties = {**properties, PROPERTY_REAL_TOPIC: topic, PROPERTY_REAL_QUEUE_ID: str(queue_id)}
        return SCHEDULE_TOPIC, level - 1, properties

    def _schedule_timer(self, topic: str, queue_id: int, properties: dict[str, str],
                        index: int | None) -> tuple[str, int, dict[str, str]]:
        now = time.time_ns() // 1_000_000
        try:
            deliver = timer_deliver_ms(properties, now, self.timer_max_delay_sec)
        except TimerPropertyError as exc:
            raise _illegal(str(exc), index) from None
        if deliver is None or deliver <= now:  # due already: stored under its own topic at once
            return topic, queue_id, properties
        properties = {**properties, PROPERTY_TIMER_OUT_MS: str(deliver), PROPERTY_REAL_TOPIC: topic,
                      PROPERTY_REAL_QUEUE_ID: str(queue_id)}
        return TIMER_TOPIC, TIMER_QUEUE_ID, properties


def _illegal(detail: str, index: int | None) -> PutMessageError:
    return PutMessageError(PutMessageStatus.MESSAGE_ILLEGAL, detail, index)
