"""Replication's Prometheus metrics, exported by the commitlog process that replicates.

The leader's followers (offset, lag in bytes and in time, how many connected) are read from its
GroupTransfer when scraped: nothing on the put path. Counters count what happened: refused handshakes,
puts SYNC_MASTER could not acknowledge (by 4.9.8's status), and a follower's appends. Under etcd
leadership: the epoch, the in-sync set's size, leaderships taken (first elections and failovers) and
bytes truncated, each labelled with the ``shard`` (brokerName) and this ``replica`` (haReplicaName).

A follower's lag in time is Kafka's replica lag time (``replica.lag.time.max.ms``): how long ago the
follower last held everything the leader had when it reported the time before (0 while it holds the
leader's whole log). A byte lag alone cannot tell a follower that keeps up with a burst from one that
stopped: this one grows only while the follower does not catch up.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import REGISTRY, Metric
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from services.commitlog.ha.group_transfer import GroupTransfer
from services.server.metrics import Counter, Gauge
from services.store.config import MessageStoreConfig

#: The labels of a replica's own metrics: its shard (brokerName) and its name in the in-sync set.
REPLICA_LABELS = ["shard", "replica"]

REFUSED_CONNECTIONS = Counter("mqstore_commitlog_ha_refused_connections",
                              "HA connections closed at the handshake (wrong token, shard or epoch, or none)")
UNREPLICATED_PUTS = Counter("mqstore_commitlog_ha_unreplicated_puts",
                            "SYNC_MASTER put calls answered UNAVAILABLE: not on enough in-sync followers",
                            ["status"])
REPLICATED_BYTES = Counter("mqstore_commitlog_ha_replicated_bytes",
                           "Bytes a follower appended from its leader's stream")
EPOCH = Gauge("mqstore_commitlog_ha_epoch", "The epoch this replica leads or follows (etcd leadership; 0: none)",
              REPLICA_LABELS)
IN_SYNC_REPLICAS = Gauge("mqstore_commitlog_ha_in_sync_replicas",
                         "Members of the shard's in-sync set in etcd, the leader included (set by the leader; "
                         "0 on a follower)", REPLICA_LABELS)
LEADERSHIPS = Counter("mqstore_commitlog_ha_leaderships",
                      "Times this replica took its shard through etcd (a first election or a failover)",
                      REPLICA_LABELS)
TRUNCATED_BYTES = Counter("mqstore_commitlog_ha_truncated_bytes",
                          "Bytes of a divergent, never acknowledged suffix cut from this replica's log",
                          REPLICA_LABELS)
ASYNC_LOST_RANGE = Gauge("mqstore_commitlog_ha_async_lost_range",
                         "The commitlog offsets (bound start, end) of the last suffix this ASYNC_MASTER replica cut "
                         "on returning as a follower: puts it acknowledged alone, lost with the failover",
                         [*REPLICA_LABELS, "bound"])


def replica_name(config: MessageStoreConfig) -> str:
    """This replica's name in its shard's in-sync set (and the ``replica`` label of its metrics)."""
    return config.ha_replica_name or f"{config.broker_ip}:{config.ha_listen_port}"


def replica_labels(config: MessageStoreConfig) -> tuple[str, str]:
    return config.broker_name, replica_name(config)


class FollowersCollector(Collector):
    """The followers of the leader bound last (none before: the families are exported empty, so a
    rule or dashboard names a series every commitlog process declares)."""

    def __init__(self) -> None:
        self._transfer: GroupTransfer | None = None
        self._leader_max: Callable[[], int] = lambda: 0

    def bind(self, transfer: GroupTransfer, leader_max: Callable[[], int]) -> None:
        self._transfer, self._leader_max = transfer, leader_max

    def collect(self) -> Iterator[Metric]:
        transfer = self._transfer
        leader_max = self._leader_max()
        followers = transfer.followers if transfer is not None else []
        shard = transfer.shard if transfer is not None else ""
        labels = ["shard", "replica", "follower"]
        lag = GaugeMetricFamily("mqstore_commitlog_ha_follower_lag_bytes",
                                "How far each connected follower's reported offset is behind the leader's max "
                                "offset", labels=labels)
        lag_time = GaugeMetricFamily("mqstore_commitlog_ha_follower_lag_seconds",
                                     "How long ago each connected follower last held everything the leader had at "
                                     "its previous report (0: it holds the leader's whole log)", labels=labels)
        for follower in followers:
            if follower.acked_offset >= 0:
                values = [shard, follower.replica or follower.address, follower.address]
                lag.add_metric(values, max(0, leader_max - follower.acked_offset))
                lag_time.add_metric(values, follower.lag_s(leader_max))
        yield lag
        yield lag_time
        connected = GaugeMetricFamily("mqstore_commitlog_ha_connected_followers",
                                      "Followers connected past the handshake", labels=["shard"])
        needed = GaugeMetricFamily("mqstore_commitlog_ha_followers_needed",
                                   "Followers a SYNC_MASTER put needs (minInSyncReplicas less the leader)",
                                   labels=["shard"])
        if transfer is not None:
            connected.add_metric([shard], len(followers))
            needed.add_metric([shard], transfer.followers_needed)
        yield connected
        yield needed


_FOLLOWERS = FollowersCollector()
REGISTRY.register(_FOLLOWERS)


def bind_followers(transfer: GroupTransfer, leader_max: Callable[[], int]) -> None:
    """Expose one leader's followers (replacing an earlier leader's in this process)."""
    _FOLLOWERS.bind(transfer, leader_max)


def declare_replica(config: MessageStoreConfig) -> None:
    """Export this replica's series at their start values before anything happens, so the first
    leadership or truncation is an increase a rule can see (not a series born at 1)."""
    labels = replica_labels(config)
    EPOCH.labels(*labels)
    IN_SYNC_REPLICAS.labels(*labels)
    LEADERSHIPS.labels(*labels)
    TRUNCATED_BYTES.labels(*labels)


