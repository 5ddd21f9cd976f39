"""Topics a store's data already holds, for a topic table that lacks them.

A RocketMQ broker's topic table knows every topic its store holds. A store the commitlog service
did not write (a RocketMQ store: no ``config/topics.json``), or one whose topics.json was lost,
would otherwise have readable data behind topics no route knows. At start the service looks in:

* the queue-offset table recovery rebuilt from the commitlog: every (topic, queue id) with a message
  in the log (``queue_offsets.py``);
* the ConsumeQueue directories ``<topic>/<queue id>`` under ``<root>/consumequeue`` (RocketMQ's
  layout) and ``<root>/indexer/consumequeue`` (the indexer's, as ``mqstore up`` places it), which
  also name queues whose commitlog files have since been deleted.

A topic's queue count is its highest queue id + 1: as many queues as its data shows, never more
(the store cannot know how many it was created with; UpdateTopic sets more).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

from services.commitlog.topic_queue_table import QueueKey
from services.store.errors import InvalidArgumentError
from services.store.rules.names import MAX_QUEUE_NUMS, check_topic_name
from services.store.tools.inspect_consumequeue import ConsumeQueueError, find_queues

log = logging.getLogger(__name__)

#: ConsumeQueue roots under a commitlog store root: RocketMQ's, then the indexer's under ``mqstore up``.
CONSUME_QUEUE_DIRS = ("consumequeue", "indexer/consumequeue")


def discover_queue_nums(root: Path, queue_table: Iterable[QueueKey]) -> dict[str, int]:
    """topic -> queue count, from the commitlog's queue table and the ConsumeQueue directories.
    Names a topic cannot have and queue ids past the queue limit are skipped with a warning."""
    found: dict[str, int] = {}
    keys = list(queue_table)
    for directory in CONSUME_QUEUE_DIRS:
        keys.extend(_consume_queue_keys(root / directory))
    for topic, queue_id in keys:
        if queue_id >= MAX_QUEUE_NUMS:
            log.warning("ignoring queue %d of topic %s: queue ids stop at %d", queue_id, topic, MAX_QUEUE_NUMS - 1)
            continue
        if found.get(topic, 0) <= queue_id:
            found[topic] = queue_id + 1
    for topic in list(found):
        try:
            check_topic_name(topic)
        except InvalidArgumentError as exc:
            log.warning("ignoring a topic found in the store: %s", exc)
            del found[topic]
    return found


def _consume_queue_keys(directory: Path) -> list[QueueKey]:
    if not directory.is_dir():
        return []
    try:
        return [(queue.topic, queue.queue_id) for queue in find_queues(directory)]
    except (ConsumeQueueError, OSError) as exc:
        log.warning("cannot list the queues under %s: %s", directory, exc)
        return []
