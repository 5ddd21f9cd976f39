"""One shard as the gateway sees it: a commitlog service (writes, topics) and a query service (reads).

Protobuf stays close to the wire here: sends are forwarded as bytes. ``SendBatchRequest`` and
``AppendBatchRequest`` carry their messages in field 1 with the same type, and a ``SendRequest``
(field 1: one message) is one such entry, so once the gateway has cleared its own routing fields the
client's requests *are* the commitlog's AppendBatch, and serialising them once is all the forwarding
costs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc

from gateway.cold_reads import ColdReads, follower_for
from gateway.leader import ShardLeader, not_leader
from gateway.metrics import FOLLOWER_READS
from gateway.resilience import BackendError, backend_error
from gateway.settings import ReplicaSettings, ShardSettings
from mqstore.v1 import commitlog_pb2, commitlog_pb2_grpc, common_pb2, query_pb2, query_pb2_grpc, scheduler_pb2_grpc
from services.server.channels import aio_channel
from services.server.etcd_client import EtcdError
from services.store.formats.socket_address import AddressError, encode_address
from services.store.rules.cold_read import NEXT_FROM_FOLLOWER

MIB = 1024 * 1024
CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 80 * MIB),
    ("grpc.max_send_message_length", 80 * MIB),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.keepalive_time_ms", 30_000),
]
T = TypeVar("T")
#: The longest a send that reached no leader waits for etcd to name the next one (its deadline may cut it).
LEADER_WAIT_S = 10.0
#: A new leader refusing a write it does not know it may take yet is asked again after this pause.
RETRY_PAUSE_S = 0.1
MIN_CALL_S = 1.0


def _identity(data: bytes) -> bytes:
    return data


async def call_backend(what: str, call: Callable[..., Awaitable[T]], request: Any, timeout: float) -> T:
    """One call to a backend service; a failure becomes a BackendError naming ``what`` was called."""
    try:
        return await call(request, timeout=timeout)
    except grpc.aio.AioRpcError as exc:
        raise backend_error(what, exc) from None


def _forget_task(tasks: set[asyncio.Future[Any]]) -> Callable[[asyncio.Future[Any]], None]:
    """A done callback that drops a background call from ``tasks``; its failure is expected (a follower
    down) and only retrieved, so that asyncio does not log it as never retrieved."""

    def done(task: asyncio.Future[Any]) -> None:
        tasks.discard(task)
        if not task.cancelled():
            task.exception()

    return done


class ReplicaCopy:
    """One copy of the shard's services (a replica, or the shard itself when it has one copy): its
    channels and stubs. ``calls`` names each stub method by where it sits, so a call made on one copy
    can be made again on another."""

    def __init__(self, shard: str, replica: ReplicaSettings) -> None:
        self.name = replica.name
        self.commitlog_address, self.query_address = replica.commitlog, replica.query
        self.scheduler_address, self.indexer_address = replica.scheduler, replica.indexer
        self.commitlog_channel = aio_channel(replica.commitlog, CHANNEL_OPTIONS)
        self.query_channel = aio_channel(replica.query, CHANNEL_OPTIONS)
        self.scheduler_channel = aio_channel(replica.scheduler, CHANNEL_OPTIONS)
        self.commitlog = commitlog_pb2_grpc.CommitLogServiceStub(self.commitlog_channel)
        self.query = query_pb2_grpc.QueryServiceStub(self.query_channel)
        # The shard's scheduler: transaction ends and checks (gateway/transaction_relay.py).
        self.transactions = scheduler_pb2_grpc.TransactionServiceStub(self.scheduler_channel)
        # Requests already serialised by the gateway (see the module docstring).
        self.append_batch_bytes = self.commitlog_channel.unary_unary(
            "/mqstore.v1.CommitLogService/AppendBatch", request_serializer=_identity,
            response_deserializer=commitlog_pb2.AppendBatchResponse.FromString)
        # Pull answers go back to the client as the query service wrote them.
        self.pull_bytes = self.query_channel.unary_unary(
            "/mqstore.v1.QueryService/PullMessage", request_serializer=query_pb2.PullMessageRequest.SerializeToString,
            response_deserializer=_identity)
        of = f" {replica.name}" if replica.name else ""
        self.commitlog_what = f"the commitlog of {shard}{of} ({replica.commitlog})"
        self.query_what = f"the query service of {shard}{of} ({replica.query})"
        self.scheduler_what = f"the scheduler of {shard}{of} ({replica.scheduler})"
        self.calls: dict[int, tuple[str, str]] = {id(self.append_batch_bytes): ("", "append_batch_bytes"),
                                                  id(self.pull_bytes): ("", "pull_bytes")}
        for stub_name in ("commitlog", "query"):
            for method, call in vars(getattr(self, stub_name)).items():
                self.calls[id(call)] = (stub_name, method)

    def call(self, where: tuple[str, str]) -> Any:
        stub_name, method = where
        return getattr(getattr(self, stub_name) if stub_name else self, method)

    async def close(self) -> None:
        await self.commitlog_channel.close(None)
        await self.query_channel.close(None)
        await self.scheduler_channel.close(None)


def not_appended(exc: BackendError) -> bool:
    """The commitlog surely did not append: it could not be reached, or it answered that it is not the
    leader (refused under the put lock, before any byte is written). Anything else (a timeout, a lost
    connection, SYNC_MASTER's refusal after the append) may have stored the message."""
    if exc.code == grpc.StatusCode.FAILED_PRECONDITION:
        return not_leader(exc) is not None
    return exc.code == grpc.StatusCode.UNAVAILABLE and exc.not_applied


class ShardClient:
    """The shard's services; for a replicated shard, the leader's, following etcd (``leader``): a send
    that reaches a replica that did not append waits for the next leader (within its deadline and
    LEADER_WAIT_S) and is made once more there; a read the leader's copy cannot answer goes to an
    in-sync follower's (RocketMQ's slaveReadEnable)."""

    def __init__(self, index: int, settings: ShardSettings) -> None:
        self.index = index
        self.name = settings.name
        self.settings = settings
        replicas = settings.replicas or (ReplicaSettings("", settings.commitlog, settings.query,
                                                         settings.scheduler_address, settings.indexer_address),)
        self._copies = {r.name: ReplicaCopy(self.name, r) for r in replicas}
        self._last = self._copies[replicas[0].name]
        self.leader = ShardLeader(settings.etcd, settings.broker_name) if settings.replicas else None
        self._cold_reads = ColdReads()
        #: Calls made on followers that nobody waits for (on_every_replica), kept until done.
        self._background: set[asyncio.Future[Any]] = set()
        self.store_host: str | None = None
        #: The store's maxMessageSize (the largest record it takes), learned with the store host.
        self.max_message_size: int | None = None
        #: ``store_host`` as the STOREHOST bytes an offset msg id carries (None if it has no such form),
        #: encoded once when learned: every GetMessage by offset msg id compares them.
        self.store_host_bytes: bytes | None = None

    @property
    def current(self) -> ReplicaCopy:
        """The leader's copy; between leaders the last one's (its calls fail and wait for the next)."""
        name = self.leader.leader if self.leader is not None else None
        if name is not None and name in self._copies:
            self._last = self._copies[name]
        return self._last

    @property
    def copies(self) -> list[ReplicaCopy]:
        """Every copy of the shard (a replicated shard's replicas, in the settings' order)."""
        return list(self._copies.values())

    @property
    def commitlog(self) -> commitlog_pb2_grpc.CommitLogServiceStub:
        return self.current.commitlog

    @property
    def query(self) -> query_pb2_grpc.QueryServiceStub:
        return self.current.query

    @property
    def transactions(self) -> scheduler_pb2_grpc.TransactionServiceStub:
        return self.current.transactions

    @property
    def append_batch_bytes(self) -> Any:
        return self.current.append_batch_bytes

    @property
    def pull_bytes(self) -> Any:
        return self.current.pull_bytes

    async def close(self) -> None:
        if self.leader is not None:
            self.leader.close()
        for copy in self._copies.values():
            await copy.close()

    def _made_on(self, call: Any) -> tuple[ReplicaCopy, tuple[str, str]] | None:
        for copy in self._copies.values():
            where = copy.calls.get(id(call))
            if where is not None:
                return copy, where
        return None

    async def on_commitlog(self, call: Callable[..., Awaitable[T]], request: Any, timeout: float) -> T:
        made = self._made_on(call)
        copy = made[0] if made is not None else self.current
        try:
            return await call_backend(copy.commitlog_what, call, request, timeout)
        except BackendError as exc:
            if self.leader is None or made is None or not not_appended(exc):
                raise
            again: T = await self._on_next_leader(made[1], copy.name, request, timeout, exc)
            return again

    async def _on_next_leader(self, where: tuple[str, str], refused_by: str, request: Any, timeout: float,
                              first: BackendError) -> Any:
        """A write no replica appended, made again on the leader etcd names next, until one appends it or
        the bound passes. The replica etcd names may refuse for a moment more (it learns that it leads
        from etcd too): that refusal is again one that appended nothing."""
        assert self.leader is not None
        deadline = time.monotonic() + min(timeout, LEADER_WAIT_S)
        last = first
        while (left := deadline - time.monotonic()) > 0:
            leader = await self.leader.next_leader(refused_by, left)
            if leader is None or leader not in self._copies:
                break
            again = self._copies[leader]
            try:
                return await call_backend(again.commitlog_what, again.call(where), request,
                                          max(deadline - time.monotonic(), MIN_CALL_S))
            except BackendError as exc:
                if not not_appended(exc):
                    raise
                last, refused_by = exc, ("" if leader == self.leader.leader else leader)
                await asyncio.sleep(RETRY_PAUSE_S)
        raise last

    async def on_query(self, call: Callable[..., Awaitable[T]], request: Any, timeout: float) -> T:
        made = self._made_on(call)
        copy = made[0] if made is not None else self.current
        try:
            return await call_backend(copy.query_what, call, request, timeout)
        except BackendError as exc:
            if self.leader is None or made is None or exc.code != grpc.StatusCode.UNAVAILABLE:
                raise
            elsewhere: T = await self._on_in_sync(made[1], copy.name, request, timeout, exc)
            return elsewhere

    async def pull(self, request: query_pb2.PullMessageRequest, timeout: float) -> bytes:
        """A pull's answer as the query service wrote it. On a replicated shard: from the leader, or from
        an in-sync follower where the pull before it read cold data (gateway/cold_reads.py); a follower
        that returns no message (it has not got there yet, or cannot answer) is passed over for the leader."""
        if self.leader is None:
            return await self.on_query(self.pull_bytes, request, timeout)
        follower = self._cold_follower(request)
        if follower is not None:
            at_once = query_pb2.PullMessageRequest()
            at_once.CopyFrom(request)
            at_once.long_poll_ms = 0  # a follower with nothing there yet must not hold the pull: the leader waits
            try:
                data, cold = await self._pull_on(follower, at_once, timeout)
            except BackendError:
                pass
            else:
                response = query_pb2.PullMessageResponse.FromString(data)
                if response.messages or response.record_count:
                    FOLLOWER_READS.labels(self.name, follower.name, "cold").inc()
                    if cold is not None:
                        self._cold_reads.remember(request.topic, request.queue_id, cold)
                    return data
        leader = self.current
        try:
            data, cold = await self._pull_on(leader, request, timeout)
        except BackendError as exc:
            if exc.code != grpc.StatusCode.UNAVAILABLE:
                raise
            return await self._pull_in_sync(request, leader.name, timeout, exc)
        if cold is not None:
            self._cold_reads.remember(request.topic, request.queue_id, cold)
        return data

    async def _pull_in_sync(self, request: query_pb2.PullMessageRequest, failed: str, timeout: float,
                            first: BackendError) -> bytes:
        """The leader's query service cannot be reached: an in-sync follower answers the pull. Its indexer
        may not have reached an offset the leader acknowledged yet (its queue ends before the offset asked
        for: OFFSET_OVERFLOW_BADLY or NO_MESSAGE_IN_QUEUE, an offset a RocketMQ slave does not correct
        either), so such an answer is asked for again until the pull's long poll ends."""
        ends = time.monotonic() + min(timeout, request.long_poll_ms / 1000)
        while True:
            data: bytes = await self._on_in_sync(("", "pull_bytes"), failed, request, timeout, first)
            if time.monotonic() + RETRY_PAUSE_S >= ends or \
                    query_pb2.PullMessageResponse.FromString(data).max_offset >= request.queue_offset:
                return data
            await asyncio.sleep(RETRY_PAUSE_S)

    def _cold_follower(self, request: query_pb2.PullMessageRequest) -> ReplicaCopy | None:
        """The in-sync follower this pull goes to, if the pull before it read cold data."""
        assert self.leader is not None
        if not self._cold_reads or not self._cold_reads.take(request.topic, request.queue_id, request.queue_offset):
            return None
        followers = [n for n in self.leader.in_sync if n != self.leader.leader and n in self._copies]
        return self._copies[follower_for(request.topic, request.queue_id, followers)] if followers else None

    @staticmethod
    async def _pull_on(copy: ReplicaCopy, request: query_pb2.PullMessageRequest,
                       timeout: float) -> tuple[bytes, int | None]:
        """A pull on ``copy``, and where the next pull should start on a follower, if it said so."""
        call = copy.pull_bytes(request, timeout=timeout)
        try:
            data: bytes = await call
            trailing = await call.trailing_metadata()
        except grpc.aio.AioRpcError as exc:
            raise backend_error(copy.query_what, exc) from None
        for key, value in trailing or ():
            if key == NEXT_FROM_FOLLOWER:
                return data, int(value)
        return data, None

    async def on_every_replica(self, method: str, request: Any, timeout: float) -> Any:
        """A query service call made on every replica (consumer group membership, which each replica's
        query service keeps in memory: a new leader then knows the members without waiting for their next
        heartbeat). The leader's answer; another replica's only while the leader's is UNAVAILABLE. The
        followers' calls are not waited for otherwise, so a follower that hangs does not slow the call."""
        if self.leader is None:
            return await self.on_query(getattr(self.query, method), request, timeout)
        leader = self.current
        others = [asyncio.ensure_future(call_backend(c.query_what, getattr(c.query, method), request, timeout))
                  for c in self._copies.values() if c is not leader]
        for task in others:
            self._background.add(task)
            task.add_done_callback(_forget_task(self._background))
        try:
            return await call_backend(leader.query_what, getattr(leader.query, method), request, timeout)
        except BackendError as exc:
            if exc.code != grpc.StatusCode.UNAVAILABLE:
                raise
            for task in others:
                try:
                    return await task
                except BackendError:
                    continue
            raise

    async def _on_in_sync(self, where: tuple[str, str], failed: str, request: Any, timeout: float,
                          first: BackendError) -> Any:
        """A read made again on the in-sync replicas other than ``failed``, the first answer wins."""
        assert self.leader is not None
        try:
            in_sync = await asyncio.to_thread(self.leader.refresh_in_sync)
        except EtcdError:
            in_sync = self.leader.in_sync
        for name in sorted(in_sync - {failed}):
            copy = self._copies.get(name)
            if copy is None:
                continue
            try:
                answer = await call_backend(copy.query_what, copy.call(where), request, timeout)
            except BackendError as exc:
                if exc.code != grpc.StatusCode.UNAVAILABLE:
                    raise
            else:
                FOLLOWER_READS.labels(self.name, name, "leader_unreachable").inc()
                return answer
        raise first

    async def on_scheduler(self, call: Callable[..., Awaitable[T]], request: Any, timeout: float) -> T:
        return await call_backend(self.current.scheduler_what, call, request, timeout)

    @property
    def channels(self) -> dict[str, grpc.aio.Channel]:
        """The shard's open channels by service (``mqstore status`` health-checks over them)."""
        copy = self.current
        return {"commitlog": copy.commitlog_channel, "query": copy.query_channel,
                "scheduler": copy.scheduler_channel}

    async def topics(self, timeout: float, topic: str = "") -> list[common_pb2.TopicConfig]:
        """The shard's topic configs; with ``topic``, only that one's (filtered here too: a shard of an
        older version answers every topic)."""
        response = await self.on_commitlog(self.commitlog.ListTopics, commitlog_pb2.ListTopicsRequest(topic=topic),
                                           timeout)
        return [c for c in response.topics if c.topic == topic] if topic else list(response.topics)

    async def learn_store_host(self, timeout: float) -> str:
        info = await self.on_commitlog(self.commitlog.GetStoreInfo, commitlog_pb2.GetStoreInfoRequest(), timeout)
        self.max_message_size = info.max_message_size or None
        store_host: str = info.store_host
        try:
            self.store_host_bytes = encode_address(store_host)
        except AddressError:
            self.store_host_bytes = None
        self.store_host = store_host
        return store_host


__all__ = ["BackendError", "ShardClient"]
