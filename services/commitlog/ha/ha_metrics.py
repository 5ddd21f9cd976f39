"""Replication's Prometheus metrics, exported by the commitlog process that replicates.

The leader's followers (offset, lag, how many in sync) are read from its GroupTransfer when scraped:
nothing on the put path. Counters count what happened: refused handshakes, puts SYNC_MASTER could
not acknowledge (by 4.9.8's status), and a follower's appends. Under etcd leadership: the epoch, the
in-sync set's size, leaderships taken and bytes truncated.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import REGISTRY, Metric
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from services.commitlog.ha.group_transfer import GroupTransfer
from services.server.metrics import Counter, Gauge

REFUSED_CONNECTIONS = Counter("mqstore_commitlog_ha_refused_connections",
                              "HA connections closed at the handshake (wrong token, shard or epoch, or none)")
UNREPLICATED_PUTS = Counter("mqstore_commitlog_ha_unreplicated_puts",
                            "SYNC_MASTER put calls answered UNAVAILABLE: not on enough in-sync followers",
                            ["status"])
REPLICATED_BYTES = Counter("mqstore_commitlog_ha_replicated_bytes",
                           "Bytes a follower appended from its leader's stream")
EPOCH = Gauge("mqstore_commitlog_ha_epoch", "The epoch this replica leads or follows (etcd leadership; 0: none)")
IN_SYNC_REPLICAS = Gauge("mqstore_commitlog_ha_in_sync_replicas",
                         "Members of the shard's in-sync set in etcd, the leader included (set by the leader)")
LEADERSHIPS = Counter("mqstore_commitlog_ha_leaderships",
                      "Times this replica took its shard through etcd (a first election or a failover)")
TRUNCATED_BYTES = Counter("mqstore_commitlog_ha_truncated_bytes",
                          "Bytes of a divergent, never acknowledged suffix cut from this replica's log")


class FollowersCollector(Collector):
    def __init__(self, transfer: GroupTransfer, leader_max: Callable[[], int]) -> None:
        self._transfer = transfer
        self._leader_max = leader_max

    def collect(self) -> Iterator[Metric]:
        leader_max = self._leader_max()
        followers = self._transfer.followers
        lag = GaugeMetricFamily("mqstore_commitlog_ha_follower_lag_bytes",
                                "How far each connected follower's reported offset is behind the leader's max "
                                "offset", labels=["follower"])
        for follower in followers:
            if follower.acked_offset >= 0:
                lag.add_metric([follower.address], max(0, leader_max - follower.acked_offset))
        yield lag
        yield GaugeMetricFamily("mqstore_commitlog_ha_connected_followers",
                                "Followers connected past the handshake", value=len(followers))
        yield GaugeMetricFamily("mqstore_commitlog_ha_followers_needed",
                                "Followers a SYNC_MASTER put needs (minInSyncReplicas less the leader)",
                                value=self._transfer.followers_needed)


_collector: FollowersCollector | None = None


def bind_followers(transfer: GroupTransfer, leader_max: Callable[[], int]) -> None:
    """Expose one leader's followers (replacing an earlier leader's in this process)."""
    global _collector
    if _collector is not None:
        REGISTRY.unregister(_collector)
    _collector = FollowersCollector(transfer, leader_max)
    REGISTRY.register(_collector)


