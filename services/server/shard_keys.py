"""A replicated shard's keys in etcd and what they hold: shared by the commitlog's replicas, which write
them (services/commitlog/ha/leadership.py), and by whoever follows their leader (the gateway,
``mqstore up --replicas``, ``mqstore status``), which only read them.

Under ``/mqstore/shards/<shard>/`` (``<shard>`` is the replicas' ``brokerName``): ``leader`` (a
:class:`LeaderRecord`, attached to the leader's lease), ``epoch`` (the last epoch issued, decimal) and
``inSync`` (an :class:`InSyncSet`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from services.server.etcd_client import EtcdClient, Value

KEY_ROOT = "/mqstore/shards/"
#: How a replica that does not lead refuses a write (FAILED_PRECONDITION, before anything is appended):
#: whoever follows the leader may send such a write again to the next leader.
NOT_LEADER_REFUSAL = "is not the leader of shard"
#: The refusal's reason (its status detail, an ErrorInfo with a :class:`NotLeader`'s metadata): callers
#: decide by it, never by the words.
NOT_LEADER_REASON = "NOT_LEADER"


@dataclass(frozen=True, slots=True)
class ShardKeys:
    shard: str

    def key(self, name: str) -> bytes:
        return f"{KEY_ROOT}{self.shard}/{name}".encode()

    @property
    def leader(self) -> bytes:
        return self.key("leader")

    @property
    def epoch(self) -> bytes:
        return self.key("epoch")

    @property
    def in_sync(self) -> bytes:
        return self.key("inSync")


@dataclass(frozen=True, slots=True)
class LeaderRecord:
    replica: str
    ha_address: str
    epoch: int

    def encode(self) -> bytes:
        return json.dumps({"replica": self.replica, "haAddress": self.ha_address, "epoch": self.epoch},
                          sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes) -> LeaderRecord:
        doc = json.loads(data)
        return cls(str(doc["replica"]), str(doc["haAddress"]), int(doc["epoch"]))


@dataclass(frozen=True, slots=True)
class NotLeader:
    """A replica's refusal of a write because it does not lead its shard: who refused, and the leader it
    follows (``leader`` "" and ``epoch`` 0 while it knows none; ``leader_address`` is the leader's HA
    address)."""

    shard: str
    replica: str
    leader: str = ""
    leader_address: str = ""
    epoch: int = 0

    def metadata(self) -> dict[str, str]:
        return {"shard": self.shard, "replica": self.replica, "leader": self.leader,
                "leaderAddress": self.leader_address, "epoch": str(self.epoch)}

    @classmethod
    def of_metadata(cls, metadata: Mapping[str, str]) -> NotLeader:
        epoch = metadata.get("epoch", "0")
        return cls(metadata.get("shard", ""), metadata.get("replica", ""), metadata.get("leader", ""),
                   metadata.get("leaderAddress", ""), int(epoch) if epoch.isdigit() else 0)


@dataclass(frozen=True, slots=True)
class InSyncSet:
    epoch: int
    members: frozenset[str]

    def encode(self) -> bytes:
        return json.dumps({"epoch": self.epoch, "members": sorted(self.members)}).encode()

    @classmethod
    def decode(cls, data: bytes) -> InSyncSet:
        doc = json.loads(data)
        return cls(int(doc["epoch"]), frozenset(str(m) for m in doc["members"]))


@dataclass(frozen=True, slots=True)
class ShardView:
    """One consistent read of a shard's keys (each with the revision a transaction compares)."""

    leader: LeaderRecord | None
    epoch: int
    in_sync: InSyncSet | None
    revisions: tuple[int, int, int]  # leader, epoch, inSync mod revisions (0: absent)


def read_shard(client: EtcdClient, keys: ShardKeys) -> ShardView:
    leader, epoch, in_sync = client.get(keys.leader), client.get(keys.epoch), client.get(keys.in_sync)
    return ShardView(LeaderRecord.decode(leader.data) if leader else None,
                     int(epoch.data) if epoch else 0,
                     InSyncSet.decode(in_sync.data) if in_sync else None,
                     tuple(_revision(v) for v in (leader, epoch, in_sync)))  # type: ignore[arg-type]


def _revision(value: Value | None) -> int:
    return value.mod_revision if value is not None else 0
