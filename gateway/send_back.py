"""Consumer retry and dead letters: RocketMQ 4.9.8's ``SendMessageProcessor.asyncConsumerSendMsgBack``.

A consumer that cannot handle a message now hands it back. The gateway reads the copy it consumed
(by offset msg id: a UNIQ_KEY finds the *first* stored copy, whose reconsume times are 0) and stores a
new record built from it:

* under ``%RETRY%<group>`` (1 queue, perm 6) with ``DELAY`` = the delay level (0 means 3 + reconsume
  times), which the commitlog turns into a ``SCHEDULE_TOPIC_XXXX`` record with ``REAL_TOPIC`` /
  ``REAL_QID``: the scheduler delivers it to the retry topic when due;
* under ``%DLQ%<group>`` (1 queue, perm 6) at once when the consumed copy's reconsume times reached
  ``maxReconsumeTimes`` (16 by default) or the level is -1.

Either way the body, flag, born timestamp / host and every property stay (the ``UNIQ_KEY`` too, so
the message keeps its msg id); ``RETRY_TOPIC`` names the original topic (set once, on the first send
back), ``ORIGIN_MESSAGE_ID`` the first copy's offset msg id, ``WAIT`` is "false", reconsume times
grow by one. The record goes through the commitlog's Append with ``group_flow`` set: every producer
rule but the group-topic one still applies, and the store's DELAY handling is the one all sends get.
"""

from __future__ import annotations

from dataclasses import dataclass

from mqstore.v1 import common_pb2, query_pb2
from services.store.errors import InvalidArgumentError
from services.store.formats.message import COMPRESSED_FLAG, PROPERTY_DELAY_TIME_LEVEL, PROPERTY_WAIT_STORE_MSG_OK
from services.store.formats.message_id import MessageIdKind, check_message_id
from services.store.rules.names import DLQ_GROUP_TOPIC_PREFIX, MAX_TOPIC_LENGTH, RETRY_GROUP_TOPIC_PREFIX, check_group
from services.store.rules.producer_message import COMPRESSION_TYPE_MASK, PRODUCER_SYS_FLAGS

PROPERTY_RETRY_TOPIC = "RETRY_TOPIC"
PROPERTY_ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
#: RocketMQ's SubscriptionGroupConfig.retryMaxTimes default.
DEFAULT_MAX_RECONSUME_TIMES = 16
#: MixAll's retry / DLQ queue counts (retryQueueNums, DLQ_NUMS_PER_GROUP).
GROUP_TOPIC_QUEUES = 1
#: Read and write: a dead letter can be pulled to inspect and re-send it (``mqstore dlq``).
GROUP_TOPIC_PERM = 6
#: Highest max_reconsume_times accepted (RocketMQ's client caps it at 16 for orderly, leaves it open
#: otherwise; a bound keeps the value meaningful).
MAX_RECONSUME_TIMES_LIMIT = 1000


def retry_topic(group: str) -> str:
    return RETRY_GROUP_TOPIC_PREFIX + group


def dlq_topic(group: str) -> str:
    return DLQ_GROUP_TOPIC_PREFIX + group


@dataclass(frozen=True, slots=True)
class SendBackPlan:
    """What one send-back stores: the record and where."""

    message: common_pb2.Message
    target_topic: str
    dead_letter: bool
    delay_level: int
    origin_msg_id: str


def check_send_back(group: str, msg_id: str, delay_level: int, max_reconsume_times: int | None,
                    reconsume_times: int | None = None) -> None:
    """The request's own checks (before any lookup): INVALID_ARGUMENT naming what to fix."""
    check_group(group)
    longest = len(DLQ_GROUP_TOPIC_PREFIX) + len(group)
    if max(len(RETRY_GROUP_TOPIC_PREFIX), len(DLQ_GROUP_TOPIC_PREFIX)) + len(group) > MAX_TOPIC_LENGTH:
        raise InvalidArgumentError(f"consumer group {group[:40]!r}... is too long for a retry topic: "
                                   f"{longest} > {MAX_TOPIC_LENGTH} characters with its %RETRY% / %DLQ% prefix; "
                                   f"use at most {MAX_TOPIC_LENGTH - len(RETRY_GROUP_TOPIC_PREFIX)} characters")
    if not msg_id:
        raise InvalidArgumentError("msg_id is empty: give the offset msg id of the message consumed")
    check_message_id(msg_id, MessageIdKind.UNSPECIFIED)
    if delay_level < -1:
        raise InvalidArgumentError(f"delay_level {delay_level} is negative: give 0 (3 + reconsume times), a delay "
                                   "level 1..n, or -1 (dead letter at once)")
    if max_reconsume_times is not None and not 0 <= max_reconsume_times <= MAX_RECONSUME_TIMES_LIMIT:
        raise InvalidArgumentError(f"max_reconsume_times {max_reconsume_times} is out of range: give "
                                   f"0..{MAX_RECONSUME_TIMES_LIMIT}, or leave it unset for "
                                   f"{DEFAULT_MAX_RECONSUME_TIMES}")
    if reconsume_times is not None and not 0 <= reconsume_times <= MAX_RECONSUME_TIMES_LIMIT:
        raise InvalidArgumentError(f"reconsume_times {reconsume_times} is out of range: give "
                                   f"0..{MAX_RECONSUME_TIMES_LIMIT}, or leave it unset for the consumed copy's + 1")


def original_topic(stored: query_pb2.StoredMessage) -> str:
    """The topic the message was first sent to (a retried copy lives under %RETRY%<group>)."""
    topic: str = stored.properties.get(PROPERTY_RETRY_TOPIC) or stored.topic
    return topic


def plan_send_back(stored: query_pb2.StoredMessage, group: str, delay_level: int,
                   max_reconsume_times: int | None, reconsume_times: int | None = None) -> SendBackPlan:
    """asyncConsumerSendMsgBack's new record, built from the copy consumed; ``reconsume_times``: the new
    copy's, when the consumer counted deliveries itself (else the consumed copy's + 1)."""
    limit = DEFAULT_MAX_RECONSUME_TIMES if max_reconsume_times is None else max_reconsume_times
    properties = dict(stored.properties)
    properties.setdefault(PROPERTY_RETRY_TOPIC, stored.topic)
    properties[PROPERTY_WAIT_STORE_MSG_OK] = "false"
    origin = properties.get(PROPERTY_ORIGIN_MESSAGE_ID) or stored.msg_id
    properties[PROPERTY_ORIGIN_MESSAGE_ID] = origin
    dead_letter = stored.reconsume_times >= limit or delay_level < 0
    if dead_letter:
        topic = dlq_topic(group)
        level = 0
        properties.pop(PROPERTY_DELAY_TIME_LEVEL, None)
    else:
        topic = retry_topic(group)
        level = delay_level or 3 + stored.reconsume_times
        properties[PROPERTY_DELAY_TIME_LEVEL] = str(level)
    # The query service hands out a decompressed body unless body_compressed: the record's sys_flag
    # must say what its body is. Transaction bits are the transaction flow's, not a retry's.
    sys_flag = stored.sys_flag & PRODUCER_SYS_FLAGS
    if not stored.body_compressed:
        sys_flag &= ~(COMPRESSED_FLAG | COMPRESSION_TYPE_MASK)
    message = common_pb2.Message(topic=topic, queue_id=0, body=stored.body, flag=stored.flag,
                                 properties=properties, born_timestamp=stored.born_timestamp,
                                 born_host=stored.born_host, sys_flag=sys_flag,
                                 reconsume_times=stored.reconsume_times + 1 if reconsume_times is None
                                 else reconsume_times)
    return SendBackPlan(message, topic, dead_letter, level, origin)
