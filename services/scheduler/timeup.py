"""What a due delayed or timer message becomes.

Delay levels, RocketMQ 4.9.8's ``ScheduleMessageService.messageTimeup``: the re-put message keeps
body, flag, sys_flag, born timestamp, born host, reconsume times and every property (REAL_TOPIC,
REAL_QID and DELAY included: 4.9.8 serialises the properties string *before* it clears DELAY, so its
record still carries DELAY=n); its topic and queue are REAL_TOPIC / REAL_QID; the prepared transaction
offset is 0 (messageTimeup does not copy it). The scheduler appends it as a due message
(``scheduled_delivery``) so that the store does not park it again for its DELAY.

Timers, RocketMQ 5's ``TimerMessageStore.convert`` / ``convertMessage``: the same fields, every
property kept (TIMER_OUT_MS, REAL_TOPIC, REAL_QID, the producer's TIMER_*), plus TIMER_ENQUEUE_MS (when
the scheduler took the message into its timer store) and TIMER_DEQUEUE_MS (when it delivered it).

The store gives the record a new store timestamp, store host (the same commitlog service), commitlog
and queue offsets, and the indexer a tags code of its TAGS (not a deliver time: the topic is not
SCHEDULE_TOPIC_XXXX).

So a re-put and the parked record it came from share a :func:`reput_key`: what a restart matches the
re-puts it finds in the log against the units it would deliver.
"""

from __future__ import annotations

from zlib import crc32

from services.store.formats.message import Message, MessageRecord
from services.store.formats.parked_record import ParkedRecord
from services.store.formats.record import real_destination
from services.store.rules.timer_message import PROPERTY_TIMER_DEQUEUE_MS, PROPERTY_TIMER_ENQUEUE_MS

#: a whole decoded record, or just the fields a re-put copies (the scheduler's, cheaper to decode)
Parked = MessageRecord | ParkedRecord


class NotDeliverable(ValueError):
    """A scheduled record without a usable REAL_TOPIC / REAL_QID: RocketMQ logs and passes over it."""


def message_timeup(record: Parked) -> Message:
    return _real_message(record, dict(record.properties))


def timer_timeup(record: Parked, enqueue_ms: int, dequeue_ms: int) -> Message:
    properties = {**record.properties, PROPERTY_TIMER_ENQUEUE_MS: str(enqueue_ms),
                  PROPERTY_TIMER_DEQUEUE_MS: str(dequeue_ms)}
    return _real_message(record, properties)


def _real_message(record: Parked, properties: dict[str, str]) -> Message:
    try:
        topic, queue_id = real_destination(properties)
    except ValueError as exc:
        raise NotDeliverable(f"record at commitlog offset {record.commitlog_offset}: {exc}") from None
    return Message(topic=topic, queue_id=queue_id, body=record.body, flag=record.flag, properties=properties,
                   born_timestamp=record.born_timestamp, born_host=record.born_host, sys_flag=record.sys_flag,
                   reconsume_times=record.reconsume_times, prepared_transaction_offset=0)


#: born time, born host, flag, reconsume times, body length and CRC, the properties
ReputKey = tuple[int, str, int, int, int, int, frozenset[tuple[str, str]]]
_ADDED_AT_TIMEUP = (PROPERTY_TIMER_ENQUEUE_MS, PROPERTY_TIMER_DEQUEUE_MS)


def reput_key(record: Parked) -> ReputKey:
    """What a parked record and its re-put have in common: every field the re-put copies, the
    properties less the two a timer re-put adds. Two records share a key only when they are the same
    message (UNIQ_KEY, REAL_TOPIC, REAL_QID, DELAY or TIMER_OUT_MS included): a producer's retried
    send parked twice, whose copies no consumer can tell apart."""
    properties = record.properties
    if PROPERTY_TIMER_DEQUEUE_MS in properties or PROPERTY_TIMER_ENQUEUE_MS in properties:
        properties = {k: v for k, v in properties.items() if k not in _ADDED_AT_TIMEUP}
    return (record.born_timestamp, record.born_host, record.flag, record.reconsume_times, len(record.body),
            crc32(record.body), frozenset(properties.items()))
