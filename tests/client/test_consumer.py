"""PullConsumer against a running system: reading back, committing and resuming, long polling, tags,
waiting for a topic that does not exist yet."""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict

import pytest

from mqstore.client import Client, Message, Producer, PullConsumer, SendReceipt


def _drain(consumer: PullConsumer, expected: int, timeout_s: float = 15.0) -> list[Message]:
    """Polls until ``expected`` messages came (the indexer may lag the sends by a few ms)."""
    received: list[Message] = []
    deadline = time.monotonic() + timeout_s
    while len(received) < expected and time.monotonic() < deadline:
        received.extend(consumer.poll(max_messages=500, timeout=1.0))
    return received


def _by_queue(items: list[Message] | list[SendReceipt]) -> dict[int, list[tuple[int, str]]]:
    grouped: dict[int, list[tuple[int, str]]] = defaultdict(list)
    for item in items:
        grouped[item.queue_id].append((item.queue_offset, item.msg_id))
    return dict(grouped)


def test_consumer_reads_back_exactly_what_was_sent_and_resumes_after_its_commit(
        gateway: str, client: Client, topic: str) -> None:
    client.create_topic(topic, 4)
    with Producer(gateway) as producer:
        first = producer.send_batch(topic, [f"a{i}" for i in range(400)])
        first += list(producer.send_stream((f"b{i}" for i in range(400)), topic))
    group = f"{topic}_group"
    with PullConsumer(group, topic, gateway, commit_interval_s=3600) as consumer:
        received = _drain(consumer, len(first))
        assert _by_queue(received) == _by_queue(first)
        assert consumer.poll(timeout=0) == []
        committed = consumer.commit()
    assert sum(committed.values()) == len(first)
    assert client.committed_offsets(group, topic, [0, 1, 2, 3]) == committed

    with Producer(gateway) as producer:
        second = producer.send_batch(topic, [f"c{i}" for i in range(100)])
        second += [producer.send(topic, f"d{i}") for i in range(20)]
    # A new consumer of the group starts after the committed offsets: no duplicates, no gaps.
    with PullConsumer(group, topic, gateway) as resumed:
        assert resumed.positions() == committed
        again = _drain(resumed, len(second))
        assert _by_queue(again) == _by_queue(second)
        # Half of a poll is delivered, then the consumer closes: only what was delivered is committed.
        with Producer(gateway) as producer:
            third = producer.send_batch(topic, [f"e{i}" for i in range(10)], queue_id=2)
        got: list[Message] = []
        while len(got) < 4:
            got += resumed.poll(max_messages=4 - len(got), timeout=5)
    assert [m.msg_id for m in got] == [r.msg_id for r in third[:4]]
    assert client.committed_offset(group, topic, 2) == third[3].queue_offset + 1


def test_a_group_without_commits_starts_at_the_oldest_or_the_newest(gateway: str, client: Client, topic: str) -> None:
    with Producer(gateway) as producer:
        sent = producer.send_batch(topic, ["x", "y", "z"], queue_id=1)
    with PullConsumer(None, topic, gateway, queue_ids=[1]) as oldest:
        assert [m.msg_id for m in _drain(oldest, 3)] == [r.msg_id for r in sent]
    with PullConsumer(f"{topic}_g", topic, gateway, queue_ids=[1], from_latest=True) as newest:
        assert newest.poll(timeout=0.2) == []
        assert newest.positions() == {1: 3}
    # An offset past the end is answered with OFFSET_OVERFLOW_BADLY: the consumer moves back into range.
    with PullConsumer(None, topic, gateway, queue_ids=[1], start_offsets={1: 1000}) as beyond:
        assert [m.queue_offset for m in _drain(beyond, 3)] == [0, 1, 2]


def test_long_poll_returns_as_soon_as_a_message_arrives(gateway: str, client: Client, topic: str) -> None:
    client.create_topic(topic, 4)
    with PullConsumer(f"{topic}_g", topic, gateway, long_poll_ms=10_000) as consumer, Producer(gateway) as producer:
        consumer.start()
        sender = threading.Timer(0.5, lambda: producer.send(topic, "late", queue_id=3))
        started = time.monotonic()
        sender.start()
        messages = consumer.poll(timeout=10)
        waited = time.monotonic() - started
        sender.join()
    assert [m.text for m in messages] == ["late"]
    assert 0.4 < waited < 4.0, f"waited {waited:.2f} s"


def test_an_empty_poll_waits_its_timeout(gateway: str, client: Client, topic: str) -> None:
    client.create_topic(topic, 2)
    with PullConsumer(None, topic, gateway) as consumer:
        consumer.start()
        started = time.monotonic()
        assert consumer.poll(timeout=0.6) == []
        assert 0.5 < time.monotonic() - started < 3.0


def test_a_tag_subscription_gets_only_its_tags(gateway: str, client: Client, topic: str) -> None:
    client.create_topic(topic, 2)
    with Producer(gateway) as producer:
        for i in range(30):
            producer.send(topic, f"m{i}", tags=("TagA", "TagB", "TagC")[i % 3], queue_id=i % 2)
    with PullConsumer(f"{topic}_g", topic, gateway, subscription="TagA || TagC") as consumer:
        received = _drain(consumer, 20)
        assert sorted(m.text for m in received) == sorted(f"m{i}" for i in range(30) if i % 3 != 1)
        assert {m.tags for m in received} == {"TagA", "TagC"}
        assert consumer.poll(timeout=0) == []
        # Filtered messages count as consumed: the group is committed past them.
        assert consumer.commit() == {0: 15, 1: 15}


def test_iterating_a_consumer_yields_messages_as_they_come(gateway: str, client: Client, topic: str) -> None:
    client.create_topic(topic, 2)
    with Producer(gateway) as producer:
        producer.send_batch(topic, [f"i{i}" for i in range(5)])
    with PullConsumer(None, topic, gateway) as consumer:
        texts = []
        for message in consumer:
            texts.append(message.text)
            if len(texts) == 5:
                break
    assert texts == [f"i{i}" for i in range(5)]


@pytest.mark.parametrize("group_mode", [False, True], ids=["queues", "group"])
def test_a_consumer_started_before_its_topic_waits_for_it(gateway: str, client: Client, topic: str,
                                                          group_mode: bool, caplog: pytest.LogCaptureFixture) -> None:
    """As Kafka's and RocketMQ's consumers do: no error while the topic does not exist, a log line,
    and its messages once it does."""
    caplog.set_level(logging.INFO, logger="mqstore.client.consumer")
    with PullConsumer(f"{topic}_group", topic, gateway, rebalance=group_mode, rebalance_interval_s=1) as consumer:
        assert consumer.poll(timeout=0.3) == []
        assert consumer.poll(timeout=0.3) == []
        assert any(topic in r.getMessage() and "does not exist yet" in r.getMessage() for r in caplog.records)
        with Producer(gateway) as producer:
            sent = producer.send(topic, "first")
        started = time.monotonic()
        received = _drain(consumer, 1, timeout_s=20)
        assert [m.msg_id for m in received] == [sent.msg_id]
    assert time.monotonic() - started < 10
