"""A consumer group's dead letters (``%DLQ%<group>``): listed, shown, and re-sent to their original
topic (``mqstore dlq list|show|resend``).

A dead letter keeps the message's body, flag, properties and msg id (UNIQ_KEY); ``RETRY_TOPIC`` names
the topic it was first sent to. A re-send is a new send to that topic with the user's properties and
the UNIQ_KEY (so the message keeps its id), without the broker's retry bookkeeping (DELAY, WAIT,
REAL_TOPIC / REAL_QID, RETRY_TOPIC, ORIGIN_MESSAGE_ID): consumers see it as a fresh message
(reconsume times 0).
"""

from __future__ import annotations

from mqstore.client.client import Client
from mqstore.client.consumer import PullConsumer
from mqstore.client.errors import NotFoundError
from mqstore.client.models import Message, OutgoingMessage, SendReceipt
from mqstore.client.retry import PROPERTY_ORIGIN_MESSAGE_ID, PROPERTY_RETRY_TOPIC, dlq_topic

#: What the store's retry flow adds, which a re-send leaves out (TAGS and KEYS go back as tags / keys).
BROKER_PROPERTIES = frozenset({"DELAY", "WAIT", "REAL_TOPIC", "REAL_QID", PROPERTY_RETRY_TOPIC,
                               PROPERTY_ORIGIN_MESSAGE_ID, "TAGS", "KEYS"})


def list_dead_letters(client: Client, group: str, max_messages: int = 64) -> list[Message]:
    """The oldest ``max_messages`` dead letters of the group ([] when it has none, not even the topic)."""
    topic = dlq_topic(group)
    try:
        consumer = PullConsumer(None, topic, connection=client.connection, retry=False,
                                timeout=client.connection.timeout)
        consumer.start()
    except NotFoundError:
        return []
    found: list[Message] = []
    try:
        while len(found) < max_messages:
            got = consumer.poll(max_messages - len(found), timeout=0)
            if not got:
                break
            found += got
    finally:
        consumer.close()
    return found


def show_dead_letter(client: Client, group: str, msg_id: str) -> Message:
    """One dead letter of the group, by its offset msg id or its UNIQ_KEY."""
    message = client.get_message(msg_id, topic=dlq_topic(group))
    if message.topic != dlq_topic(group):
        raise ValueError(f"message {msg_id} is not a dead letter of group {group!r}: it is stored under "
                         f"{message.topic!r}")
    return message


def resend_dead_letter(client: Client, group: str, msg_id: str) -> SendReceipt:
    """Sends a dead letter again to its original topic (see the module's docstring)."""
    message = show_dead_letter(client, group, msg_id)
    if message.body_compressed:
        raise ValueError(f"dead letter {msg_id} has a body compressed with an algorithm the store does not "
                         "decompress: re-send it with a client that can")
    topic = message.properties.get(PROPERTY_RETRY_TOPIC)
    if not topic:
        raise ValueError(f"dead letter {msg_id} has no RETRY_TOPIC property: its original topic is unknown")
    properties = {k: v for k, v in message.properties.items() if k not in BROKER_PROPERTIES}
    outgoing = OutgoingMessage(body=message.body, topic=topic, tags=message.tags or None, keys=list(message.keys),
                               properties=properties, flag=message.flag)
    return client.producer().send_message(outgoing)
