"""A replicated shard's metadata, as records of a system topic in its CommitLog.

On a replicated shard (``haListenPort``, ``etcdEndpoint`` or ``brokerRole`` SLAVE set) every change
of the metadata a failover needs is first appended to the leader's CommitLog as a message of
``RMQ_SYS_MQSTORE_METADATA`` (queue 0; a RocketMQ-valid record whose body is one JSON object) and
applied only from there. The HA stream then carries it to the followers with the messages, in log
order, and SYNC_MASTER acknowledges it under the same in-sync rule; a follower's log refuses client
writes, so a follower refuses metadata changes with the same FAILED_PRECONDITION naming the leader.
Each replica's owning service applies the records it holds: the commitlog service its topic table
(as the leader's stream arrives), the query service its consumer offsets (from the topic's
ConsumeQueue, as its indexer dispatches), the scheduler its progress file when it starts on a
replica. So a promoted follower serves exactly what was replicated.

A change is a full value, never a delta: applying a record twice, or replaying from any earlier
point, ends in the same state.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from services.store.config import SLAVE, MessageStoreConfig
from services.store.formats.message import PROPERTY_TAGS, Message
from services.store.rules.topics import TopicConfig

METADATA_TOPIC = "RMQ_SYS_MQSTORE_METADATA"
METADATA_QUEUE_ID = 0
#: Tags (``TAGS``) by kind, so a reader can skip the kinds it does not own without parsing bodies.
TOPIC_TAG = "topic"
OFFSET_TAG = "offset"
STATE_FILE_TAG = "stateFile"
POP_TAG = "pop"
#: The kinds other services than the commitlog log through an Append with ``metadata_flow``.
FLOW_TAGS = (OFFSET_TAG, STATE_FILE_TAG, POP_TAG)


def replicates_metadata(config: MessageStoreConfig) -> bool:
    """Whether this store is one replica of several, whose metadata changes go through its log."""
    return bool(config.ha_listen_port or config.etcd_endpoint or config.broker_role == SLAVE)


@dataclass(frozen=True, slots=True)
class TopicChange:
    """A topic's whole config after CreateTopic/UpdateTopic, or ``config`` None: the topic deleted."""

    topic: str
    config: TopicConfig | None


@dataclass(frozen=True, slots=True)
class OffsetChange:
    """A consumer group's next offset in a queue (a commit, or a pop ack's offset)."""

    group: str
    topic: str
    queue_id: int
    offset: int


@dataclass(frozen=True, slots=True)
class StateFileChange:
    """A whole progress file of the scheduler (``delayOffset.json``): the one a promoted leader's
    scheduler starts from (it then counts the re-puts the log holds past the file's scan offset)."""

    name: str
    content: bytes


#: A message handed out by pop and not acked: (visible at ms, delivery attempts, version, message group).
InFlightEntry = tuple[int, int, int, str | None]


@dataclass(frozen=True, slots=True)
class PopChange:
    """What one pop, ack or change of invisible time did to a (group, topic, queue)'s pop state: its pop
    offset and committed offset (whole values), the in-flight messages it handed out or changed (each
    whole) and those it removed (acked, or gone from the store). Applied in log order from any earlier
    point, the records end in the same state; each stays as small as the call that made it."""

    group: str
    topic: str
    queue_id: int
    pop_offset: int
    committed: int
    inflight: dict[int, InFlightEntry]
    removed: tuple[int, ...]


Change = TopicChange | OffsetChange | StateFileChange | PopChange


def metadata_message(change: Change) -> Message:
    """The message that carries ``change`` (the put path assigns its offsets)."""
    if isinstance(change, TopicChange):
        tag = TOPIC_TAG
        body: dict[str, object] = {"topic": change.topic}
        if change.config is None:
            body["deleted"] = True
        else:
            body.update(readQueueNums=change.config.read_queue_nums, writeQueueNums=change.config.write_queue_nums,
                        perm=change.config.perm)
    elif isinstance(change, OffsetChange):
        tag = OFFSET_TAG
        body = {"group": change.group, "topic": change.topic, "queueId": change.queue_id, "offset": change.offset}
    elif isinstance(change, PopChange):
        tag = POP_TAG
        body = {"group": change.group, "topic": change.topic, "queueId": change.queue_id,
                "popOffset": change.pop_offset, "committed": change.committed,
                "inflight": {str(o): list(e) for o, e in change.inflight.items()}, "removed": list(change.removed)}
    else:
        tag = STATE_FILE_TAG
        body = {"file": change.name, "content": change.content.decode()}
    return Message(topic=METADATA_TOPIC, queue_id=METADATA_QUEUE_ID, body=json.dumps(body).encode(),
                   properties={PROPERTY_TAGS: tag}, born_timestamp=int(time.time() * 1000))


def parse_change(tags: str | None, body: bytes) -> Change | None:
    """The change a metadata record carries; None for a kind this version does not know (skipped,
    so an older replica follows a newer leader). Raises ValueError for a body that is not one."""
    fields = json.loads(body)
    if tags == TOPIC_TAG:
        topic = str(fields["topic"])
        if fields.get("deleted"):
            return TopicChange(topic, None)
        return TopicChange(topic, TopicConfig(topic, int(fields["readQueueNums"]), int(fields["writeQueueNums"]),
                                              int(fields["perm"])))
    if tags == OFFSET_TAG:
        return OffsetChange(str(fields["group"]), str(fields["topic"]), int(fields["queueId"]), int(fields["offset"]))
    if tags == POP_TAG:
        inflight = {int(o): (int(v), int(a), int(ver), None if g is None else str(g))
                    for o, (v, a, ver, g) in fields["inflight"].items()}
        return PopChange(str(fields["group"]), str(fields["topic"]), int(fields["queueId"]), int(fields["popOffset"]),
                         int(fields["committed"]), inflight, tuple(int(o) for o in fields["removed"]))
    if tags == STATE_FILE_TAG:
        return StateFileChange(str(fields["file"]), str(fields["content"]).encode())
    return None
