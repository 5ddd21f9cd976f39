"""Validate a producer's Message and encode it into a record, outside the put lock.

Only the queue offset, the commitlog offset and the store timestamp are left to fill in under the
lock, so the time the lock is held per message stays a few struct writes.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.commitlog.put_result import PutMessageError, PutMessageStatus
from services.store.errors import InvalidArgumentError
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
    properties_to_string,
    transaction_type,
)
from services.store.record import (
    END_FILE_MIN_BLANK_LENGTH,
    MAX_PROPERTIES_LENGTH,
    encode_record,
    store_timestamp_pos,
)
from services.store.socket_address import AddressError, encode_address

_INT32 = (-(2**31), 2**31 - 1)


@dataclass(slots=True)
class EncodedMessage:
    record: bytes
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

    def encode(self, msg: Message, born_timestamp_default: int, index: int | None = None) -> EncodedMessage:
        """Raise PutMessageError (nothing written) for a message the store must refuse."""
        def illegal(detail: str) -> PutMessageError:
            return PutMessageError(PutMessageStatus.MESSAGE_ILLEGAL, detail, index)

        topic, queue_id, properties = msg.topic, msg.queue_id, msg.properties
        for name, value in (("flag", msg.flag), ("sys_flag", msg.sys_flag),
                            ("reconsume_times", msg.reconsume_times)):
            if not _INT32[0] <= value <= _INT32[1]:
                raise illegal(f"{name} {value} does not fit a 32-bit int")
        if queue_id < 0:
            raise illegal(f"queue id {queue_id} is negative")
        if msg.born_timestamp < 0:
            raise illegal(f"born timestamp {msg.born_timestamp} is negative")
        born_host = self._born_hosts.get(msg.born_host)
        if born_host is None:
            try:
                born_host = encode_address(msg.born_host)
            except AddressError as exc:
                raise illegal(str(exc)) from None
            if len(self._born_hosts) < 4096:
                self._born_hosts[msg.born_host] = born_host
        sys_flag = msg.sys_flag & ~(BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG)
        sys_flag |= self._store_v6 | (BORNHOST_V6_FLAG if len(born_host) > 8 else 0)

        delay = properties.get(PROPERTY_DELAY_TIME_LEVEL)
        if delay is not None and transaction_type(sys_flag) in (TRANSACTION_NOT_TYPE, TRANSACTION_COMMIT_TYPE):
            try:
                level = int(delay)
            except ValueError:
                raise illegal(f"{PROPERTY_DELAY_TIME_LEVEL} property {delay!r} is not an integer") from None
            if level > 0:
                # Delayed delivery: park the message in SCHEDULE_TOPIC_XXXX, queue = level - 1.
                level = min(level, self.max_delay_level)
                properties = {**properties, PROPERTY_REAL_TOPIC: topic, PROPERTY_REAL_QUEUE_ID: str(queue_id)}
                topic, queue_id = SCHEDULE_TOPIC, level - 1

        try:
            props_text = properties_to_string(properties) if properties else ""
        except TypeError:
            raise illegal("property names and values must be strings") from None
        if properties and any(NAME_VALUE_SEPARATOR in s or PROPERTY_SEPARATOR in s
                              for kv in properties.items() for s in kv):
            raise illegal("property names and values must not contain \\x01 or \\x02")
        props = props_text.encode("utf-8")
        if len(props) > MAX_PROPERTIES_LENGTH:
            raise PutMessageError(PutMessageStatus.PROPERTIES_SIZE_EXCEEDED,
                                  f"properties are {len(props)} bytes, more than {MAX_PROPERTIES_LENGTH}", index)
        topic_bytes = topic.encode("utf-8")
        record = encode_record(
            topic=topic_bytes, queue_id=queue_id, body=msg.body, flag=msg.flag, properties=props,
            sys_flag=sys_flag, born_timestamp=msg.born_timestamp or born_timestamp_default,
            born_host=born_host, store_host=self.store_host, reconsume_times=msg.reconsume_times,
            prepared_transaction_offset=msg.prepared_transaction_offset,
        )
        if len(record) > self._max_record:
            raise illegal(f"message is {len(record)} bytes stored, more than the limit {self._max_record} "
                          "(maxMessageSize, or the commitlog file size less 8)")
        return EncodedMessage(record, topic, queue_id, sys_flag, store_timestamp_pos(sys_flag),
                              properties.get(PROPERTY_WAIT_STORE_MSG_OK) != "false")


def check_int64(name: str, value: int) -> None:
    if not -(2**63) <= value < 2**63:
        raise InvalidArgumentError(f"{name} {value} does not fit a 64-bit int")
