"""Which side of replication a commitlog service runs, by ``brokerRole`` (or etcd, when
``etcdEndpoint`` is set: ``failover.py``).

ASYNC_MASTER and SYNC_MASTER run the HA listener when ``haListenPort`` is set (SYNC_MASTER requires
it, and makes every put wait for its followers); SLAVE follows ``haMasterAddress`` and refuses
every put with FAILED_PRECONDITION naming its leader.

Readiness (a Kubernetes readinessProbe, a load balancer): the gRPC health service READY_SERVICE is
SERVING while this replica is the leader or a follower in its shard's in-sync set, the replicas that
hold every acknowledged record; a replica still catching up (or cut off) is NOT_SERVING, so a
PodDisruptionBudget counts it as unavailable.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from grpc_health.v1 import health_pb2

from services.commitlog.commit_log import CommitLog
from services.commitlog.ha.failover import EtcdReplication
from services.commitlog.ha.ha_client import HAClient
from services.commitlog.ha.ha_service import HAService
from services.store.config import SLAVE
from services.store.errors import FailedPreconditionError

#: The health service name whose status is this replica's readiness.
READY_SERVICE = "mqstore.v1.Replica"
#: How often readiness is looked at again (etcd's keys are read every failover.POLL_S).
READY_POLL_S = 0.5


@dataclass(slots=True)
class Replication:
    service: HAService | None = None
    client: HAClient | None = None
    etcd: EtcdReplication | None = None

    def ready(self) -> bool:
        """The leader, or an in-sync follower (as etcd has the set); always, without etcd (no set)."""
        return self.etcd is None or self.etcd.ready()

    def stop(self) -> None:
        if self.etcd is not None:
            self.etcd.stop()
        if self.service is not None:
            self.service.stop()
        if self.client is not None:
            self.client.stop()


def start_replication(engine: CommitLog, token: str | None) -> Replication:
    """Start this replica's side of replication; HAServiceError when the listener cannot start."""
    cfg = engine.config
    if cfg.etcd_endpoint:  # etcd decides the role
        etcd = EtcdReplication(engine, token)
        etcd.start()
        return Replication(etcd=etcd)
    if cfg.broker_role == SLAVE:
        engine.write_refusal = FailedPreconditionError(
            f"this commitlog service is a replica (brokerRole SLAVE) of shard {cfg.broker_name}: it takes no "
            f"writes; send to the leader, whose HA address is {cfg.ha_master_address}")
        client = HAClient(engine, token)
        client.start()
        return Replication(client=client)
    if cfg.ha_listen_port:
        service = HAService(engine, token)
        service.start()
        return Replication(service=service)
    return Replication()


async def report_readiness(health: Any, replication: Replication) -> None:
    """Keep READY_SERVICE's status on ``health`` (a grpc.aio health servicer) in step with
    :meth:`Replication.ready` until cancelled (a server stopping says NOT_SERVING for all)."""
    shown: bool | None = None
    while True:
        ready = replication.ready()
        if ready != shown:
            await health.set(READY_SERVICE, health_pb2.HealthCheckResponse.SERVING if ready
                             else health_pb2.HealthCheckResponse.NOT_SERVING)
            shown = ready
        await asyncio.sleep(READY_POLL_S)
