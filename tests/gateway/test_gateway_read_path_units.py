"""The gateway's read path keeps per-call work out of the call: what a route or a shard can work out
once (each shard's route id base, the STOREHOST bytes of its store host) is worked out once."""

from __future__ import annotations

import asyncio
from typing import Any

from gateway.message_finder import MessageFinder
from gateway.resilience import RetryPolicy
from gateway.route import TopicRoute
from gateway.settings import ShardSettings
from gateway.shard import ShardClient
from mqstore.v1 import commitlog_pb2, common_pb2, query_pb2
from services.store.formats.message_id import make_message_id
from services.store.formats.socket_address import encode_address


class FakeShard:
    def __init__(self, name: str) -> None:
        self.name = name


def test_route_bases_are_built_with_the_route() -> None:
    a: Any = FakeShard("a")
    b: Any = FakeShard("b")
    pairs: list[Any] = [(a, common_pb2.TopicConfig(topic="t", read_queue_nums=4, write_queue_nums=2, perm=6)),
                        (b, common_pb2.TopicConfig(topic="t", read_queue_nums=3, write_queue_nums=3, perm=6))]
    route = TopicRoute.build("t", pairs)
    assert list(route.bases.items()) == [(a, 0), (b, 4)]
    assert TopicRoute.build("t", pairs[:1]).bases == {a: 0}
    assert TopicRoute.build("t", []).bases == {}


def test_store_host_bytes_learned_once_and_used_to_pick_the_shard() -> None:
    async def run() -> None:
        shards = [ShardClient(i, ShardSettings(f"shard-{i}", "127.0.0.1:1", "127.0.0.1:2")) for i in range(2)]
        try:
            for shard, host in zip(shards, ("127.0.0.1:10911", "[::1]:10912"), strict=True):
                async def info(request: Any, timeout: float, host: str = host) -> commitlog_pb2.StoreInfo:
                    return commitlog_pb2.StoreInfo(store_host=host)
                shard.commitlog.GetStoreInfo = info
                assert await shard.learn_store_host(1.0) == host
                assert shard.store_host_bytes == encode_address(host)
            finder = MessageFinder(shards, RetryPolicy(attempts=1))
            second = make_message_id("[::1]:10912", 4096)
            order = await finder._order(second, query_pb2.MESSAGE_ID_KIND_OFFSET, 1.0)
            assert [s.name for s in order] == ["shard-1", "shard-0"]
        finally:
            for shard in shards:
                await shard.close()

    asyncio.run(run())
