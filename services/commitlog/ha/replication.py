"""Which side of replication a commitlog service runs, by ``brokerRole`` (or etcd, when
``etcdEndpoint`` is set: ``failover.py``).

ASYNC_MASTER and SYNC_MASTER run the HA listener when ``haListenPort`` is set (SYNC_MASTER requires
it, and makes every put wait for its followers); SLAVE follows ``haMasterAddress`` and refuses
every put with FAILED_PRECONDITION naming its leader.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.commitlog.commit_log import CommitLog
from services.commitlog.ha.failover import EtcdReplication
from services.commitlog.ha.ha_client import HAClient
from services.commitlog.ha.ha_service import HAService
from services.store.config import SLAVE
from services.store.errors import FailedPreconditionError


@dataclass(slots=True)
class Replication:
    service: HAService | None = None
    client: HAClient | None = None
    etcd: EtcdReplication | None = None

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
