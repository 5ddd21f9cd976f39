"""What a producer may put in a message, checked at every edge a message enters (the gateway, the
commitlog service): the rest of a record's fields belong to the store and its own flows.

* ``sys_flag``: only the bits a producer sets (compression and its type, multiple tags, an IPv6
  born host; the IPv6 store host bit is the store's and is overwritten). The transaction bits
  (prepared 0x4, commit 0x8, rollback 0xC) come only from the transaction flow: a prepared or
  rolled-back record takes no queue offset, so one sent as a plain message would never reach a
  consumer while its producer was told PUT_OK.
* ``flag``, ``reconsume_times`` and ``prepared_transaction_offset`` are never negative, and a
  (``prepared_transaction_offset`` is the transaction flow's commitlog offset; producers leave it 0).
* the topic is not a system topic nor a consumer group's retry or dead-letter topic
  (:func:`mqstore.services.store.names.check_producer_topic`).
* a ``UNIQ_KEY`` the producer chose is a real one (32 or 56 hex digits, what RocketMQ clients make):
  it is echoed back as the msg id and must be found by it.
"""

from __future__ import annotations

from collections.abc import Mapping

from mqstore.services.store.errors import InvalidArgumentError
from mqstore.services.store.message import (
    BORNHOST_V6_FLAG,
    COMPRESSED_FLAG,
    MULTI_TAGS_FLAG,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    STOREHOSTADDRESS_V6_FLAG,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_NOT_TYPE,
    TRANSACTION_TYPE_MASK,
)
from mqstore.services.store.message_id import is_hex_digits
from mqstore.services.store.names import check_producer_topic, check_topic_name, is_group_topic, is_system_topic
from mqstore.services.store.transactions import TRANSACTION_TOPICS
from mqstore.services.store.uniq_key import UNIQ_KEY_LENGTHS

#: RocketMQ 4.9.8's compression type, bits 8-10 of sys_flag (LZ4 1, ZSTD 2, ZLIB 3).
COMPRESSION_TYPE_MASK = 0x7 << 8
PRODUCER_SYS_FLAGS = COMPRESSED_FLAG | MULTI_TAGS_FLAG | BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG | \
    COMPRESSION_TYPE_MASK


def _where(index: int | None) -> str:
    return "" if index is None else f"message #{index}: "


def check_producer_message(topic: str, properties: Mapping[str, str], flag: int, sys_flag: int,
                           born_timestamp: int, reconsume_times: int, prepared_transaction_offset: int,
                           index: int | None = None, group_flow: bool = False,
                           transaction_flow: bool = False) -> None:
    """Raises InvalidArgumentError (naming the message of a batch) for what a producer may not send.

    ``group_flow``: the message comes from the consumer send-back flow (the gateway's), which writes a
    group's ``%RETRY%`` / ``%DLQ%`` topic; system topics stay refused. ``transaction_flow``: a record of
    the transaction flow (``services/store/transactions.py``): the half / op / check-max topics and the
    commit type are allowed."""
    if transaction_flow:
        if sys_flag & TRANSACTION_TYPE_MASK not in (TRANSACTION_NOT_TYPE, TRANSACTION_COMMIT_TYPE):
            raise InvalidArgumentError(f"{_where(index)}sys_flag {sys_flag:#x}: the transaction flow writes only "
                                       "NOT_TYPE (half, op) and COMMIT_TYPE records")
        sys_flag &= ~TRANSACTION_TYPE_MASK
        if topic not in TRANSACTION_TOPICS:
            check_producer_topic(topic)
    elif group_flow and is_group_topic(topic):
        check_group_flow_topic(topic)
    elif is_system_topic(topic) or is_group_topic(topic):
        try:
            check_producer_topic(topic)
        except InvalidArgumentError as exc:
            raise InvalidArgumentError(f"{_where(index)}{exc}") from None
    if sys_flag & ~PRODUCER_SYS_FLAGS:
        raise InvalidArgumentError(
            f"{_where(index)}sys_flag {sys_flag:#x} sets bits a producer may not set "
            f"({sys_flag & ~PRODUCER_SYS_FLAGS:#x}): allowed are compression 0x1 with its type 0x700, "
            "multiple tags 0x2 and IPv6 born host 0x10; transaction bits come from the transaction flow")
    if flag < 0 or reconsume_times < 0 or prepared_transaction_offset < 0:  # one test on the put path
        name, value = next((n, v) for n, v in (("flag", flag), ("reconsume_times", reconsume_times),
                                               ("prepared_transaction_offset", prepared_transaction_offset))
                           if v < 0)
        raise InvalidArgumentError(f"{_where(index)}{name} {value} is negative")
    if born_timestamp < 0:
        raise InvalidArgumentError(f"{_where(index)}born_timestamp {born_timestamp} is negative: give milliseconds "
                                   "since the epoch, or 0 for the store's clock")
    uniq_key = properties.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX)
    if uniq_key is not None and not (len(uniq_key) in UNIQ_KEY_LENGTHS and is_hex_digits(uniq_key)):
        raise InvalidArgumentError(f"{_where(index)}UNIQ_KEY {uniq_key[:60]!r} must be 32 (IPv4 producer) or 56 "
                                   "(IPv6) hex digits, as RocketMQ clients make them; leave it out to get one")


def check_group_flow_topic(topic: str) -> None:
    """A send-back's topic: a legal name of a group's retry or dead-letter topic."""
    check_topic_name(topic)
    if not is_group_topic(topic):
        raise InvalidArgumentError(f"topic {topic!r} is not a consumer group's %RETRY% or %DLQ% topic")


def check_blob_entry(flag: int, uniq_key: str, index: int) -> None:
    """The per-message rules for an entry of a batch blob (``batch_codec.py``): its topic, sys_flag and
    born timestamp are the request's, checked once by :func:`check_producer_message`; ``uniq_key`` is ""
    when the entry has none."""
    if flag < 0:
        raise InvalidArgumentError(f"message #{index}: flag {flag} is negative")
    if uniq_key and not (len(uniq_key) in UNIQ_KEY_LENGTHS and is_hex_digits(uniq_key)):
        raise InvalidArgumentError(f"message #{index}: UNIQ_KEY {uniq_key[:60]!r} must be 32 (IPv4 producer) or 56 "
                                   "(IPv6) hex digits, as RocketMQ clients make them; leave it out to get one")
