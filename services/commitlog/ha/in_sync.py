"""What an acknowledgement means under etcd leadership: every member of the shard's in-sync set holds it.

RocketMQ 5's SyncStateSet with ``allAckInSyncStateSet``, the set kept in etcd (``leadership.py``) and
changed there *before* it changes what an ack means:

* **shrink before acking without a member**: a member that is gone, or has not reported a put's end
  within ``haSendTimeout``, is removed in etcd first; only once etcd has the smaller set may a put be
  acknowledged without it (a member that lacks an acknowledged record could be promoted otherwise);
* **grow only once caught up**: a follower joins once it holds everything ever acknowledged (the
  confirm offset, at first the leader's whole log: any of it may have been acknowledged before). From
  that moment every acknowledgement already waits for it, and only then is it written to etcd; so at
  no time does etcd list a member that lacks an acknowledged record;
* at least ``max(2, minInSyncReplicas)`` members, the leader included: never a single copy.

Only a member may be promoted (``ShardLeadership.campaign``), so a new leader holds every
acknowledged record. The lease fence is the last check before every acknowledgement.
"""

from __future__ import annotations

import logging
import threading
import time

from services.commitlog.ha import ha_metrics
from services.commitlog.ha.group_transfer import GroupTransfer, ReplicaAckError
from services.commitlog.ha.leadership import NotLeaderError, ShardLeadership
from services.commitlog.put_result import PutMessageStatus
from services.server.etcd_client import EtcdError

log = logging.getLogger(__name__)
#: How often a waiting put looks at the followers again when nothing wakes it.
POLL_S = 0.1


class InSyncAcks:
    """The leader's in-sync set and its ack rule; thread-safe."""

    def __init__(self, leadership: ShardLeadership, transfer: GroupTransfer, min_in_sync: int, timeout_s: float,
                 confirm_offset: int) -> None:
        self._leadership = leadership
        self._transfer = transfer
        self._me = leadership.replica
        self.replicas_needed = max(2, min_in_sync)
        self._timeout_s = timeout_s
        self._lock = threading.Lock()
        self._change = threading.Lock()  # one etcd change of the set at a time
        self._members: frozenset[str] = frozenset({self._me})  # as etcd has it
        self._joining: set[str] = set()  # caught up, waited for, not yet in etcd
        self._confirm = confirm_offset  # the highest end this leader may have acknowledged

    @property
    def members(self) -> frozenset[str]:
        with self._lock:
            return self._members

    def _offsets(self) -> dict[str, int]:
        offsets: dict[str, int] = {}
        for follower in self._transfer.followers:
            if follower.replica and follower.acked_offset >= 0:
                offsets[follower.replica] = max(offsets.get(follower.replica, -1), follower.acked_offset)
        return offsets

    # -- acknowledging ----------------------------------------------------------------------------
    def wait_for_replicas(self, end: int) -> None:
        """Return once every in-sync member holds ``end`` (shrinking the set in etcd first where one
        does not, in time); ReplicaAckError or NotLeaderError otherwise."""
        self._leadership.fence()
        deadline = time.monotonic() + self._timeout_s
        while True:
            seen = self._transfer.changes
            offsets = self._offsets()
            with self._lock:
                required = (self._members | self._joining) - {self._me}
                lagging = {r for r in required if offsets.get(r, -1) < end}
                if not lagging and len(self._members) >= self.replicas_needed:
                    self._leadership.fence()
                    self._confirm = max(self._confirm, end)
                    return
                self._joining -= lagging  # not in etcd: no promise was made about them
                drop = {r for r in lagging if r in self._members}
            late = time.monotonic() >= deadline
            gone = {r for r in drop if r not in offsets}
            if gone or (drop and late):
                self._shrink(drop if late else gone)
                continue
            if late:
                status = PutMessageStatus.FLUSH_SLAVE_TIMEOUT if drop else PutMessageStatus.SLAVE_NOT_AVAILABLE
                raise self._refusal(status, end)
            self._transfer.wait_change(min(POLL_S, deadline - time.monotonic()), seen)

    def _refusal(self, status: PutMessageStatus, end: int) -> ReplicaAckError:
        ha_metrics.UNREPLICATED_PUTS.labels(status.name).inc()
        members = sorted(self.members)
        return ReplicaAckError(status, (
            f"shard {self._transfer.shard}: the message was written on the leader (up to commitlog offset {end}) but "
            f"is not replicated: the in-sync set {members} has {len(members)} replica(s), at least "
            f"{self.replicas_needed} must hold a record (minInSyncReplicas) within haSendTimeout "
            f"({self._timeout_s * 1000:.0f} ms); followers: {self._transfer.describe_followers()}. It is NOT "
            "acknowledged: a resend may store it twice (deduplicate by UNIQ_KEY)"))

    # -- changing the set -------------------------------------------------------------------------
    def _shrink(self, drop: set[str]) -> None:
        with self._change:
            with self._lock:
                smaller = self._members - drop
            if smaller == self._members:
                return
            try:
                self._leadership.write_in_sync(smaller)  # etcd first: then acks may go without them
            except EtcdError as exc:
                raise NotLeaderError(f"shard {self._transfer.shard}: the in-sync set could not be shrunk in etcd "
                                     f"({exc}): the message is NOT acknowledged") from None
            with self._lock:
                self._members = smaller
            ha_metrics.IN_SYNC_REPLICAS.labels(self._transfer.shard, self._me).set(len(smaller))
        log.warning("shard %s: %s left the in-sync set (gone, or behind for haSendTimeout): now %s",
                    self._transfer.shard, sorted(drop), sorted(smaller), extra={"shard": self._transfer.shard})
        self._transfer.notify()

    def on_report(self, replica: str, offset: int) -> None:
        """A follower reported ``offset``: once it holds everything acknowledged, it joins."""
        if not replica:
            return
        with self._lock:
            if replica in self._members or replica in self._joining or offset < self._confirm:
                return
            self._joining.add(replica)  # from now on every ack waits for it
        with self._change:
            with self._lock:
                if replica not in self._joining:  # dropped meanwhile (it fell behind a put)
                    return
                larger = self._members | {replica}
            try:
                self._leadership.write_in_sync(larger)
            except (EtcdError, NotLeaderError) as exc:
                log.warning("shard %s: %s could not join the in-sync set: %s", self._transfer.shard, replica, exc)
                with self._lock:
                    self._joining.discard(replica)
                return
            with self._lock:
                self._members = larger
                self._joining.discard(replica)
            ha_metrics.IN_SYNC_REPLICAS.labels(self._transfer.shard, self._me).set(len(larger))
        log.warning("shard %s: %s joined the in-sync set at offset %d: now %s", self._transfer.shard, replica, offset,
                 sorted(larger), extra={"shard": self._transfer.shard})
        self._transfer.notify()

