"""DeleteTopic on the indexer: wait until dispatch has passed the deletion point, then drop the queues.

The gateway deletes a topic from the commitlog's topic table first; the commitlog answers its max
offset at that moment, below which lie all the topic's records written before. The indexer removes
the topic's ConsumeQueues once its reput offset has reached that offset, so records still on their
way through dispatch do not re-create a queue of the deleted topic right after. If dispatch does not
get there in time (the indexer is far behind), the queues are removed anyway: the late records then
start a queue again (the topic's queue offsets go on where they stopped, so they can never collide
with those of a topic created again), and nothing acknowledged is lost.
"""

from __future__ import annotations

import logging
import time

from services.indexer.indexer_store import IndexerStore

log = logging.getLogger(__name__)

#: How long a deletion waits for dispatch when the caller set no deadline.
DELETE_WAIT_S = 10.0
_POLL_S = 0.01


def delete_topic(store: IndexerStore, topic: str, commitlog_offset: int, wait_s: float) -> int:
    """Removes the topic's queues once dispatch reached ``commitlog_offset`` (or ``wait_s`` passed,
    keeping a little of it for the answer); returns how many queues were removed."""
    deadline = time.monotonic() + max(wait_s - 0.2, 0.0)
    while store.reput_offset < commitlog_offset and time.monotonic() < deadline:
        time.sleep(_POLL_S)
    if store.reput_offset < commitlog_offset:
        log.warning("deleting topic %s while dispatch is at %d, behind the deletion point %d: its records "
                    "in between will start its queues again", topic, store.reput_offset, commitlog_offset,
                    extra={"topic": topic})
    return store.delete_topic(topic)
