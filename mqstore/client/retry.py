"""Consumer retry and dead letters on the client side (RocketMQ's "reconsume later").

``consume_later`` hands a message back through the gateway's ConsumerSendBack: the store keeps a copy
under the group's retry topic ``%RETRY%<group>`` until its delay level is due (then the scheduler
delivers it there), or under ``%DLQ%<group>`` once it was retried ``max_reconsume_times`` (16) times.
A consumer of a group also reads its retry topic and hands those messages out under their original
topic (the ``RETRY_TOPIC`` property), as RocketMQ's push consumer does (``resetRetryAndNamespace``).
The copy is named by its offset msg id: a UNIQ_KEY would find the first stored copy, whose reconsume
times are 0, and the message would never reach the dead-letter queue.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from mqstore.client.models import Message, SendReceipt
from mqstore.v1 import gateway_pb2

RETRY_TOPIC_PREFIX = "%RETRY%"
DLQ_TOPIC_PREFIX = "%DLQ%"
PROPERTY_RETRY_TOPIC = "RETRY_TOPIC"
PROPERTY_ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
#: How often a consumer looks again for its group's retry topic while it does not exist yet.
RETRY_ROUTE_RECHECK_S = 5.0


def retry_topic(group: str) -> str:
    return RETRY_TOPIC_PREFIX + group


def dlq_topic(group: str) -> str:
    return DLQ_TOPIC_PREFIX + group


@dataclass(frozen=True, slots=True)
class SendBackReceipt:
    """Where a handed-back message went: a retry (stored under SCHEDULE_TOPIC_XXXX until its delay
    level is due, for ``%RETRY%<group>``) or a dead letter (``%DLQ%<group>``)."""

    send: SendReceipt
    target_topic: str
    dead_letter: bool
    reconsume_times: int
    delay_level: int
    origin_msg_id: str

    @classmethod
    def from_proto(cls, result: Any) -> SendBackReceipt:
        return cls(send=SendReceipt.from_proto(result.send), target_topic=result.target_topic,
                   dead_letter=result.dead_letter, reconsume_times=result.reconsume_times,
                   delay_level=result.delay_level, origin_msg_id=result.origin_msg_id)

    def to_json(self) -> dict[str, Any]:
        return {"send": self.send.to_json(), "target_topic": self.target_topic, "dead_letter": self.dead_letter,
                "reconsume_times": self.reconsume_times, "delay_level": self.delay_level,
                "origin_msg_id": self.origin_msg_id}


def send_back_request(group: str | None, message: Message | str, delay_level: int,
                      max_reconsume_times: int | None) -> Any:
    """The ConsumerSendBackRequest for a consumed message (or its offset msg id)."""
    if not group:
        raise ValueError("consume_later needs a consumer group: the message goes to %RETRY%<group>")
    if delay_level < -1:
        raise ValueError(f"delay_level {delay_level} is negative: give 0 (3 + reconsume times), a level 1..n, "
                         "or -1 (dead letter at once)")
    msg_id = message if isinstance(message, str) else message.offset_msg_id
    request = gateway_pb2.ConsumerSendBackRequest(group=group, msg_id=msg_id, delay_level=delay_level)
    if max_reconsume_times is not None:
        request.max_reconsume_times = max_reconsume_times
    return request


def as_original(message: Message) -> Message:
    """A message read from a retry topic, under the topic it was first sent to."""
    topic = message.properties.get(PROPERTY_RETRY_TOPIC)
    return dataclasses.replace(message, topic=topic) if topic else message
