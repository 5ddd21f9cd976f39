"""A shard's leadership, kept in etcd: the leader lease, the epoch, the in-sync set.

RocketMQ 5's controller mode (``ReplicasInfoManager``, ``SyncStateSet``) with etcd as the controller:
nothing here votes, etcd's transactions decide. Keys under ``/mqstore/shards/<shard>/``:

* ``leader``: ``{"replica", "haAddress", "epoch"}``, attached to the leader's lease: it vanishes when
  the lease lapses (the leader died, or lost etcd), and only then can another replica campaign;
* ``epoch``: the last epoch issued, as decimal text; a campaign raises it by one in the same
  transaction that takes ``leader``, so epochs only grow and each has one leader;
* ``inSync``: ``{"epoch", "members"}``, the replicas that hold every acknowledged record. Only a member
  may campaign; a new leader starts it as itself alone (followers join once caught up).

A leader acknowledges only while its lease is surely alive: :meth:`ShardLeadership.fence` compares the
time with the moment the last renewal was *sent* plus the TTL (etcd's expiry can only be later), so by
the time etcd lets another replica take ``leader``, this one has stopped acknowledging.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from services.server.etcd_client import (
    EtcdClient,
    EtcdError,
    compare_mod_revision,
    compare_value,
    put_op,
)
from services.server.shard_keys import InSyncSet, LeaderRecord, ShardKeys, read_shard
from services.store.errors import UnavailableError

log = logging.getLogger(__name__)

#: The part of the TTL a leader keeps as margin against its own scheduling delays.
LEASE_MARGIN = 0.1


class NotLeaderError(UnavailableError):
    """This replica may not acknowledge: it is not the leader, or its lease may have lapsed."""


class ShardLeadership:
    """One replica's side of its shard's leadership; thread-safe."""

    def __init__(self, client: EtcdClient, shard: str, replica: str, ha_address: str, lease_ttl_s: int,
                 on_lost: Callable[[str], None] = lambda why: None) -> None:
        self.client = client
        self.keys = ShardKeys(shard)
        self.replica = replica
        self.ha_address = ha_address
        self.lease_ttl_s = lease_ttl_s
        self._on_lost = on_lost
        self._lock = threading.Lock()
        self._lease = 0
        self._record: LeaderRecord | None = None  # set while this replica is the leader
        self._valid_until = 0.0  # monotonic: the lease is surely alive before this
        self._stopped = threading.Event()
        self._keeper: threading.Thread | None = None

    # -- campaigning -------------------------------------------------------------------------
    def campaign(self, last_epoch: int | None = None) -> int | None:
        """Try to become the leader: the new epoch, or None when there is a leader already or this
        replica is not in the in-sync set (only a member may be promoted).

        ``last_epoch`` is the last epoch in this replica's epoch file (None: the caller keeps none). A
        member's file holds the in-sync set's epoch (it took the leader's entries before it joined); one
        that lacks it lost its store (a machine replaced, a disk wiped) under a name still listed, and
        leading its short log would cut acknowledged records from every follower: it is not promoted."""
        view = read_shard(self.client, self.keys)
        if view.leader is not None:
            return None
        if view.in_sync is not None and self.replica not in view.in_sync.members:
            log.warning("shard %s has no leader, but replica %s is not in its in-sync set %s: it may not be "
                        "promoted (it may lack acknowledged records)", self.keys.shard, self.replica,
                        sorted(view.in_sync.members), extra={"shard": self.keys.shard})
            return None
        if view.in_sync is not None and last_epoch is not None and last_epoch < view.in_sync.epoch:
            log.warning("shard %s has no leader; replica %s is listed in its in-sync set of epoch %d but its epoch "
                        "file ends at epoch %d (its store was lost): it may not be promoted, it waits for a "
                        "member that kept its log", self.keys.shard, self.replica, view.in_sync.epoch, last_epoch,
                        extra={"shard": self.keys.shard})
            return None
        epoch = view.epoch + 1
        sent = time.monotonic()
        lease = self.client.grant_lease(self.lease_ttl_s)
        record = LeaderRecord(self.replica, self.ha_address, epoch)
        won = self.client.transaction(
            [compare_mod_revision(key, revision)
             for key, revision in zip((self.keys.leader, self.keys.epoch, self.keys.in_sync), view.revisions,
                                      strict=True)],
            [put_op(self.keys.leader, record.encode(), lease), put_op(self.keys.epoch, str(epoch).encode()),
             put_op(self.keys.in_sync, InSyncSet(epoch, frozenset({self.replica})).encode())])
        if not won:
            self._revoke(lease)
            return None
        with self._lock:
            self._lease, self._record = lease, record
            self._valid_until = sent + self.lease_ttl_s * (1 - LEASE_MARGIN)
        log.warning("replica %s is the LEADER of shard %s, epoch %d", self.replica, self.keys.shard, epoch,
                    extra={"shard": self.keys.shard, "epoch": epoch})
        self._stopped.clear()  # a resigned replica may lead again; an older keeper sees its lease is gone
        self._keeper = threading.Thread(target=self._keep_alive, args=(lease,), name="ha-lease", daemon=True)
        self._keeper.start()
        return epoch

    # -- holding ------------------------------------------------------------------------------
    @property
    def epoch(self) -> int:
        record = self._record
        return record.epoch if record is not None else 0

    def is_leader(self) -> bool:
        with self._lock:
            return self._record is not None and time.monotonic() < self._valid_until

    def fence(self) -> None:
        """Raise NotLeaderError unless this replica is the leader with a lease that is surely alive:
        the last check before an acknowledgement."""
        with self._lock:
            record, left = self._record, self._valid_until - time.monotonic()
        if record is None:
            raise NotLeaderError(f"shard {self.keys.shard}: replica {self.replica} is not the leader")
        if left <= 0:
            raise NotLeaderError(f"shard {self.keys.shard}: replica {self.replica}'s leader lease (epoch "
                                 f"{record.epoch}) was not renewed in time: it stops acknowledging; the message "
                                 "is NOT acknowledged (a resend may store it twice: deduplicate by UNIQ_KEY)")

    def _keep_alive(self, lease: int) -> None:
        interval = self.lease_ttl_s / 3
        while not self._stopped.wait(interval):
            with self._lock:
                if self._lease != lease:
                    return
            sent = time.monotonic()
            try:
                ttl = self.client.keep_alive(lease)
            except EtcdError as exc:
                log.warning("shard %s: renewing the leader lease failed: %s", self.keys.shard, exc,
                            extra={"shard": self.keys.shard})
                if not self.is_leader():
                    self._lose(lease, f"the lease lapsed while etcd was unreachable ({exc})")
                    return
                continue
            if ttl <= 0:
                self._lose(lease, "etcd says the lease expired")
                return
            with self._lock:
                lapsed = self._lease == lease and time.monotonic() >= self._valid_until
                if self._lease == lease and not lapsed:
                    self._valid_until = sent + ttl * (1 - LEASE_MARGIN)
            if lapsed:  # is_leader() may have said no already: the leadership ended then, never revived
                self._lose(lease, "the fence lapsed before a renewal got through")
                self._revoke(lease)
                return

    def _lose(self, lease: int, why: str) -> None:
        with self._lock:
            if self._lease != lease:
                return
            record, self._record, self._lease = self._record, None, 0
        log.warning("shard %s: replica %s is NO LONGER the leader (epoch %d): %s", self.keys.shard, self.replica,
                    record.epoch if record else 0, why, extra={"shard": self.keys.shard})
        self._on_lost(why)

    # -- the in-sync set ------------------------------------------------------------------------
    def write_in_sync(self, members: frozenset[str]) -> None:
        """Replace the in-sync set in etcd, only while this replica still holds ``leader`` in its
        epoch (a compare on the leader key's exact value: a lapsed lease deleted it)."""
        self.fence()
        record = self._record
        assert record is not None
        if self.replica not in members:
            raise ValueError("the leader is always in its own in-sync set")
        ok = self.client.transaction([compare_value(self.keys.leader, record.encode())],
                                     [put_op(self.keys.in_sync, InSyncSet(record.epoch, members).encode())])
        if not ok:
            raise NotLeaderError(f"shard {self.keys.shard}: replica {self.replica} no longer holds the leader key "
                                 f"of epoch {record.epoch} in etcd: the in-sync set was not changed")

    # -- stopping -------------------------------------------------------------------------------
    def resign(self) -> None:
        """Stop leading now (a clean stop): revoke the lease, so a member can campaign at once."""
        self._stopped.set()
        with self._lock:
            lease, self._lease, self._record = self._lease, 0, None
        if lease:
            self._revoke(lease)
        if self._keeper is not None and self._keeper is not threading.current_thread():
            self._keeper.join(5)

    def _revoke(self, lease: int) -> None:
        try:
            self.client.revoke_lease(lease)
        except EtcdError as exc:
            log.warning("shard %s: revoking lease %x failed (it lapses by itself): %s", self.keys.shard, lease, exc)
