"""One shard as the gateway sees it: a commitlog service (writes, topics) and a query service (reads).

Protobuf stays close to the wire here: sends are forwarded as bytes. ``SendBatchRequest`` and
``AppendBatchRequest`` carry their messages in field 1 with the same type, and a ``SendRequest``
(field 1: one message) is one such entry, so once the gateway has cleared its own routing fields the
client's requests *are* the commitlog's AppendBatch, and serialising them once is all the forwarding
costs.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc

from gateway.resilience import BackendError, backend_error
from gateway.settings import ShardSettings
from mqstore.v1 import commitlog_pb2, commitlog_pb2_grpc, common_pb2, query_pb2, query_pb2_grpc, scheduler_pb2_grpc
from services.server.channels import aio_channel
from services.store.formats.socket_address import AddressError, encode_address

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


def _identity(data: bytes) -> bytes:
    return data


async def call_backend(what: str, call: Callable[..., Awaitable[T]], request: Any, timeout: float) -> T:
    """One call to a backend service; a failure becomes a BackendError naming ``what`` was called."""
    try:
        return await call(request, timeout=timeout)
    except grpc.aio.AioRpcError as exc:
        raise backend_error(what, exc) from None


class ShardClient:
    def __init__(self, index: int, settings: ShardSettings) -> None:
        self.index = index
        self.name = settings.name
        self.settings = settings
        self._commitlog_channel = aio_channel(settings.commitlog, CHANNEL_OPTIONS)
        self._query_channel = aio_channel(settings.query, CHANNEL_OPTIONS)
        self.commitlog = commitlog_pb2_grpc.CommitLogServiceStub(self._commitlog_channel)
        self.query = query_pb2_grpc.QueryServiceStub(self._query_channel)
        # The shard's scheduler: transaction ends and checks (gateway/transaction_relay.py).
        self._scheduler_channel = aio_channel(settings.scheduler_address, CHANNEL_OPTIONS)
        self.transactions = scheduler_pb2_grpc.TransactionServiceStub(self._scheduler_channel)
        self._scheduler_what = f"the scheduler of {self.name} ({settings.scheduler_address})"
        # Requests already serialised by the gateway (see the module docstring).
        self.append_batch_bytes = self._commitlog_channel.unary_unary(
            "/mqstore.v1.CommitLogService/AppendBatch", request_serializer=_identity,
            response_deserializer=commitlog_pb2.AppendBatchResponse.FromString)
        # Pull answers go back to the client as the query service wrote them.
        self.pull_bytes = self._query_channel.unary_unary(
            "/mqstore.v1.QueryService/PullMessage", request_serializer=query_pb2.PullMessageRequest.SerializeToString,
            response_deserializer=_identity)
        self.store_host: str | None = None
        #: The store's maxMessageSize (the largest record it takes), learned with the store host.
        self.max_message_size: int | None = None
        #: ``store_host`` as the STOREHOST bytes an offset msg id carries (None if it has no such form),
        #: encoded once when learned: every GetMessage by offset msg id compares them.
        self.store_host_bytes: bytes | None = None
        self._commitlog_what = f"the commitlog of {self.name} ({settings.commitlog})"
        self._query_what = f"the query service of {self.name} ({settings.query})"

    async def close(self) -> None:
        await self._commitlog_channel.close(None)
        await self._query_channel.close(None)
        await self._scheduler_channel.close(None)

    async def on_commitlog(self, call: Callable[..., Awaitable[T]], request: Any, timeout: float) -> T:
        return await call_backend(self._commitlog_what, call, request, timeout)

    async def on_query(self, call: Callable[..., Awaitable[T]], request: Any, timeout: float) -> T:
        return await call_backend(self._query_what, call, request, timeout)

    async def on_scheduler(self, call: Callable[..., Awaitable[T]], request: Any, timeout: float) -> T:
        return await call_backend(self._scheduler_what, call, request, timeout)

    @property
    def channels(self) -> dict[str, grpc.aio.Channel]:
        """The shard's open channels by service (``mqstore status`` health-checks over them)."""
        return {"commitlog": self._commitlog_channel, "query": self._query_channel,
                "scheduler": self._scheduler_channel}

    async def topics(self, timeout: float) -> list[common_pb2.TopicConfig]:
        response = await self.on_commitlog(self.commitlog.ListTopics, commitlog_pb2.ListTopicsRequest(), timeout)
        return list(response.topics)

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
