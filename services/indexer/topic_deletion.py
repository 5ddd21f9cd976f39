"""Topic deletion on the indexer: where a topic's ConsumeQueues are removed.

The gateway deletes a topic from the commitlog's topic table first; the commitlog answers its max
offset at that moment (the deletion point), below which lie all the topic's records written before.
Then it asks this shard's indexer (the leader's, on a replicated shard) to remove the topic's queues.

On a replicated shard the deletion is also a record in the log (``services/store/metadata_log.py``:
a topic change without config), which every replica's indexer dispatches, the followers' included,
whom no one asks. So the queues are removed by dispatch when it reaches that record, on every replica
(``topic_deletions`` finds them in a chunk, ``ReputService`` stops the chunk there and
``IndexerStore.dispatch`` removes the queues), and the leader's DeleteTopic call only waits for it and
answers what was removed. One point for every replica, the leader included, and one that a rebuild
from any earlier offset meets again: the records of the topic before it are in the removed queues, a
record after it (the topic written again) starts a queue again at its queue offset (the commitlog keeps
the topic's queue offsets), so each replica's ConsumeQueue files are the leader's. A DeleteTopic call
that removed queues itself, once dispatch is past the deletion point, would instead remove a queue
that records written since then started again on this replica only.

A shard that does not replicate its metadata has no such record: there DeleteTopic removes the queues
once dispatch has reached the deletion point, so records still on their way through dispatch do not
re-create a queue of the deleted topic right after. If dispatch does not get there in time (the
indexer is far behind), the queues are removed anyway: the late records then start a queue again (the
topic's queue offsets go on where they stopped, so they can never collide with those of a topic created
again), and nothing acknowledged is lost; on a replicated shard dispatch then removes those at the
record, as everywhere else. What dispatch removed is remembered in this process only
(``IndexerStore.take_dispatch_deletion``): a call that finds no such memory (the indexer restarted
between the record and the call) removes the queues itself, as on a shard without the record.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from services.indexer.indexer_store import IndexerStore
from services.store.formats.message import PROPERTY_TAGS, tags_code
from services.store.formats.record import DispatchRequest, RecordError, decode_record
from services.store.metadata_log import METADATA_TOPIC, TOPIC_TAG, TopicChange, parse_change

log = logging.getLogger(__name__)

#: How long a deletion waits for dispatch when the caller set no deadline.
DELETE_WAIT_S = 10.0
_POLL_S = 0.01
#: What dispatch computes for a topic change record's TAGS: the other metadata kinds (consumer offsets,
#: the commonest) are told apart without decoding their record.
_TOPIC_TAGS_CODE = tags_code(TOPIC_TAG)


def topic_deletions(requests: Sequence[DispatchRequest], data: bytes, start_offset: int) -> list[tuple[int, str]]:
    """(position in ``requests``, topic) of each topic-deletion record among a chunk's records, in log
    order; ``data`` holds the records back to back from commitlog offset ``start_offset``. A metadata
    record whose body is not a topic change is logged and dispatched as any other record."""
    found: list[tuple[int, str]] = []
    for i, request in enumerate(requests):
        if request.tags_code != _TOPIC_TAGS_CODE or request.topic != METADATA_TOPIC:
            continue
        try:
            record = decode_record(data, request.commitlog_offset - start_offset)
            change = parse_change(record.properties.get(PROPERTY_TAGS), record.body)
        except (RecordError, ValueError, KeyError, TypeError) as exc:
            log.error("metadata record at commitlog offset %d is not a change (%s): dispatched as a message only",
                      request.commitlog_offset, exc)
            continue
        if isinstance(change, TopicChange) and change.config is None:
            found.append((i, change.topic))
    return found


def delete_topic(store: IndexerStore, topic: str, commitlog_offset: int, wait_s: float) -> int:
    """DeleteTopic: once dispatch reached ``commitlog_offset`` (or ``wait_s`` passed, keeping a little
    of it for the answer), the number of queues dispatch removed at the topic's deletion record, or
    without one the number removed now."""
    deadline = time.monotonic() + max(wait_s - 0.2, 0.0)
    while store.reput_offset < commitlog_offset and time.monotonic() < deadline:
        time.sleep(_POLL_S)
    if store.reput_offset >= commitlog_offset:
        removed = store.take_dispatch_deletion(topic)
        if removed is not None:
            return removed
    else:
        log.warning("deleting topic %s while dispatch is at %d, behind the deletion point %d: its records "
                    "in between will start its queues again", topic, store.reput_offset, commitlog_offset,
                    extra={"topic": topic})
    return store.delete_topic(topic)
