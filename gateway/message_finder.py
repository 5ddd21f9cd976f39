"""Finding one message among the shards: by the store host an offset msg id names, else by UNIQ_KEY
on every shard (a UNIQ_KEY says which producer made it, not where it was stored)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import grpc
from mqstore.v1 import query_pb2

from gateway.resilience import BackendError, RetryPolicy
from gateway.shard import ShardClient
from services.query.lookup import OFFSET_ID_LENGTHS
from services.store.errors import InvalidArgumentError, NotFoundError
from services.store.message_id import MessageIdError, decode_message_id

log = logging.getLogger(__name__)


class MessageFinder:
    def __init__(self, shards: Sequence[ShardClient], retry: RetryPolicy) -> None:
        self.shards = tuple(shards)
        self.retry = retry

    def shard_of(self, message: query_pb2.StoredMessage) -> ShardClient | None:
        """The shard whose commitlog stored the message (by its store host)."""
        for shard in self.shards:
            if shard.store_host == message.store_host:
                return shard
        return None

    async def find(self, request: query_pb2.ViewMessageRequest, msg_id: str,
                   timeout: float) -> query_pb2.ViewMessageResponse:
        """An offset msg id is asked of the shard its store host names; a UNIQ_KEY (or an id that may be
        either) of every shard not asked yet, first found wins."""
        kind = request.kind
        asked: set[str] = set()
        not_found: list[str] = []
        if kind != query_pb2.MESSAGE_ID_KIND_UNIQ_KEY and len(msg_id) in OFFSET_ID_LENGTHS:
            try:
                store_host, _ = decode_message_id(msg_id)
            except MessageIdError as exc:
                if kind == query_pb2.MESSAGE_ID_KIND_OFFSET:
                    raise InvalidArgumentError(str(exc)) from None
                store_host = None
            if store_host is not None:
                shard = await self._shard_by_store_host(store_host, timeout)
                if shard is not None:
                    asked.add(shard.name)
                    try:
                        return await self._view(shard, request, timeout)
                    except BackendError as exc:
                        if exc.code != grpc.StatusCode.NOT_FOUND:
                            raise
                        not_found.append(exc.details)
                elif kind == query_pb2.MESSAGE_ID_KIND_OFFSET:
                    hosts = ", ".join(f"{s.name}={s.store_host}" for s in self.shards)
                    raise NotFoundError(f"offset msg id {msg_id} names store host {store_host}, which no shard of "
                                        f"this gateway has ({hosts})")
        if kind != query_pb2.MESSAGE_ID_KIND_OFFSET:
            by_key = query_pb2.ViewMessageRequest(msg_id=msg_id, topic=request.topic,
                                                  kind=query_pb2.MESSAGE_ID_KIND_UNIQ_KEY)
            for shard in self.shards:
                if shard.name in asked:
                    continue
                try:
                    return await self._view(shard, by_key, timeout)
                except BackendError as exc:
                    if exc.code not in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT):
                        raise
                    if exc.code == grpc.StatusCode.INVALID_ARGUMENT and kind == query_pb2.MESSAGE_ID_KIND_UNIQ_KEY:
                        raise
                    not_found.append(exc.details)
        if not not_found:
            raise InvalidArgumentError(f"msg_id {msg_id!r} is neither an offset msg id (32 or 56 hex digits) nor "
                                       "a UNIQ_KEY (32 hex digits)")
        raise NotFoundError("; ".join(not_found))

    async def _view(self, shard: ShardClient, request: query_pb2.ViewMessageRequest,
                    timeout: float) -> query_pb2.ViewMessageResponse:
        return await self.retry.read(lambda: shard.on_query(shard.query.ViewMessage, request, timeout))

    async def _shard_by_store_host(self, store_host: str, timeout: float) -> ShardClient | None:
        for shard in self.shards:
            if shard.store_host is None:
                try:
                    await shard.learn_store_host(timeout)
                except BackendError as exc:
                    log.warning("cannot learn the store host of %s: %s", shard.name, exc.details)
            if shard.store_host == store_host:
                return shard
        return None
