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
  (:func:`services.store.rules.names.check_producer_topic`).
* a ``UNIQ_KEY`` the producer chose is a real one (32 or 56 hex digits, what RocketMQ clients make):
  it is echoed back as the msg id and must be found by it.
* a body flagged compressed (zlib) inflates by the readers' rule (``mqstore.client.compression``):
  one the readers would hand over still compressed is refused instead of acknowledged.

A batch (a SendBatch of messages, a blob entry: ``batch_codec.py``, a stream's message) is checked with
:func:`check_producer_request` for what a blob carries once per request and :func:`check_batch_entry` for
each message: one rule set for every form, which adds to the single send's rules that a batch holds no
transactional message (a half is sent alone, as RocketMQ's batches refuse them).
"""

from __future__ import annotations

from collections.abc import Mapping

from mqstore.client.compression import COMPRESSION_TYPE_MASK as COMPRESSION_TYPE_MASK
from mqstore.client.compression import NotInflatable, inflate, is_zlib
from services.store.errors import InvalidArgumentError
from services.store.formats.message import (
    BORNHOST_V6_FLAG,
    COMPRESSED_FLAG,
    MULTI_TAGS_FLAG,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    STOREHOSTADDRESS_V6_FLAG,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_NOT_TYPE,
    TRANSACTION_TYPE_MASK,
)
from services.store.formats.message_id import is_hex_digits
from services.store.formats.uniq_key import UNIQ_KEY_LENGTHS
from services.store.rules.names import check_producer_topic, check_topic_name, is_group_topic, is_system_topic
from services.store.rules.transaction_records import TRANSACTION_TOPICS, is_transactional

PRODUCER_SYS_FLAGS = COMPRESSED_FLAG | MULTI_TAGS_FLAG | BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG | \
    COMPRESSION_TYPE_MASK


def check_producer_message(topic: str, properties: Mapping[str, str], flag: int, sys_flag: int,
                           born_timestamp: int, reconsume_times: int, prepared_transaction_offset: int,
                           index: int | None = None, group_flow: bool = False,
                           transaction_flow: bool = False) -> None:
    """Raises InvalidArgumentError (naming the message of a batch) for what a producer may not send.

    ``group_flow``: the message comes from the consumer send-back flow (the gateway's), which writes a
    group's ``%RETRY%`` / ``%DLQ%`` topic; system topics stay refused. ``transaction_flow``: a record of
    the transaction flow (``services/store/rules/transaction_records.py``): the half / op / check-max topics and the
    commit type are allowed. The body is :func:`check_producer_body`'s."""
    check_producer_request(topic, sys_flag, born_timestamp, index, group_flow, transaction_flow)
    _check_message_fields(properties, flag, reconsume_times, prepared_transaction_offset, index)


def check_producer_request(topic: str, sys_flag: int, born_timestamp: int, index: int | None = None,
                           group_flow: bool = False, transaction_flow: bool = False) -> None:
    """The fields a batch blob carries once for all its messages: topic, sys_flag, born timestamp."""
    if transaction_flow:
        if sys_flag & TRANSACTION_TYPE_MASK not in (TRANSACTION_NOT_TYPE, TRANSACTION_COMMIT_TYPE):
            raise InvalidArgumentError.of_message(index, f"sys_flag {sys_flag:#x}: the transaction flow writes only "
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
            raise InvalidArgumentError.of_message(index, str(exc)) from None
    if sys_flag & ~PRODUCER_SYS_FLAGS:
        raise InvalidArgumentError.of_message(
            index, f"sys_flag {sys_flag:#x} sets bits a producer may not set "
            f"({sys_flag & ~PRODUCER_SYS_FLAGS:#x}): allowed are compression 0x1 with its type 0x700, "
            "multiple tags 0x2 and IPv6 born host 0x10; transaction bits come from the transaction flow")
    if born_timestamp < 0:
        raise InvalidArgumentError.of_message(index, f"born_timestamp {born_timestamp} is negative: give milliseconds "
                                              "since the epoch, or 0 for the store's clock")


def _check_message_fields(properties: Mapping[str, str], flag: int, reconsume_times: int,
                          prepared_transaction_offset: int, index: int | None) -> None:
    if flag < 0 or reconsume_times < 0 or prepared_transaction_offset < 0:  # one test on the put path
        name, value = next((n, v) for n, v in (("flag", flag), ("reconsume_times", reconsume_times),
                                               ("prepared_transaction_offset", prepared_transaction_offset))
                           if v < 0)
        raise InvalidArgumentError.of_message(index, f"{name} {value} is negative")
    uniq_key = properties.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX)
    if uniq_key is not None and not (len(uniq_key) in UNIQ_KEY_LENGTHS and is_hex_digits(uniq_key)):
        raise InvalidArgumentError.of_message(index, f"UNIQ_KEY {uniq_key[:60]!r} must be 32 (IPv4 producer) "
                                              "or 56 (IPv6) hex digits, as RocketMQ clients make them; leave it out "
                                              "to get one")


def check_producer_body(body: bytes, sys_flag: int, index: int | None = None) -> None:
    """A producer's body: not empty (the RocketMQ client's Validators.checkMessage: an empty body is a
    mistake, not a message), and inflatable if flagged compressed (:func:`check_compressed_body`)."""
    if not body:
        raise InvalidArgumentError.of_message(index, "the message body is empty: give a body of at least one byte")
    check_compressed_body(body, sys_flag, index)


def check_compressed_body(body: bytes, sys_flag: int, index: int | None = None) -> None:
    """A body flagged zlib-compressed must inflate by the readers' rule, or readers could only hand it
    over still compressed. LZ4 and ZSTD (sysflag bits 8-10) have no codec here: stored as sent."""
    if not sys_flag & COMPRESSED_FLAG or not is_zlib(sys_flag):
        return
    try:
        inflate(body)
    except NotInflatable as exc:
        raise InvalidArgumentError.of_message(index, f"sys_flag {sys_flag:#x} marks the body compressed, but {exc}: "
                                              "send it zlib-compressed whole (as RocketMQ clients compress), or clear "
                                              "the compressed flag 0x1") from None


def check_batch_entry(properties: Mapping[str, str], flag: int, body: bytes, sys_flag: int, index: int,
                      reconsume_times: int = 0, prepared_transaction_offset: int = 0) -> None:
    """Every rule on one message of a producer's batch, whichever form carries it: a message of
    SendBatch (after :func:`check_producer_request` of its own topic, sys_flag and born timestamp) or
    a blob entry (``sys_flag`` the request's; reconsume_times and prepared offset 0)."""
    _check_message_fields(properties, flag, reconsume_times, prepared_transaction_offset, index)
    check_producer_body(body, sys_flag, index)
    refuse_transactional(properties, index)


def refuse_transactional(properties: Mapping[str, str], index: int | None) -> None:
    """Batches and streams: a transactional message (``TRAN_MSG`` = "true") is sent alone, as a half."""
    if is_transactional(properties):
        raise InvalidArgumentError.of_message(index, "a transactional message (TRAN_MSG=true) cannot be sent "
                                              "in a batch or a stream: send each half alone with Send (or "
                                              "TransactionProducer)")


def check_group_flow_topic(topic: str) -> None:
    """A send-back's topic: a legal name of a group's retry or dead-letter topic."""
    check_topic_name(topic)
    if not is_group_topic(topic):
        raise InvalidArgumentError(f"topic {topic!r} is not a consumer group's %RETRY% or %DLQ% topic")
