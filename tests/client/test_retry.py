"""Consumer retry and dead letters from the Python client (real system): consume_later, the retry
topic a group's consumer reads, and ``mqstore dlq list|show|resend``."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from mqstore.client import Client, PullConsumer
from mqstore.client.aio import AsyncPullConsumer
from mqstore.client.models import Message
from mqstore.client.retry import as_original
from tests.client.conftest import eventually, run_cli
from tests.gateway.system_process import UpProcess


def _consume_one(client: Client, group: str, topic: str) -> tuple[PullConsumer, Message]:
    consumer = client.consumer(group, topic)
    messages = eventually(lambda: _non_empty(consumer.poll(timeout=0.5)))
    return consumer, messages[0]


def _non_empty(messages: list[Message]) -> list[Message]:
    assert messages
    return messages


def test_consume_later_stores_a_retry_then_a_dead_letter(client: Client, topic: str) -> None:
    sent = client.producer().send(topic, "try me", tags="T1", keys="order-1")
    group = f"g_{topic}"
    consumer, message = _consume_one(client, group, topic)
    try:
        retry = consumer.consume_later(message)
        assert (retry.target_topic, retry.dead_letter, retry.delay_level, retry.reconsume_times) == \
            (f"%RETRY%{group}", False, 3, 1)
        assert retry.send.topic == "SCHEDULE_TOPIC_XXXX" and retry.send.msg_id == sent.msg_id
        copy = client.get_message(retry.send.offset_msg_id)
        assert copy.properties["REAL_TOPIC"] == f"%RETRY%{group}" and copy.properties["RETRY_TOPIC"] == topic
        # The copy handed back past the limit: a dead letter; the origin is still the first send.
        dead = client.send_back(group, copy, max_reconsume_times=1)
        assert dead.dead_letter and dead.send.topic == f"%DLQ%{group}"
        assert dead.origin_msg_id == sent.offset_msg_id
        # Later polls read the (now existing) retry topic too without errors; nothing is due there yet.
        assert consumer.poll(timeout=0) == []
    finally:
        consumer.close()
    with pytest.raises(ValueError, match="consumer group"):
        client.consumer(None, topic).consume_later(message)
    with pytest.raises(ValueError, match="delay_level -2"):
        client.send_back(group, message, delay_level=-2)


def test_async_consume_later(gateway: str, client: Client, topic: str) -> None:
    client.producer().send(topic, "async")
    group = f"ag_{topic}"

    async def run() -> None:
        async with AsyncPullConsumer(group, topic, gateway) as consumer:
            got: list[Message] = []
            deadline = time.monotonic() + 10
            while not got and time.monotonic() < deadline:
                got = await consumer.poll(timeout=0.5)
            assert got
            receipt = await consumer.consume_later(got[0], delay_level=-1)
            assert receipt.dead_letter and receipt.send.topic == f"%DLQ%{group}"

    asyncio.run(run())


def test_a_retried_message_is_handed_out_under_its_original_topic() -> None:
    retried = Message(topic="%RETRY%g", queue_id=0, queue_offset=0, msg_id="m", offset_msg_id="o", uniq_key="m",
                      tags="", keys=(), properties={"RETRY_TOPIC": "orders"}, body=b"b", born_timestamp=0,
                      born_host="", store_timestamp=0, store_host="")
    assert as_original(retried).topic == "orders" and as_original(retried).offset_msg_id == "o"


def test_delivered_retries_come_back_through_the_groups_consumer(up: UpProcess, client: Client, topic: str) -> None:
    """Needs the scheduler (delayed delivery) in ``mqstore up``: level 1 is due after 1 s."""
    if "scheduler" not in up.logs():
        pytest.skip("the scheduler is not part of mqstore up here: retries stay in SCHEDULE_TOPIC_XXXX")
    sent = client.producer().send(topic, "again")
    group = f"d_{topic}"
    consumer, message = _consume_one(client, group, topic)
    try:
        consumer.consume_later(message, delay_level=1)
        again = eventually(lambda: _non_empty(consumer.poll(timeout=0.5)), timeout_s=20)
        assert again[0].topic == topic and again[0].msg_id == sent.msg_id and again[0].reconsume_times == 1
    finally:
        consumer.close()


def test_dlq_cli_lists_shows_and_resends(gateway: str, client: Client, topic: str) -> None:
    sent = client.producer().send(topic, "dead body", tags="TD", keys="k-dead", properties={"user": "u1"})
    group = f"cli_{topic}"
    dead = client.send_back(group, sent.offset_msg_id, delay_level=-1)
    listed = run_cli("dlq", "list", "--group", group, "--gateway", gateway, "--json")
    assert listed.code == 0, listed.stderr
    rows = [json.loads(line) for line in listed.stdout.splitlines()]
    assert [r["offset_msg_id"] for r in rows] == [dead.send.offset_msg_id]
    assert rows[0]["properties"]["RETRY_TOPIC"] == topic
    shown = run_cli("dlq", "show", "--group", group, dead.send.offset_msg_id, "--gateway", gateway)
    assert shown.code == 0 and "dead body" in shown.stdout, shown.stderr
    resent = run_cli("dlq", "resend", "--group", group, dead.send.offset_msg_id, "--gateway", gateway, "--json")
    assert resent.code == 0, resent.stderr
    receipt = json.loads(resent.stdout)
    assert receipt["topic"] == topic and receipt["msg_id"] == sent.msg_id
    again = client.get_message(receipt["offset_msg_id"])
    assert (again.topic, again.body, again.tags, again.keys, again.reconsume_times) == \
        (topic, b"dead body", "TD", ("k-dead",), 0)
    assert again.properties["user"] == "u1" and "RETRY_TOPIC" not in again.properties
    # A message that is not one of the group's dead letters, and an empty DLQ.
    wrong = run_cli("dlq", "show", "--group", group, sent.offset_msg_id, "--gateway", gateway)
    assert wrong.code != 0 and "NOT_FOUND" in wrong.stderr and f"%DLQ%{group}" in wrong.stderr
    empty = run_cli("dlq", "list", "--group", f"none_{topic}", "--gateway", gateway)
    assert empty.code == 0 and "no dead letters" in empty.stdout + empty.stderr


def test_retried_until_the_limit_then_a_dead_letter(up: UpProcess, client: Client, topic: str) -> None:
    """The whole loop with the scheduler: two retries come back through the group's consumer, the third
    failure goes to %DLQ%<group>."""
    if "scheduler" not in up.logs():
        pytest.skip("the scheduler is not part of mqstore up here: retries stay in SCHEDULE_TOPIC_XXXX")
    sent = client.producer().send(topic, "fails thrice")
    group = f"loop_{topic}"
    consumer, message = _consume_one(client, group, topic)
    try:
        seen = [message.reconsume_times]
        for _ in range(2):
            assert not consumer.consume_later(message, 1, max_reconsume_times=2).dead_letter
            message = eventually(lambda: _non_empty(consumer.poll(timeout=0.5)), timeout_s=20)[0]
            assert message.topic == topic and message.msg_id == sent.msg_id
            seen.append(message.reconsume_times)
        assert seen == [0, 1, 2]
        dead = consumer.consume_later(message, 1, max_reconsume_times=2)
        assert dead.dead_letter and dead.send.topic == f"%DLQ%{group}" and dead.reconsume_times == 3
        assert consumer.poll(timeout=1.5) == []
    finally:
        consumer.close()
    letters = client.consumer(None, f"%DLQ%{group}", retry=False).poll(timeout=1)
    assert [(m.msg_id, m.reconsume_times, m.properties["ORIGIN_MESSAGE_ID"]) for m in letters] == \
        [(sent.msg_id, 3, sent.offset_msg_id)]
