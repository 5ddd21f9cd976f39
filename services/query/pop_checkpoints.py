"""RocketMQ 5's pop checkpoints, kept by the shard's query service in ``config/popCheckpoint.json``.

For each (consumer group, topic, queue) consumed by pop (the gateway's apache.rocketmq.v2 consumers):
the pop offset (where new messages are taken from) and the messages handed out and not acked, each
with the time it becomes visible again (ms since the epoch, so that it means the same after a
restart), its delivery attempts, the version of its latest hand-out (a receipt handle names one
version: an ack with an earlier one is refused) and its message group (FIFO order).

RocketMQ's broker keeps the same in its store as checkpoint and ack records, revived into the retry
topic; here it is one table, written whole, atomically (temp file, fsync, rename, ``.bak`` kept),
together with the consumer offsets (every persist interval when it changed, and at a clean stop): a
kill -9 forgets at most the hand-outs and acks of the last interval (those messages are delivered
again: at least once).

On a replicated shard every change is also a record of the shard's log (``PopChange``,
services/store/metadata_log.py) and the table takes it from there on every replica alike
(services/query/offset_log.py), as RocketMQ 5 writes its pop checkpoints and acks into the commitlog: a
new leader hands out neither a message in flight before its invisible time ends nor one acked. The file
then also records the metadata queue offset its records were applied up to, and a start goes on from
there, so the hand-outs a kill -9 forgot are applied again.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from pathlib import Path
from typing import Any

from services.query.state_file import StateFile
from services.store.formats.consumer_offsets_file import METADATA_OFFSET_KEY, TOPIC_GROUP_SEPARATOR
from services.store.metadata_log import InFlightEntry, PopChange
from services.store.store_root import read_with_backup

log = logging.getLogger(__name__)

FILE_NAME = "popCheckpoint.json"


@dataclasses.dataclass(slots=True)
class InFlight:
    """A message handed out and not acked."""

    visible_at_ms: int
    attempts: int
    version: int
    group_key: str | None


@dataclasses.dataclass(slots=True)
class PopQueue:
    """One queue's pop state for one group."""

    pop_offset: int
    inflight: dict[int, InFlight] = dataclasses.field(default_factory=dict)
    #: The group offset this state last wrote to the consumer offsets (another value there: reset).
    committed: int = -1
    lock: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock, compare=False, repr=False)

    @property
    def lowest(self) -> int:
        """The group's offset: everything below it is acked (or filtered out)."""
        return min(self.inflight, default=self.pop_offset)

    def blocked(self, group_key: str | None, offset: int) -> bool:
        """True when an earlier message of this message group is in flight."""
        return group_key is not None and any(d.group_key == group_key and o < offset
                                             for o, d in self.inflight.items())

    def next_visible_ms(self, max_attempts: int) -> int:
        """When the next message a pop would hand out again becomes visible (0: none in flight);
        messages left to the dead-letter claim do not count."""
        return min((d.visible_at_ms for d in self.inflight.values() if d.attempts < max_attempts), default=0)


Key = tuple[str, str, int]  # (group, topic, queue id)


def now_ms() -> int:
    return int(time.time() * 1000)


def inflight_entries(q: PopQueue) -> dict[int, InFlightEntry]:
    """The queue's in-flight messages as whole values (what a PopChange carries)."""
    return {o: (d.visible_at_ms, d.attempts, d.version, d.group_key) for o, d in q.inflight.items()}


class PopCheckpointTable(StateFile[dict[str, Any]]):
    def __init__(self, config_dir: Path) -> None:
        super().__init__(config_dir / FILE_NAME)
        self.queues: dict[Key, PopQueue] = {}
        self._last_version = 0
        #: A replicated shard's: the metadata topic's queue offset the table holds every record below.
        self.applied_metadata: int | None = None

    def apply(self, change: PopChange) -> None:
        """A logged pop state change (a replicated shard's; offset_log.py)."""
        key = (change.group, change.topic, change.queue_id)
        q = self.queues.get(key)
        if q is None:
            q = self.queues[key] = PopQueue(change.pop_offset)
        q.pop_offset, q.committed = change.pop_offset, change.committed
        for offset in change.removed:
            q.inflight.pop(offset, None)
        for offset, entry in change.inflight.items():
            q.inflight[offset] = InFlight(*entry)
            self._last_version = max(self._last_version, entry[2])
        self.changed()

    def set_applied(self, queue_offset: int) -> None:
        """Every metadata record below ``queue_offset`` is applied (written with the table next time). A
        table that never took a pop record (no queue: records only add them) has nothing to apply again,
        so its file is not rewritten for the offset alone."""
        if queue_offset != self.applied_metadata:
            self.applied_metadata = queue_offset
            if self.queues:
                self.changed()

    def new_version(self) -> int:
        """A hand-out's version: microseconds since the epoch, strictly increasing, so a version is not
        handed out twice even after a kill -9 forgot the last ones (unless the clock went back)."""
        self._last_version = max(self._last_version + 1, time.time_ns() // 1000)
        return self._last_version

    def load(self) -> None:
        """The file, else its ``.bak``, else nothing yet; ValueError when neither parses."""
        parsed = read_with_backup(self.path, _parse)
        if parsed is None:
            return
        self.queues, self._last_version, self.applied_metadata = parsed
        log.info("loaded the pop state of %d queues (%d messages in flight) from %s", len(self.queues),
                 sum(len(q.inflight) for q in self.queues.values()), self.path)

    def _copy(self) -> dict[str, Any]:
        """The document: built on the event loop (cheap), encoded in a thread."""
        document: dict[str, Any] = {"lastVersion": self._last_version, "queues": {}}
        if self.applied_metadata is not None:
            document[METADATA_OFFSET_KEY] = self.applied_metadata
        for (group, topic, queue_id), q in self.queues.items():
            entry = {"popOffset": q.pop_offset, "committed": q.committed,
                     "inflight": {str(o): list(e) for o, e in sorted(inflight_entries(q).items())}}
            document["queues"].setdefault(f"{topic}{TOPIC_GROUP_SEPARATOR}{group}", {})[str(queue_id)] = entry
        return document

    def _encode(self, snapshot: dict[str, Any]) -> bytes:
        return json.dumps(snapshot, separators=(",", ":")).encode()


def _parse(data: bytes) -> tuple[dict[Key, PopQueue], int, int | None]:
    document = json.loads(data)
    queues: dict[Key, PopQueue] = {}
    for key, per_queue in document["queues"].items():
        topic, _, group = key.partition(TOPIC_GROUP_SEPARATOR)
        for queue_id, entry in per_queue.items():
            inflight = {int(o): InFlight(int(v), int(a), int(ver), g)
                        for o, (v, a, ver, g) in entry["inflight"].items()}
            queues[(group, topic, int(queue_id))] = PopQueue(int(entry["popOffset"]), inflight,
                                                             int(entry["committed"]))
    applied = document.get(METADATA_OFFSET_KEY)
    return queues, int(document["lastVersion"]), None if applied is None else int(applied)
