"""What the gateway keeps per topic stays bounded, whatever topic names clients send to (issue 17, item 8).

Before, every topic name a send used got a round-robin position for the process's life, and a name
whose first send was refused (or failed) stayed in a set of "provisional" topics for good.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc

from gateway.auth import TokenTable
from gateway.queue_selector import FaultTable, QueueSelector
from gateway.registration import add_to_server
from gateway.route import RouteTable, TopicRoute
from gateway.servicer import MessagingServicer
from gateway.settings import ShardSettings, load_gateway_settings
from gateway.shard import ShardClient
from gateway.uniq_key_maker import UniqKeyGenerator
from mqstore.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc
from tests.call_state import in_process_server

# No service listens there: every send fails UNAVAILABLE after the gateway's retries.
NOWHERE = "127.0.0.1:1"


def test_round_robin_positions_stay_within_their_bound() -> None:
    async def run() -> tuple[list[int], list[int]]:
        shard = ShardClient(0, ShardSettings("shard-0", NOWHERE, NOWHERE))  # its channel needs a loop
        config = common_pb2.TopicConfig(read_queue_nums=4, write_queue_nums=4, perm=6)
        selector = QueueSelector(False, FaultTable(1.0, 60.0), max_topics=100)
        tracked = []
        for i in range(1000):
            topic = f"t{i}"
            config.topic = topic
            selector.select(TopicRoute.build(topic, [(shard, config)]))
            tracked.append(selector.topics_tracked)
        route = TopicRoute.build("t999", [(shard, config)])
        rotation = [selector.select(route).queue_id for _ in range(4)]
        await shard.close()
        return tracked, rotation

    tracked, rotation = asyncio.run(run())
    assert max(tracked) <= 100
    assert rotation == [1, 2, 3, 0]  # within the bound each topic still rotates over its queues


def _holds(value: Any, names: set[str]) -> bool:
    if isinstance(value, str):
        return value in names
    if isinstance(value, dict):
        return any(_holds(k, names) for k in value)
    if isinstance(value, (set, frozenset, list, tuple)):
        return any(_holds(v, names) for v in value)
    return False


def test_failed_first_sends_to_new_topics_leave_nothing_per_topic() -> None:
    topics = {f"NeverCreated{i}" for i in range(12)}

    async def run() -> tuple[list[grpc.StatusCode], list[str]]:
        settings = load_gateway_settings(None, shards=[{"name": "shard-0", "commitlog": NOWHERE, "query": NOWHERE}],
                                         retry_initial_backoff_ms=1, retry_max_backoff_ms=2)
        shards = [ShardClient(0, settings.shards[0])]
        servicer = MessagingServicer(settings, shards, RouteTable(shards, 30.0, 5.0, miss_refresh_s=0.0),
                                     QueueSelector(False, FaultTable(1.0, 60.0)), TokenTable(), UniqKeyGenerator())
        codes: list[grpc.StatusCode] = []
        try:
            async with in_process_server(lambda s: add_to_server(servicer, s)) as channel:
                stub = gateway_pb2_grpc.MessagingServiceStub(channel)
                for topic in sorted(topics):
                    try:
                        await stub.Send(gateway_pb2.SendRequest(message=common_pb2.Message(topic=topic, body=b"x")),
                                        timeout=20)
                    except grpc.aio.AioRpcError as exc:
                        codes.append(exc.code())
        finally:
            await servicer.close()
            for shard in shards:
                await shard.close()
        # Everything the servicer keeps, but the selector's bounded positions (tested above).
        kept = [name for name, value in vars(servicer).items() if name != "selector" and _holds(value, topics)]
        return codes, kept

    codes, kept = asyncio.run(run())
    assert codes == [grpc.StatusCode.UNAVAILABLE] * len(topics)
    assert kept == [], f"the gateway keeps the names of topics that never came to exist in {kept}"
