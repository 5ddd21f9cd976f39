"""The asyncio client: sends, a consumer that reads back and commits, and a long poll woken by a send."""

from __future__ import annotations

import asyncio
import time

from mqstore.client import Client, Message
from mqstore.client.aio import AsyncProducer, AsyncPullConsumer


async def _send_and_consume(gateway: str, topic: str) -> None:
    async with AsyncProducer(gateway) as producer:
        one = await producer.send(topic, "first", tags="T")
        batch = await producer.send_batch(topic, [f"b{i}" for i in range(300)])
        streamed = [r async for r in producer.send_stream((f"s{i}" for i in range(300)), topic)]
    sent = [one, *batch, *streamed]
    assert all(r.ok for r in sent)
    group = f"{topic}_g"
    async with AsyncPullConsumer(group, topic, gateway) as consumer:
        received: list[Message] = []
        deadline = time.monotonic() + 15
        while len(received) < len(sent) and time.monotonic() < deadline:
            received += await consumer.poll(500, timeout=1)
        assert sorted((m.queue_id, m.queue_offset, m.msg_id) for m in received) == \
            sorted((r.queue_id, r.queue_offset, r.msg_id) for r in sent)
        # Long poll: nothing is there; a send 0.5 s later ends the wait.
        async def later() -> None:
            await asyncio.sleep(0.5)
            async with AsyncProducer(gateway) as late:
                await late.send(topic, "late")

        started = time.monotonic()
        sender = asyncio.create_task(later())
        woken = await consumer.poll(timeout=10)
        await sender
        assert [m.text for m in woken] == ["late"] and time.monotonic() - started < 4
    async with AsyncPullConsumer(group, topic, gateway) as resumed:
        assert await resumed.poll(timeout=0) == []


def test_async_producer_and_consumer(gateway: str, client: Client, topic: str) -> None:
    client.create_topic(topic, 4)
    asyncio.run(_send_and_consume(gateway, topic))


async def _wait_for_topic(gateway: str, topic: str) -> None:
    async with AsyncPullConsumer(f"{topic}_group", topic, gateway) as consumer:
        assert await consumer.poll(timeout=0.3) == []  # no NotFoundError: the topic does not exist yet
        async with AsyncProducer(gateway) as producer:
            sent = await producer.send(topic, "first")
        received: list[Message] = []
        deadline = time.monotonic() + 20
        while not received and time.monotonic() < deadline:
            received = await consumer.poll(timeout=1.0)
        assert [m.msg_id for m in received] == [sent.msg_id]


def test_async_consumer_waits_for_its_topic(gateway: str, topic: str) -> None:
    asyncio.run(_wait_for_topic(gateway, topic))
