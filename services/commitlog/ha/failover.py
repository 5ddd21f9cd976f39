"""A replica whose role etcd decides (``etcdEndpoint`` set): it campaigns when its shard has no leader,
leads while its lease holds, and follows whoever etcd names otherwise.

As leader (epoch E): its epoch file gets ``(E, its max offset)`` before it takes any write, its HA
listener accepts followers of epoch E only, and every acknowledgement waits on the in-sync set's rule
(``in_sync.py``; ASYNC_MASTER: on the lease fence alone). As follower: it refuses writes
(FAILED_PRECONDITION naming the leader), cuts its log back to where it stops being the leader's
(``truncation.py``) and follows. Losing the lease (a pause, a partition from etcd) refuses writes at
once; the loop then follows the new leader. A clean stop resigns, so a member takes over at once.
"""

from __future__ import annotations

import logging
import threading

from services.commitlog.commit_log import CommitLog
from services.commitlog.ha import ha_metrics
from services.commitlog.ha.epoch_file import EpochFile, LeaderEpoch
from services.commitlog.ha.ha_client import HAClient
from services.commitlog.ha.ha_service import HAService, HAServiceError
from services.commitlog.ha.in_sync import InSyncAcks
from services.commitlog.ha.leadership import ShardLeadership
from services.server.etcd_client import EtcdClient, EtcdError
from services.server.shard_keys import (
    NOT_LEADER_REASON,
    NOT_LEADER_REFUSAL,
    LeaderRecord,
    NotLeader,
    ShardKeys,
    read_shard,
)
from services.store.config import SYNC_MASTER
from services.store.errors import FailedPreconditionError

log = logging.getLogger(__name__)
#: How often the loop reads the shard's keys (a campaign or a change of leader is seen this fast).
POLL_S = 0.5


def replica_name(engine: CommitLog) -> str:
    return ha_metrics.replica_name(engine.config)


def not_leader_refusal(shard: str, replica: str, why: str, leader: LeaderRecord | None) -> FailedPreconditionError:
    """The error a replica that does not lead refuses a write with, before appending anything: its
    NOT_LEADER reason names the leader it follows, so whoever follows the leader may send it there."""
    refusal = NotLeader(shard, replica) if leader is None else \
        NotLeader(shard, replica, leader.replica, leader.ha_address, leader.epoch)
    return FailedPreconditionError(f"replica {replica} {NOT_LEADER_REFUSAL} {shard} ({why}): send to the leader "
                                   "etcd names").because(NOT_LEADER_REASON, refusal.metadata())


class EtcdReplication:
    def __init__(self, engine: CommitLog, token: str | None) -> None:
        cfg = engine.config
        self._engine = engine
        self._token = token
        self.replica = replica_name(engine)
        self._client = EtcdClient(cfg.etcd_endpoint)
        self._epochs = EpochFile(engine.root)
        self.leadership = ShardLeadership(self._client, cfg.broker_name, self.replica,
                                          cfg.ha_advertised_address or f"{cfg.broker_ip}:{cfg.ha_listen_port}",
                                          cfg.ha_lease_ttl_seconds,
                                          on_lost=self._refuse_writes)
        self.acks: InSyncAcks | None = None
        self._service: HAService | None = None
        self._follower: HAClient | None = None
        self._following: LeaderRecord | None = None
        self._member = False  # a member of the in-sync set etcd names, at the last read
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ha-etcd", daemon=True)
        self._refuse_writes("no leader is known yet")
        engine.ack_fence = self.leadership.fence  # the waiting puts' fence is in wait_for_replicas
        ha_metrics.declare_replica(cfg)

    def start(self) -> None:
        self._thread.start()

    def _refuse_writes(self, why: str, leader: LeaderRecord | None = None) -> None:
        self._engine.write_refusal = not_leader_refusal(self._engine.config.broker_name, self.replica, why, leader)

    def _run(self) -> None:
        while not self._stopped.wait(POLL_S):
            try:
                self._step()
            except (EtcdError, HAServiceError) as exc:
                log.warning("shard %s: %s", self._engine.config.broker_name, exc)
            except Exception:
                log.exception("shard %s: the leadership loop failed", self._engine.config.broker_name)

    def _step(self) -> None:
        if self.leadership.is_leader():
            return
        if self._service is not None:  # the lease lapsed: writes are refused already
            self._stop_leading()
        view = read_shard(self._client, ShardKeys(self._engine.config.broker_name))
        self._member = view.in_sync is not None and self.replica in view.in_sync.members
        if view.leader is None:
            epoch = self.leadership.campaign(self._epochs.last_epoch)
            if epoch is not None:
                self._lead(epoch)
        elif view.leader.replica != self.replica and view.leader != self._following:
            self._follow(view.leader)

    def ready(self) -> bool:
        """The leader, or a follower of the named leader that etcd lists in the in-sync set."""
        return self.leadership.is_leader() or (self._member and self._following is not None)

    def _lead(self, epoch: int) -> None:
        self._stop_following()
        engine = self._engine
        self._epochs.begin(epoch, engine.max_offset)  # before any write of this epoch
        service = HAService(engine, self._token, LeaderEpoch(epoch, self._epochs, self._on_report))
        acks = InSyncAcks(self.leadership, service.transfer, engine.config.min_in_sync_replicas,
                          engine.config.ha_send_timeout / 1000, engine.max_offset)
        self._service, self.acks = service, acks
        service.start()
        engine.wait_for_replicas = acks.wait_for_replicas if engine.config.broker_role == SYNC_MASTER \
            else lambda end: self.leadership.fence()
        engine.write_refusal = None
        labels = ha_metrics.replica_labels(engine.config)
        ha_metrics.EPOCH.labels(*labels).set(epoch)
        ha_metrics.LEADERSHIPS.labels(*labels).inc()
        ha_metrics.IN_SYNC_REPLICAS.labels(*labels).set(1)

    def _on_report(self, replica: str, offset: int) -> None:
        acks = self.acks
        if acks is not None:
            acks.on_report(replica, offset)

    def _stop_leading(self) -> None:
        self._refuse_writes("its leader lease lapsed")
        service, self._service, self.acks = self._service, None, None
        if service is not None:
            service.stop()

    def _follow(self, leader: LeaderRecord) -> None:
        self._stop_following()
        self._refuse_writes(f"replica {leader.replica} at {leader.ha_address} leads epoch {leader.epoch}", leader)
        client = HAClient(self._engine, self._token, leader.ha_address, leader.epoch, self._epochs, self.replica)
        client.start()
        self._follower, self._following = client, leader
        labels = ha_metrics.replica_labels(self._engine.config)
        ha_metrics.EPOCH.labels(*labels).set(leader.epoch)
        ha_metrics.IN_SYNC_REPLICAS.labels(*labels).set(0)
        log.info("shard %s: following %s (epoch %d)", self._engine.config.broker_name, leader.replica, leader.epoch)

    def _stop_following(self) -> None:
        client, self._follower, self._following = self._follower, None, None
        if client is not None:
            client.stop()

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(10)
        self._refuse_writes("it is stopping")
        self.leadership.resign()
        self._stop_leading()
        self._stop_following()
        self._client.close()

