"""The gateway's route table costs what a call needs, not what the store holds.

A refresh keeps the shards' topic configs and builds no route; a route is built when a call asks for
its topic. A topic this gateway creates, updates or deletes goes into the table from the shards'
answers: no CreateTopic makes the next call read every topic of every shard again (with 100,000
topics that was a ListTopics of all of them, and a route per queue built, after each create).
"""

from __future__ import annotations

import asyncio
from typing import Any

from gateway.auth import TokenTable
from gateway.queue_selector import FaultTable, QueueSelector
from gateway.registration import add_to_server
from gateway.route import RouteTable
from gateway.servicer import MessagingServicer
from gateway.settings import load_gateway_settings
from gateway.shard import ShardClient
from mqstore.v1 import commitlog_pb2, common_pb2, gateway_pb2_grpc
from tests.call_state import in_process_server

NOWHERE = "127.0.0.1:1"


def config(topic: str, queues: int = 4) -> common_pb2.TopicConfig:
    return common_pb2.TopicConfig(topic=topic, read_queue_nums=queues, write_queue_nums=queues, perm=6)


class CountingShard(ShardClient):
    """A shard whose commitlog answers topic calls from a dict, counting the ListTopics it is asked."""

    def __init__(self, index: int, settings: Any, topics: dict[str, common_pb2.TopicConfig]) -> None:
        super().__init__(index, settings)
        self.table = topics
        self.listed = 0

    async def topics(self, timeout: float) -> list[common_pb2.TopicConfig]:
        self.listed += 1
        return list(self.table.values())

    async def on_commitlog(self, call: Any, request: Any, timeout: float) -> Any:
        if isinstance(request, commitlog_pb2.TopicRequest):  # CreateTopic or UpdateTopic
            self.table[request.topic.topic] = request.topic
            return request.topic
        raise AssertionError(f"unexpected commitlog call with {type(request).__name__}")


def test_a_refresh_builds_no_route_until_a_call_asks_for_it() -> None:
    async def run() -> tuple[int, int, int]:
        settings = load_gateway_settings(None, shards=[{"name": "shard-0", "commitlog": NOWHERE, "query": NOWHERE}])
        shard = CountingShard(0, settings.shards[0], {f"t{i}": config(f"t{i}") for i in range(2000)})
        table = RouteTable([shard], 30.0, 5.0)
        try:
            await table.refresh()
            built_after_refresh = len(table._routes)
            route = await table.route("t1234")
            assert route is not None and [q.queue_id for q in route.queues] == [0, 1, 2, 3]
            assert await table.route("t1234") is route  # built once
            return built_after_refresh, len(table._routes), shard.listed
        finally:
            await shard.close()

    built_after_refresh, built_after_call, listed = asyncio.run(run())
    assert (built_after_refresh, built_after_call, listed) == (0, 1, 1)


def test_topics_created_updated_and_deleted_here_need_no_refresh() -> None:
    async def run() -> list[tuple[str, Any]]:
        settings = load_gateway_settings(None, shards=[{"name": "shard-0", "commitlog": NOWHERE, "query": NOWHERE}])
        shard = CountingShard(0, settings.shards[0], {"existing": config("existing")})
        routes = RouteTable([shard], 30.0, 5.0)
        servicer = MessagingServicer(settings, [shard], routes, QueueSelector(False, FaultTable(1.0, 60.0)),
                                     TokenTable(), _uniq_keys())
        seen: list[tuple[str, Any]] = []
        try:
            await routes.refresh()
            async with in_process_server(lambda s: add_to_server(servicer, s)) as channel:
                stub = gateway_pb2_grpc.MessagingServiceStub(channel)
                for i in range(50):
                    await stub.CreateTopic(commitlog_pb2.TopicRequest(topic=config(f"new{i}", 2)), timeout=10)
                    route = await routes.route(f"new{i}")
                    seen.append(("created", route and len(route.queues)))
                await stub.UpdateTopic(commitlog_pb2.TopicRequest(topic=config("new7", 6)), timeout=10)
                route = await routes.route("new7")
                seen.append(("updated", route and len(route.queues)))
                seen.append(("listed", shard.listed))
        finally:
            await servicer.close()
            await shard.close()
        return seen

    seen = asyncio.run(run())
    assert seen[:50] == [("created", 2)] * 50
    assert seen[50:] == [("updated", 6), ("listed", 1)], "a topic change made the gateway list every topic again"


def _uniq_keys() -> Any:
    from gateway.uniq_key_maker import UniqKeyGenerator

    return UniqKeyGenerator()
