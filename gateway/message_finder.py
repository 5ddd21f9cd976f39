"""Finding one message among the shards.

An offset msg id names the store host that wrote the record, which is a hint, not an address: a
shard's host changes when its broker IP does (a rescheduled pod) and its commitlog keeps the records
of every host it had. So the shard whose current store host the id names is asked first, then every
other shard in shard order (each answers for every host its records carry). A UNIQ_KEY says which
producer made a message, not where it was stored: every shard is asked. An id of either length may be
either kind; without a kind each shard tries it as an offset id, then as a UNIQ_KEY. The first shard
that finds it wins; when none does, the error gives each shard's answer.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

import grpc

from gateway.resilience import BackendError, RetryPolicy
from gateway.shard import ShardClient
from mqstore.v1 import query_pb2
from services.store.errors import InvalidArgumentError, NotFoundError
from services.store.formats.message_id import MessageIdError, parse_message_id

log = logging.getLogger(__name__)

# Store hosts learned longer ago than this are asked again when an offset id names none of them.
STORE_HOST_MAX_AGE_S = 10.0


class MessageFinder:
    def __init__(self, shards: Sequence[ShardClient], retry: RetryPolicy) -> None:
        self.shards = tuple(shards)
        self.retry = retry
        self._hosts_learned_at = float("-inf")

    async def find(self, request: query_pb2.ViewMessageRequest, msg_id: str,
                   timeout: float) -> tuple[query_pb2.ViewMessageResponse, ShardClient]:
        """The message and the shard that holds it. ``msg_id`` is the request's id, already checked."""
        # The caller's request is forwarded as it is unless its id had surrounding spaces.
        ask = request if request.msg_id == msg_id else \
            query_pb2.ViewMessageRequest(msg_id=msg_id, topic=request.topic, kind=request.kind)
        not_found: list[str] = []
        for shard in await self._order(msg_id, request.kind, timeout):
            try:
                return await self._view(shard, ask, timeout), shard
            except BackendError as exc:
                if exc.code != grpc.StatusCode.NOT_FOUND:
                    raise
                not_found.append(f"{shard.name}: {exc.details}")
        raise NotFoundError("; ".join(not_found))

    async def _order(self, msg_id: str, kind: int, timeout: float) -> list[ShardClient]:
        """Every shard, the one whose store host an offset id names first."""
        if kind == query_pb2.MESSAGE_ID_KIND_UNIQ_KEY:
            return list(self.shards)
        try:
            host = parse_message_id(msg_id).store_host_bytes
        except MessageIdError as exc:
            if kind == query_pb2.MESSAGE_ID_KIND_OFFSET:
                raise InvalidArgumentError(str(exc)) from None
            return list(self.shards)
        first = self._shard_by_store_host(host)
        if first is None and time.monotonic() - self._hosts_learned_at > STORE_HOST_MAX_AGE_S:
            await self._learn_store_hosts(timeout)
            first = self._shard_by_store_host(host)
        if first is None:
            return list(self.shards)
        return [first, *(s for s in self.shards if s is not first)]

    async def _view(self, shard: ShardClient, request: query_pb2.ViewMessageRequest,
                    timeout: float) -> query_pb2.ViewMessageResponse:
        return await self.retry.read(lambda: shard.on_query(shard.query.ViewMessage, request, timeout))

    def _shard_by_store_host(self, host: bytes) -> ShardClient | None:
        for shard in self.shards:
            if shard.store_host_bytes == host:
                return shard
        return None

    async def _learn_store_hosts(self, timeout: float) -> None:
        """Every shard's current store host, asked at once; a shard that cannot say keeps its last one."""
        self._hosts_learned_at = time.monotonic()

        async def learn(shard: ShardClient) -> None:
            try:
                await shard.learn_store_host(timeout)
            except BackendError as exc:
                log.warning("cannot learn the store host of %s: %s", shard.name, exc.details)

        await asyncio.gather(*(learn(shard) for shard in self.shards))
