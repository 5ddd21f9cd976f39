"""Which replica of a shard leads, as etcd says: the gateway follows it through a watch of the shard's
``leader`` key (services/server/shard_keys.py).

The watch runs in a thread (etcd's client is blocking) and only replaces two plain attributes, so the
event loop reads them without locks: ``leader`` (the replica name etcd holds, None between leaders)
and ``in_sync`` (the members of ``inSync`` as last read, the replicas a read may fall back to while
the leader cannot be reached, RocketMQ's ``slaveReadEnable``). A broken stream (etcd restarted, a
compaction) is answered by reading the keys again and watching from there: no change is missed.

A replica that does not lead refuses a write before appending it, with a NOT_LEADER detail naming the
leader it follows (:func:`not_leader`): the write may then go to the next leader. The detail decides,
never the refusal's words.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import grpc

from gateway.resilience import BackendError
from services.server.etcd_client import EtcdClient, EtcdError
from services.server.shard_keys import NOT_LEADER_REASON, LeaderRecord, NotLeader, ShardKeys, read_shard

log = logging.getLogger(__name__)

#: Pause before watching again after the stream broke or etcd could not be read.
REWATCH_S = 0.5
#: How often a waiter looks at the leader the watch thread keeps.
POLL_S = 0.02


def not_leader(exc: BackendError) -> NotLeader | None:
    """The follower's refusal a failed write carries (FAILED_PRECONDITION with a NOT_LEADER detail):
    nothing was appended, the next leader may take it. None for any other failure."""
    reason = exc.reason
    if exc.code != grpc.StatusCode.FAILED_PRECONDITION or reason is None or reason.reason != NOT_LEADER_REASON:
        return None
    return NotLeader.of_metadata(reason.metadata)


class ShardLeader:
    """The leader of one replicated shard (``broker_name``: the replicas' brokerName), kept current."""

    def __init__(self, etcd_endpoint: str, broker_name: str) -> None:
        self.keys = ShardKeys(broker_name)
        self.leader: str | None = None
        self.epoch = 0
        self.in_sync: frozenset[str] = frozenset()
        self._client = EtcdClient(etcd_endpoint)
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"leader-{broker_name}", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stopped.set()
        self._client.close()  # ends a blocked watch

    def _run(self) -> None:
        while not self._stopped.is_set():
            try:
                self._follow()
            except EtcdError as exc:
                if not self._stopped.is_set():
                    log.warning("shard %s: %s; reading the leader again in %.1f s", self.keys.shard, exc, REWATCH_S)
            except ValueError as exc:  # a key that is not what the replicas write
                log.error("shard %s: unreadable leadership keys in etcd: %s", self.keys.shard, exc)
            self._stopped.wait(REWATCH_S)

    def _follow(self) -> None:
        view = read_shard(self._client, self.keys)
        self._set(view.leader, view.in_sync.members if view.in_sync else frozenset())
        for value in self._client.watch(self.keys.leader, start_revision=view.revisions[0] + 1 if view.leader else 0):
            if self._stopped.is_set():
                return
            record = None if value is None else LeaderRecord.decode(value.data)
            in_sync = read_shard(self._client, self.keys).in_sync
            self._set(record, in_sync.members if in_sync else self.in_sync)

    def _set(self, record: LeaderRecord | None, in_sync: frozenset[str]) -> None:
        name = None if record is None else record.replica
        if name != self.leader:
            log.info("shard %s: leader %s (epoch %d)", self.keys.shard, name or "none",
                     0 if record is None else record.epoch)
        self.in_sync = in_sync
        self.epoch = 0 if record is None else record.epoch
        self.leader = name

    def refresh_in_sync(self) -> frozenset[str]:
        """Read ``inSync`` now (blocking: call it off the event loop)."""
        view = read_shard(self._client, self.keys)
        self.in_sync = view.in_sync.members if view.in_sync else frozenset()
        return self.in_sync

    async def next_leader(self, previous: str | None, timeout_s: float) -> str | None:
        """The leader once it is another replica than ``previous``; None when none is named in time."""
        deadline = time.monotonic() + timeout_s
        while True:
            leader = self.leader
            if leader is not None and leader != previous:
                return leader
            if time.monotonic() >= deadline:
                return None
            await asyncio.sleep(POLL_S)
