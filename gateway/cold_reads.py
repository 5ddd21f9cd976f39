"""Which pulls of a replicated shard go to a follower: the one after a pull that the leader's query
service found cold (services/store/rules/cold_read.py), as RocketMQ's client pulls from the broker a
``suggestWhichBrokerId`` names.

The gateway does not know the consumer, so a suggestion is kept by where the next pull starts: topic,
queue and the queue offset the cold answer named. The consumer's next pull starts exactly there; a pull
from anywhere else asks the leader, which says again if it is cold. A follower's answer that is still
cold keeps the queue there; a warm one brings it back to the leader. Each queue keeps to one follower
(chosen by the queue), so its page cache serves the pulls that follow.
"""

from __future__ import annotations

import zlib
from collections import OrderedDict

#: Suggestions remembered at once; the oldest is forgotten first (its consumer's next pull asks the leader).
MAX_REMEMBERED = 65_536

PullKey = tuple[str, int, int]


class ColdReads:
    def __init__(self, max_remembered: int = MAX_REMEMBERED) -> None:
        self._next: OrderedDict[PullKey, None] = OrderedDict()
        self._max = max_remembered

    def __len__(self) -> int:
        return len(self._next)

    def remember(self, topic: str, queue_id: int, next_offset: int) -> None:
        """The pull of (``topic``, ``queue_id``) from ``next_offset`` should go to a follower."""
        self._next[(topic, queue_id, next_offset)] = None
        if len(self._next) > self._max:
            self._next.popitem(last=False)

    def take(self, topic: str, queue_id: int, offset: int) -> bool:
        """Whether this pull should go to a follower (the suggestion is used up)."""
        return self._next.pop((topic, queue_id, offset), False) is None


def follower_for(topic: str, queue_id: int, followers: list[str]) -> str:
    """The follower a queue's cold pulls go to: the same one while the in-sync set stays."""
    ordered = sorted(followers)
    return ordered[zlib.crc32(f"{topic}\0{queue_id}".encode()) % len(ordered)]
