"""Operator RPCs of the MessagingService: the cluster's status and topic deletion (admin.proto).

GetClusterStatus is ``mqadmin clusterList`` / ``brokerStatus`` in one answer: every shard's services
by their gRPC health, the commitlog's offsets, disk use against its watermarks and flush lag, the
indexer's dispatch lag, and topic and group counts. Every question goes to every shard at once and a
service that does not answer is reported as such (the answer is never an error because a shard is
down: that is what an operator asks it for).

DeleteTopic is RocketMQ's deleteTopic on every shard: the commitlog takes the topic out of its topic
table (answering its max offset at that moment), then the indexer removes the topic's ConsumeQueues
once it has dispatched that far and tells the query services to forget them. A shard whose commitlog
no longer has the topic still has its indexer asked (a retry after a failed first attempt finishes
the job); NOT_FOUND only when no shard had anything of it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gateway.resilience import BackendError
from gateway.shard import CHANNEL_OPTIONS, ShardClient, call_backend
from mqstore.v1 import admin_pb2, commitlog_pb2, groups_pb2, indexer_pb2, indexer_pb2_grpc
from services.server.channels import aio_channel
from services.server.etcd_client import EtcdError
from services.store.errors import NotFoundError
from services.store.rules.names import check_deletable_topic

SERVING = "SERVING"
UNREACHABLE = "UNREACHABLE"
#: A health check answers at once or the service is not there: status does not wait a whole deadline.
HEALTH_TIMEOUT_S = 2.0


class ShardAdmin:
    """The channels status and deletion need beyond :class:`ShardClient`'s: the indexer, and a health
    stub per service; for a replicated shard, those of the replica that leads now."""

    def __init__(self, shard: ShardClient) -> None:
        self.shard = shard
        self._indexer_channels = {c.name: aio_channel(c.indexer_address, CHANNEL_OPTIONS) for c in shard.copies}
        self._indexers = {name: indexer_pb2_grpc.IndexerServiceStub(channel)
                          for name, channel in self._indexer_channels.items()}

    @property
    def addresses(self) -> dict[str, str]:
        copy = self.shard.current
        return {"commitlog": copy.commitlog_address, "indexer": copy.indexer_address, "query": copy.query_address,
                "scheduler": copy.scheduler_address}

    @property
    def indexer(self) -> indexer_pb2_grpc.IndexerServiceStub:
        return self._indexers[self.shard.current.name]

    async def close(self) -> None:
        for channel in self._indexer_channels.values():  # the others are the shard client's
            await channel.close(None)

    async def on_indexer(self, call: Any, request: Any, timeout: float) -> Any:
        copy = self.shard.current
        of = f" {copy.name}" if copy.name else ""
        return await call_backend(f"the indexer of {self.shard.name}{of} ({copy.indexer_address})", call, request,
                                  timeout)

    async def health(self, name: str, timeout: float) -> admin_pb2.ServiceStatus:
        status = admin_pb2.ServiceStatus(name=name, address=self.addresses[name])
        channels = {**self.shard.channels, "indexer": self._indexer_channels[self.shard.current.name]}
        stub = health_pb2_grpc.HealthStub(channels[name])
        try:
            answer = await stub.Check(health_pb2.HealthCheckRequest(), timeout=min(timeout, HEALTH_TIMEOUT_S))
        except grpc.aio.AioRpcError as exc:
            status.state, status.error = UNREACHABLE, f"{exc.code().name}: {exc.details() or ''}".strip()
            return status
        status.state = health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status)
        if status.state != SERVING:
            status.error = f"its health check answers {status.state}"
        return status


class Admin:
    def __init__(self, shards: Sequence[ShardClient]) -> None:
        self.shards = [ShardAdmin(shard) for shard in shards]

    async def close(self) -> None:
        for shard in self.shards:
            await shard.close()

    # -- status ------------------------------------------------------------------------------------------
    async def cluster_status(self, timeout: float) -> admin_pb2.ClusterStatus:
        answers = await asyncio.gather(*(self._shard_status(shard, timeout) for shard in self.shards))
        status = admin_pb2.ClusterStatus(healthy=all(s.healthy for s, _, _ in answers))
        topics: set[str] = set()
        groups: set[str] = set()
        for shard_status, shard_topics, shard_groups in answers:
            status.shards.append(shard_status)
            topics |= shard_topics
            groups |= shard_groups
        status.topic_count, status.group_count = len(topics), len(groups)
        return status

    async def _shard_status(self, admin: ShardAdmin, timeout: float
                            ) -> tuple[admin_pb2.ShardStatus, set[str], set[str]]:
        shard = admin.shard
        healths = asyncio.gather(*(admin.health(name, timeout) for name in admin.addresses))
        store, dispatch, topics, groups = await asyncio.gather(
            shard.on_commitlog(shard.commitlog.GetStoreInfo, commitlog_pb2.GetStoreInfoRequest(), timeout),
            admin.on_indexer(admin.indexer.GetDispatchStatus, indexer_pb2.GetDispatchStatusRequest(), timeout),
            shard.topics(timeout),
            shard.on_query(shard.query.DescribeGroups, groups_pb2.DescribeGroupsRequest(), timeout),
            return_exceptions=True)
        status = admin_pb2.ShardStatus(name=shard.name, services=await healths)
        healthy = all(s.state == SERVING for s in status.services)
        if isinstance(store, commitlog_pb2.StoreInfo):
            status.min_offset, status.max_offset, status.flushed_offset = \
                store.min_offset, store.max_offset, store.flushed_offset
            status.flush_lag_bytes = max(store.max_offset - store.flushed_offset, 0)
            status.disk_total_bytes, status.disk_used_bytes = store.disk_total_bytes, store.disk_used_bytes
            status.disk_used_ratio = store.disk_used_ratio
            status.disk_clean_ratio, status.disk_refuse_ratio = store.disk_clean_ratio, store.disk_refuse_ratio
            status.disk_full = store.disk_full
        else:
            healthy = _note(status, "commitlog", store)
        if isinstance(dispatch, indexer_pb2.DispatchStatus):
            status.reput_offset = dispatch.reput_offset
            known = isinstance(store, commitlog_pb2.StoreInfo)
            behind = status.max_offset if known else dispatch.commitlog_max_offset
            status.dispatch_lag_bytes = max(behind - dispatch.reput_offset, 0)
            status.dispatch_lag_ms = max(dispatch.behind_ms, 0)
        else:
            healthy = _note(status, "indexer", dispatch)
        topic_names = {t.topic for t in topics} if isinstance(topics, list) else set()
        group_names = {g.group for g in groups.groups} if isinstance(groups, groups_pb2.DescribeGroupsResponse) \
            else set()
        if isinstance(topics, BaseException):  # a shard whose topics are unknown is not healthy with 0 topics
            healthy = _note(status, "commitlog", topics)
        if isinstance(groups, BaseException):
            healthy = _note(status, "query", groups)
        status.topic_count, status.group_count = len(topic_names), len(group_names)
        status.replicas.extend(await replica_statuses(shard, timeout))
        healthy = healthy and all(r.role != UNREACHABLE for r in status.replicas)
        status.healthy = healthy and not status.disk_full
        return status, topic_names, group_names

    # -- topic deletion -----------------------------------------------------------------------------------
    async def delete_topic(self, topic: str, timeout: float) -> admin_pb2.DeleteTopicResponse:
        check_deletable_topic(topic)
        response = admin_pb2.DeleteTopicResponse()
        # One shard after the other: a failure stops the deletion where it is, and the same call again
        # finishes it (see the module docstring).
        for admin in self.shards:
            shard = admin.shard
            try:
                answer = await shard.on_commitlog(shard.commitlog.DeleteTopic,
                                                  admin_pb2.DeleteTopicRequest(topic=topic), timeout)
                had_config, offset = True, answer.commitlog_offset
            except BackendError as exc:
                if exc.code != grpc.StatusCode.NOT_FOUND:
                    raise
                had_config, offset = False, 0
            request = admin_pb2.DeleteTopicRequest(topic=topic, commitlog_offset=offset)
            removed = await admin.on_indexer(admin.indexer.DeleteTopic, request, timeout)
            if had_config or removed.deleted_queues:
                response.shards.append(shard.name)
                response.deleted_queues += removed.deleted_queues
        if not response.shards:
            raise NotFoundError(f"topic {topic!r} does not exist on any shard: nothing to delete (mqstore topics "
                                "list shows the topics)")
        return response


async def replica_statuses(shard: ShardClient, timeout: float) -> list[admin_pb2.ReplicaStatus]:
    """A replicated shard's replicas: role and epoch as etcd names them, in-sync membership from etcd's
    ``inSync``, max offset from each commitlog's GetStoreInfo and the lag behind the leader's."""
    leader = shard.leader
    if leader is None:
        return []
    try:
        in_sync = await asyncio.to_thread(leader.refresh_in_sync)
    except EtcdError:
        in_sync = leader.in_sync
    copies = shard.copies
    request, deadline = commitlog_pb2.GetStoreInfoRequest(), min(timeout, HEALTH_TIMEOUT_S)
    infos = await asyncio.gather(*(call_backend(c.commitlog_what, c.commitlog.GetStoreInfo, request, deadline)
                                   for c in copies), return_exceptions=True)
    leader_name, epoch = leader.leader, leader.epoch
    leader_max = next((i.max_offset for c, i in zip(copies, infos, strict=True)
                       if c.name == leader_name and isinstance(i, commitlog_pb2.StoreInfo)), None)
    statuses = []
    for copy, info in zip(copies, infos, strict=True):
        status = admin_pb2.ReplicaStatus(name=copy.name, commitlog=copy.commitlog_address, epoch=epoch,
                                         in_sync=copy.name in in_sync)
        if isinstance(info, commitlog_pb2.StoreInfo):
            status.role = "LEADER" if copy.name == leader_name else "FOLLOWER"
            status.max_offset = info.max_offset
            status.lag_bytes = max(leader_max - info.max_offset, 0) if leader_max is not None else 0
        elif isinstance(info, BackendError):
            status.role, status.error = UNREACHABLE, str(info)
        else:
            raise info
        statuses.append(status)
    return statuses


def _note(status: admin_pb2.ShardStatus, service: str, failure: BaseException) -> bool:
    """A call that failed: its service's entry says why (if its health check did not already)."""
    if not isinstance(failure, BackendError):
        raise failure
    for entry in status.services:
        if entry.name == service and not entry.error:
            entry.error = str(failure)
    return False
