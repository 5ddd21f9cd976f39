"""Validate a producer's Message and encode it into a record, outside the put lock.

Only the queue offset, the commitlog offset and the store timestamp are left to fill in under the
lock, so the time the lock is held per message stays a few struct writes.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.commitlog.put_result import PutMessageError, PutMessageStatus
from services.store.message import (
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
    Message,
    transaction_type,
)
from services.store.record import (
    BORNHOST_POS,
    END_FILE_MIN_BLANK_LENGTH,
    IPV4_HOST_LENGTH,
    MAX_PROPERTIES_LENGTH,
    MAX_TOPIC_LENGTH_V1,
    encode_record_parts,
    java_parse_int,
)
from services.store.socket_address import AddressError, encode_address

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
_INT64_LIMIT = 2**63


@dataclass(slots=True)
class EncodedMessage:
    head: bytes
    body: bytes
    tail: bytes
    size: int
    topic: str
    queue_id: int
    sys_flag: int
    timestamp_pos: int
    wait_store_msg_ok: bool


class MessageEncoder:
    def __init__(self, store_host: str, max_message_size: int, mapped_file_size: int,
                 max_delay_level: int) -> None:
        self.store_host = encode_address(store_host)
        self._store_v6 = STOREHOSTADDRESS_V6_FLAG if len(self.store_host) > 8 else 0
        self.max_message_size = max_message_size
        self._max_record = min(max_message_size, mapped_file_size - END_FILE_MIN_BLANK_LENGTH)
        self.max_delay_level = max_delay_level
        self._born_hosts: dict[str, bytes] = {}
        self._topics: dict[str, bytes] = {}

    def encode(self, msg: Message, born_timestamp_default: int, index: int | None = None) -> EncodedMessage:
        """Raise PutMessageError (nothing written) for a message the store must refuse.

        This runs once per message on the put path, so it avoids helper calls and temporary objects.
        """
        topic, queue_id, properties, body = msg.topic, msg.queue_id, msg.properties, msg.body
        if not (_INT32_MIN <= msg.flag <= _INT32_MAX and _INT32_MIN <= msg.sys_flag <= _INT32_MAX
                and _INT32_MIN <= msg.reconsume_times <= _INT32_MAX and 0 <= queue_id <= _INT32_MAX
                and 0 <= msg.born_timestamp < _INT64_LIMIT
                and -_INT64_LIMIT <= msg.prepared_transaction_offset < _INT64_LIMIT):
            raise _illegal(f"flag {msg.flag}, sys_flag {msg.sys_flag}, reconsume_times {msg.reconsume_times} "
                           f"and queue id {queue_id} must fit a 32-bit int, born timestamp "
                           f"{msg.born_timestamp} and prepared transaction offset a 64-bit one; queue id and "
                           "born timestamp must not be negative", index)
        born_host = self._born_hosts.get(msg.born_host) or self._encode_born_host(msg.born_host, index)
        sys_flag = (msg.sys_flag & ~(BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG)) | self._store_v6
        if len(born_host) > IPV4_HOST_LENGTH:
            sys_flag |= BORNHOST_V6_FLAG
        if properties:
            if PROPERTY_DELAY_TIME_LEVEL in properties:
                topic, queue_id, properties = self._schedule(topic, queue_id, properties, sys_flag, index)
            props_text = PROPERTY_SEPARATOR.join([f"{k}{NAME_VALUE_SEPARATOR}{v}" for k, v in properties.items()])
            # A separator inside a name or value shows up as one separator too many.
            if props_text.count(NAME_VALUE_SEPARATOR) != len(properties) or \
                    props_text.count(PROPERTY_SEPARATOR) != len(properties) - 1:
                raise _illegal("property names and values must not contain \\x01 or \\x02", index)
            if "" in properties or "" in properties.values():
                raise _illegal("property names and values must not be empty (RocketMQ drops such pairs)", index)
            props = props_text.encode("utf-8")
            if len(props) > MAX_PROPERTIES_LENGTH:
                raise PutMessageError(PutMessageStatus.PROPERTIES_SIZE_EXCEEDED,
                                      f"properties are {len(props)} bytes, more than {MAX_PROPERTIES_LENGTH}", index)
            wait = properties.get(PROPERTY_WAIT_STORE_MSG_OK) != "false"
        else:
            props, wait = b"", True
        head, body, tail = encode_record_parts(
            self._topic_bytes(topic, index), queue_id, body, msg.flag, props, sys_flag,
            msg.born_timestamp or born_timestamp_default, born_host, self.store_host, msg.reconsume_times,
            msg.prepared_transaction_offset,
        )
        size = len(head) + len(body) + len(tail)
        if size > self._max_record:
            raise _illegal(f"message is {size} bytes stored, more than the limit {self._max_record} "
                           "(maxMessageSize, or the commitlog file size less 8)", index)
        return EncodedMessage(head, body, tail, size, topic, queue_id, sys_flag,
                              BORNHOST_POS + len(born_host), wait)

    def _encode_born_host(self, born_host: str, index: int | None) -> bytes:
        try:
            encoded = encode_address(born_host)
        except AddressError as exc:
            raise _illegal(str(exc), index) from None
        if len(self._born_hosts) < 4096:
            self._born_hosts[born_host] = encoded
        return encoded

    def _topic_bytes(self, topic: str, index: int | None) -> bytes:
        encoded = self._topics.get(topic)
        if encoded is None:
            encoded = topic.encode("utf-8")
            if len(encoded) > MAX_TOPIC_LENGTH_V1:  # the record's TOPICLENGTH is one byte
                raise _illegal(f"topic {topic[:40]!r}... is {len(encoded)} bytes, longer than "
                               f"{MAX_TOPIC_LENGTH_V1}", index)
            if len(self._topics) < 65536:
                self._topics[topic] = encoded
        return encoded

    def _schedule(self, topic: str, queue_id: int, properties: dict[str, str], sys_flag: int,
                  index: int | None) -> tuple[str, int, dict[str, str]]:
        """A DELAY level > 0 parks the message in SCHEDULE_TOPIC_XXXX, queue level - 1, remembering
        where it goes (RocketMQ's CommitLog.putMessage does this for non-transactional and commit messages).

        A level above the highest of ``messageDelayLevel`` is lowered to it and stored so, as RocketMQ
        4.9.8 does (``msg.setDelayTimeLevel(maxDelayLevel)``): its clients send such levels and expect
        the longest delay, not an error."""
        if transaction_type(sys_flag) not in (TRANSACTION_NOT_TYPE, TRANSACTION_COMMIT_TYPE):
            return topic, queue_id, properties
        delay = properties[PROPERTY_DELAY_TIME_LEVEL]
        levels = self.max_delay_level
        try:
            level = java_parse_int(delay)
        except ValueError:
            raise _illegal(f"{PROPERTY_DELAY_TIME_LEVEL} property {delay!r} is not an integer: give a delay level "
                           f"1..{levels} (messageDelayLevel), or 0 for none", index) from None
        if level <= 0:
            return topic, queue_id, properties
        if levels <= 0:
            raise _illegal(f"{PROPERTY_DELAY_TIME_LEVEL} level {level} cannot be served: messageDelayLevel defines "
                           "no delay levels on this store; send without DELAY", index)
        if level > levels:
            level = levels
            properties = {**properties, PROPERTY_DELAY_TIME_LEVEL: str(level)}
        properties = {**properties, PROPERTY_REAL_TOPIC: topic, PROPERTY_REAL_QUEUE_ID: str(queue_id)}
        return SCHEDULE_TOPIC, level - 1, properties


def _illegal(detail: str, index: int | None) -> PutMessageError:
    return PutMessageError(PutMessageStatus.MESSAGE_ILLEGAL, detail, index)
