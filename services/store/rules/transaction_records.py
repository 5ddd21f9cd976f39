"""Transactional messages on disk: RocketMQ 4.9.8's half / op records (docs/transactions.md).

The records every party must agree on, built here once (the gateway writes halves, the scheduler
writes commits, ops, put-back halves and discards; ``mqstore inspect`` and a RocketMQ broker read them):

* **half** (``SendMessageProcessor`` + ``TransactionalMessageBridge.parseHalfMessageInner``): the
  producer's message under ``RMQ_SYS_TRANS_HALF_TOPIC`` queue 0, with ``REAL_TOPIC`` / ``REAL_QID``
  added and the transaction type of its sys_flag reset to NOT_TYPE (so it takes a queue offset in the
  half queue: the checker reads halves through that queue). ``TRAN_MSG`` = "true" and ``PGROUP`` stay.
* **commit** (``EndTransactionProcessor.endMessageTransaction``): the half's body, flag, born
  timestamp / host, reconsume times and sys_flag with the COMMIT type, under ``REAL_TOPIC`` /
  ``REAL_QID``; prepared transaction offset = the half's commitlog offset. The properties string is
  the half's *whole* map: 4.9.8 serialises it before it clears ``REAL_TOPIC`` / ``REAL_QID`` /
  ``TRAN_MSG`` from the map only, so a committed record carries them (consumers see ``TRAN_MSG``).
* **op** (``TransactionalMessageBridge.addRemoveTagInTransactionOp``): topic
  ``RMQ_SYS_TRANS_OP_HALF_TOPIC``, the half's queue id, tags ``d``, body = the half's queue offset in
  decimal, sys_flag 0, properties ``TAGS`` and ``WAIT`` = "true" (4.9.8 serialises the ``new Message``'s
  map, before it sets WAIT false and a UNIQ_KEY on the copy).
* **put-back** (``TransactionalMessageServiceImpl.putBackHalfMsgQueue``): a check re-puts the half
  to the half queue with ``TRANSACTION_CHECK_TIMES`` counted up; the check names the new copy.
* **discard** (``DefaultTransactionalMessageCheckListener.resolveDiscardMsg``): a half checked
  ``transactionCheckMax`` times goes to ``TRANS_CHECK_MAX_TIME_TOPIC`` queue 0 with all its properties.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from services.store.errors import InvalidArgumentError
from services.store.formats.message import (
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TAGS,
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_WAIT_STORE_MSG_OK,
    STOREHOSTADDRESS_V6_FLAG,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_TYPE_MASK,
    Message,
    MessageRecord,
)
from services.store.formats.record import java_parse_int, real_destination
from services.store.rules.names import check_producer_group
from services.store.store_root import read_with_backup, write_atomically

HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
OP_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
CHECK_MAX_TIME_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"
#: Topics only the transaction flow writes (AppendRequest.transaction_flow); each has one queue.
TRANSACTION_TOPICS = frozenset({HALF_TOPIC, OP_TOPIC, CHECK_MAX_TIME_TOPIC})
TRANSACTION_TOPIC_QUEUES = 1
#: TransactionalMessageUtil.REMOVETAG
REMOVE_TAG = "d"
PROPERTY_PRODUCER_GROUP = "PGROUP"
PROPERTY_TRANSACTION_CHECK_TIMES = "TRANSACTION_CHECK_TIMES"
PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS = "CHECK_IMMUNITY_TIME_IN_SECONDS"
PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET = "TRAN_PREPARED_QUEUE_OFFSET"
#: BrokerConfig defaults: transactionTimeOut (ms), transactionCheckMax, transactionCheckInterval (ms).
DEFAULT_TRANSACTION_TIMEOUT_MS = 6_000
DEFAULT_TRANSACTION_CHECK_MAX = 15
DEFAULT_TRANSACTION_CHECK_INTERVAL_MS = 60_000


#: The checker's progress under the scheduler's store (``config/``): ``{"halfOffset": h, "opOffset": o}``.
CHECK_OFFSETS_FILE = "transactionOffset.json"
#: The consumer group RocketMQ keeps the same two offsets under (MixAll.CID_SYS_RMQ_TRANS).
CHECK_CONSUMER_GROUP = "CID_RMQ_SYS_TRANS"


class NotAHalf(ValueError):
    """A record that is not a usable half (wrong topic, no REAL_TOPIC / REAL_QID)."""


def is_transactional(properties: Mapping[str, str]) -> bool:
    """The producer asked for a half: ``TRAN_MSG`` = "true" (Boolean.parseBoolean, case-insensitive)."""
    return properties.get(PROPERTY_TRANSACTION_PREPARED, "").lower() == "true"


def check_half_properties(properties: Mapping[str, str]) -> str:
    """The producer group of a half to be sent; INVALID_ARGUMENT for what a half may not carry."""
    group = properties.get(PROPERTY_PRODUCER_GROUP, "")
    if not group:
        raise InvalidArgumentError("a transactional message (TRAN_MSG=true) needs the PGROUP property: the producer "
                                   "group whose producers answer its checks")
    check_producer_group(group)  # before anything is stored: a half no EndTransaction could name would wait
    if PROPERTY_DELAY_TIME_LEVEL in properties:
        raise InvalidArgumentError("a transactional message cannot be delayed (DELAY): RocketMQ's producer clears it; "
                                   "send it without DELAY")
    for name in (PROPERTY_REAL_TOPIC, PROPERTY_REAL_QUEUE_ID, PROPERTY_TRANSACTION_CHECK_TIMES):
        if name in properties:
            raise InvalidArgumentError(f"a transactional message may not set {name}: the store sets it")
    return group


def reset_transaction_type(sys_flag: int, kind: int) -> int:
    """MessageSysFlag.resetTransactionValue (the store-host IPv6 bit is the commitlog's to set)."""
    return (sys_flag & ~TRANSACTION_TYPE_MASK & ~STOREHOSTADDRESS_V6_FLAG) | kind


def real_queue(record: MessageRecord) -> tuple[str, int]:
    """A half's REAL_TOPIC and REAL_QID."""
    if record.topic != HALF_TOPIC:
        raise NotAHalf(f"the record at commitlog offset {record.commitlog_offset} is a message of topic "
                       f"{record.topic!r}, not a half ({HALF_TOPIC})")
    try:
        return real_destination(record.properties)
    except ValueError as exc:
        raise NotAHalf(f"the half at commitlog offset {record.commitlog_offset}: {exc}") from None


def commit_of(half: MessageRecord) -> Message:
    """endMessageTransaction + the COMMIT type and prepared offset EndTransactionProcessor sets."""
    topic, queue_id = real_queue(half)
    return Message(topic, queue_id, half.body, half.flag, dict(half.properties), half.born_timestamp,
                   half.born_host, reset_transaction_type(half.sys_flag, TRANSACTION_COMMIT_TYPE),
                   half.reconsume_times, half.commitlog_offset)


def op_of(half: MessageRecord, born_timestamp: int, born_host: str) -> Message:
    """makeOpMessageInner: the op record that marks the half at ``half.queue_offset`` done."""
    properties = {PROPERTY_TAGS: REMOVE_TAG, PROPERTY_WAIT_STORE_MSG_OK: "true"}
    return Message(OP_TOPIC, half.queue_id, str(half.queue_offset).encode(), 0, properties, born_timestamp,
                   born_host, 0, 0, 0)


def check_times(record: MessageRecord) -> int | None:
    """TRANSACTION_CHECK_TIMES of a half (None before its first check; a bad value counts as 0)."""
    text = record.properties.get(PROPERTY_TRANSACTION_CHECK_TIMES)
    if text is None:
        return None
    try:
        return java_parse_int(text)
    except ValueError:
        return 0


def put_back_of(half: MessageRecord, times: int | None) -> Message:
    """renewHalfMessageInner with TRANSACTION_CHECK_TIMES = ``times`` (needDiscard counted it); None keeps
    the half's own (a half put back unchecked)."""
    properties = dict(half.properties)
    if times is not None:
        properties[PROPERTY_TRANSACTION_CHECK_TIMES] = str(times)
    return Message(HALF_TOPIC, half.queue_id, half.body, half.flag, properties, half.born_timestamp,
                   half.born_host, half.sys_flag & ~STOREHOSTADDRESS_V6_FLAG, half.reconsume_times, 0)


def immune_put_back_of(half: MessageRecord) -> Message:
    """renewImmunityHalfMessageInner: a half still within its CHECK_IMMUNITY_TIME_IN_SECONDS re-put (so it
    does not hold the half queue), remembering the first copy's queue offset in TRAN_PREPARED_QUEUE_OFFSET."""
    properties = dict(half.properties)
    properties.setdefault(PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET, str(half.queue_offset))
    return Message(HALF_TOPIC, half.queue_id, half.body, half.flag, properties, half.born_timestamp,
                   half.born_host, half.sys_flag & ~STOREHOSTADDRESS_V6_FLAG, half.reconsume_times, 0)


def discard_of(half: MessageRecord) -> Message:
    """toMessageExtBrokerInner: the half moved to TRANS_CHECK_MAX_TIME_TOPIC queue 0."""
    return Message(CHECK_MAX_TIME_TOPIC, 0, half.body, half.flag, dict(half.properties), half.born_timestamp,
                   half.born_host, half.sys_flag & ~STOREHOSTADDRESS_V6_FLAG, half.reconsume_times, 0)


def immunity_ms(record: MessageRecord, timeout_ms: int) -> int:
    """How old a half must be before its first check: CHECK_IMMUNITY_TIME_IN_SECONDS, else the timeout."""
    text = record.properties.get(PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS)
    if text is None:
        return timeout_ms
    try:
        return java_parse_int(text) * 1000
    except ValueError:
        return timeout_ms


def op_half_offset(record: MessageRecord) -> int | None:
    """The half queue offset an op record marks done (None for an op that is not a REMOVE_TAG one)."""
    if record.properties.get(PROPERTY_TAGS) != REMOVE_TAG:
        return None
    try:
        return int(record.body.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        return None


def read_check_offsets(path: Path) -> tuple[int, int] | None:
    """(half offset, op offset) from the file or its ``.bak``; None when neither exists, ValueError when
    what exists is unreadable."""
    return read_with_backup(path, _parse_check_offsets)


def _parse_check_offsets(data: bytes) -> tuple[int, int]:
    doc = json.loads(data)
    return int(doc["halfOffset"]), int(doc["opOffset"])


def write_check_offsets(path: Path, half_offset: int, op_offset: int) -> None:
    data = json.dumps({"halfOffset": half_offset, "opOffset": op_offset}).encode()
    write_atomically(path, data, keep_backup=True)


def check_consumer_offsets(path: Path) -> dict[str, dict[str, int]]:
    """The checker's progress as RocketMQ's consumer offsets of CID_RMQ_SYS_TRANS (for
    consumerOffset.json); empty when the checker never moved (0 is where a broker starts anyway).
    ValueError when the file is unreadable."""
    offsets = read_check_offsets(path)
    if offsets is None or offsets == (0, 0):
        return {}
    half_offset, op_offset = offsets
    return {f"{HALF_TOPIC}@{CHECK_CONSUMER_GROUP}": {"0": half_offset},
            f"{OP_TOPIC}@{CHECK_CONSUMER_GROUP}": {"0": op_offset}}
