"""The commitlog service's part of metadata replication (``services/store/metadata_log.py``):
the leader logs each topic change before its table takes it; a follower applies the topic changes,
and the auto-creations, of the records its leader streams to it.

A follower applies a batch of records before they enter its log, so a crash in between leaves the
table ahead of the log, never behind it: the follower reports only what its log holds, so the leader
sends those records again and the (idempotent) changes are applied again.
"""

from __future__ import annotations

import logging
import struct

from services.commitlog.commit_log import CommitLog
from services.commitlog.ha.group_transfer import ReplicaAckError
from services.commitlog.topic_config import TopicConfigManager
from services.store.errors import InvalidArgumentError, StoreError
from services.store.formats.message import PROPERTY_TAGS, Message
from services.store.formats.record import (
    BLANK_MAGIC_CODE,
    BORNHOST_POS,
    MESSAGE_MAGIC_CODE,
    SIZE_AND_MAGIC,
    SYSFLAG_POS,
    RecordError,
    decode_record,
    host_lengths,
)
from services.store.metadata_log import (
    FLOW_TAGS,
    METADATA_QUEUE_ID,
    METADATA_TOPIC,
    OffsetChange,
    PopChange,
    StateFileChange,
    TopicChange,
    metadata_message,
    parse_change,
)

log = logging.getLogger(__name__)

_METADATA_NAME = METADATA_TOPIC.encode()
_I32 = struct.Struct(">i")
_U16 = struct.Struct(">H")


class TopicChangeLog:
    """``TopicConfigManager.log_change`` on a replicated shard's leader: the change as a record of the
    metadata topic, through the put path (a follower's log refuses it, naming the leader; SYNC_MASTER
    answers once the in-sync followers hold it)."""

    def __init__(self, commit_log: CommitLog) -> None:
        self._commit_log = commit_log

    def __call__(self, change: TopicChange) -> StoreError | None:
        try:
            self._commit_log.put_messages([metadata_message(change)])
        except ReplicaAckError as exc:  # in the leader's log: the table follows the log
            return exc
        return None


def apply_replicated(topics: TopicConfigManager, records: bytes) -> bool:
    """Apply the topic changes among ``records`` (whole records of the leader's log, BLANKs included).
    Returns False at once when there is none (the usual batch: the caller then creates the topics the
    batch's queues name, :func:`create_missing_topics`). Otherwise the records are walked in order and
    the topics whose first record this is are created among the changes, as the leader's put path did
    (a topic deleted and written again comes back; one written and then deleted does not); True."""
    if records.find(_METADATA_NAME) < 0:
        return False
    seen: set[bytes] = set()
    pos, end = 0, len(records)
    while pos < end:
        size, magic = SIZE_AND_MAGIC.unpack_from(records, pos)
        if magic == BLANK_MAGIC_CODE:
            pos += size
            continue
        name = _topic_of(records, pos, magic)
        if name == _METADATA_NAME:
            try:
                record = decode_record(records, pos)
            except RecordError as exc:  # the appender refuses such bytes itself; nothing to apply
                log.error("a replicated metadata record at %d of a batch cannot be decoded: %s", pos, exc)
            else:
                changed = _apply_change(topics, record.properties.get(PROPERTY_TAGS), record.body,
                                        record.commitlog_offset)
                if changed is not None:  # a record of it after the change may create it again
                    seen.discard(changed.encode())
        if name not in seen:
            seen.add(name)
            create_missing_topics(topics, {name.decode("utf-8", "replace")})
        pos += size
    return True


def create_missing_topics(topics: TopicConfigManager, names: set[str]) -> None:
    """Auto-create, as the leader's put path did, the topics of replicated records the table lacks."""
    for name in names:
        if topics.get(name) is None:
            topics.get_or_create(name)


def _topic_of(records: bytes, pos: int, magic: int) -> bytes:
    """The topic name's bytes of the record at ``pos`` (the layout: services/store/formats/record.py)."""
    sys_flag = _I32.unpack_from(records, pos + SYSFLAG_POS)[0]
    born, stored = host_lengths(sys_flag)
    p = pos + BORNHOST_POS + born + 8 + stored + 12  # store timestamp; reconsume times, prepared offset
    p += 4 + _I32.unpack_from(records, p)[0]  # body length, body
    if magic == MESSAGE_MAGIC_CODE:
        length, p = records[p], p + 1
    else:
        length, p = _U16.unpack_from(records, p)[0], p + 2
    return records[p:p + length]


def _apply_change(topics: TopicConfigManager, tags: str | None, body: bytes, offset: int) -> str | None:
    """The topic changed, if the record is a topic change."""
    try:
        change = parse_change(tags, body)
    except (ValueError, KeyError, TypeError) as exc:
        log.error("metadata record at commitlog offset %d is not a change (%s): skipped", offset, exc)
        return None
    if not isinstance(change, TopicChange):  # consumer offsets and state files are other services'
        return None
    topics.apply(change)
    log.info("replicated topic change at commitlog offset %d: %s", offset, change)
    return change.topic


def metadata_flow_message(topic: str, queue_id: int, tags: str | None, body: bytes) -> Message:
    """An Append with ``metadata_flow``: a consumer offset change or a pop state change of the shard's
    query service, or a progress file of its scheduler, the kinds other services log (a topic change must
    come through CreateTopic, UpdateTopic or DeleteTopic, which apply it to this service's table too)."""
    if topic != METADATA_TOPIC or queue_id != METADATA_QUEUE_ID or tags not in FLOW_TAGS:
        raise InvalidArgumentError(f"a metadata_flow Append carries a consumer offset, a pop state change or a "
                                   f"state file: topic {METADATA_TOPIC} queue {METADATA_QUEUE_ID} with TAGS one of "
                                   f"{', '.join(FLOW_TAGS)}, not {topic!r} queue {queue_id} with TAGS {tags!r}")
    try:
        change = parse_change(tags, body)
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
        raise InvalidArgumentError(f"a metadata_flow Append's body is not a {tags} change ({exc}): see "
                                   "services/store/metadata_log.py") from None
    assert isinstance(change, (OffsetChange, StateFileChange, PopChange))
    return metadata_message(change)
