"""When a pull reads far behind the log's end, the leader suggests that the consumer's next pull go to a
follower (RocketMQ's ``slaveReadEnable`` with ``accessMessageInMemoryMaxRatio``).

RocketMQ's getMessage compares how far the last unit a pull looked at lies behind the commitlog's end
with a share of the machine's memory: further behind than that, the records are unlikely to be in the
page cache, the pull reads the disk, and it would slow every producer and hot consumer of the leader.
With ``slaveReadEnable`` the broker then answers ``suggestWhichBrokerId`` = a slave, and the client's
next pull of that queue goes there; a slave's answer of data it holds in memory sends it back.

Here the query service that answers the pull makes the same comparison and says so in the answer's
trailing metadata (:data:`NEXT_FROM_FOLLOWER`, valued with the next pull's queue offset); the gateway
(gateway/shard.py) sends the pull that starts at that offset to an in-sync follower. The metadata, not
a response field, carries it so that the gateway never parses a pull's answer it passes through.
"""

from __future__ import annotations

import os

#: Trailing metadata of a PullMessage answer: the queue offset whose pull should go to a follower.
NEXT_FROM_FOLLOWER = "mqstore-next-pull-from-follower"


def physical_memory_bytes() -> int:
    """The machine's memory, or the container's limit where one is set and lower (cgroup v2): what the
    page cache can hold."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        with open("/sys/fs/cgroup/memory.max") as limit:
            text = limit.read().strip()
    except OSError:
        return total
    return min(total, int(text)) if text.isdigit() else total


def cold_read_threshold(ratio_percent: float, memory_bytes: int | None = None) -> int:
    """Bytes behind the log's end past which a read is cold: ``accessMessageInMemoryMaxRatio`` percent
    of the memory."""
    memory = physical_memory_bytes() if memory_bytes is None else memory_bytes
    return int(memory * ratio_percent / 100)


def is_cold(max_physical_offset: int, last_pulled_offset: int, threshold: int) -> bool:
    """Whether a pull that looked at a unit at ``last_pulled_offset`` read cold data (RocketMQ's
    ``diff > memory``)."""
    return max_physical_offset - last_pulled_offset > threshold
