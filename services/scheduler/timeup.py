"""What a due delayed message becomes: RocketMQ 4.9.8's ``ScheduleMessageService.messageTimeup``.

The re-put message keeps body, flag, sys_flag, born timestamp, born host, reconsume times and every
property (REAL_TOPIC and REAL_QID included); its topic and queue are REAL_TOPIC / REAL_QID; DELAY is
cleared (so the store does not park it again); the prepared transaction offset is 0 (messageTimeup
does not copy it). The store gives it a new store timestamp, store host (the same commitlog service),
commitlog and queue offsets, and the indexer a tags code of its TAGS (not a deliver time any more,
since the topic is not SCHEDULE_TOPIC_XXXX).

One difference from 4.9.8's bytes: 4.9.8 serialises the properties string *before* it clears DELAY,
so its stored record still carries DELAY=n; the commitlog service would park such a message again,
so here the stored properties lack DELAY. Readers see the same topic, queue, body and properties
otherwise.
"""

from __future__ import annotations

from services.store.message import (
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    Message,
    MessageRecord,
)
from services.store.record import java_parse_int


class NotDeliverable(ValueError):
    """A scheduled record without a usable REAL_TOPIC / REAL_QID: RocketMQ logs and passes over it."""


def message_timeup(record: MessageRecord) -> Message:
    properties = dict(record.properties)
    properties.pop(PROPERTY_DELAY_TIME_LEVEL, None)
    topic = properties.get(PROPERTY_REAL_TOPIC)
    queue_text = properties.get(PROPERTY_REAL_QUEUE_ID)
    if not topic or queue_text is None:
        raise NotDeliverable(f"record at commitlog offset {record.commitlog_offset} has no REAL_TOPIC/REAL_QID")
    try:
        queue_id = java_parse_int(queue_text)
    except ValueError:
        raise NotDeliverable(f"record at commitlog offset {record.commitlog_offset}: REAL_QID {queue_text!r} "
                             "is not an integer") from None
    return Message(topic=topic, queue_id=queue_id, body=record.body, flag=record.flag, properties=properties,
                   born_timestamp=record.born_timestamp, born_host=record.born_host, sys_flag=record.sys_flag,
                   reconsume_times=record.reconsume_times, prepared_transaction_offset=0)
