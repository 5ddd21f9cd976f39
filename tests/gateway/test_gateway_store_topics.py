"""Through the gateway (``mqstore up``, real processes): a RocketMQ store started without
``config/topics.json`` routes and reads every topic of its data, and DELAY messages are stored at
every level (default levels, and a store with three)."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from mqstore.v1 import common_pb2, gateway_pb2, query_pb2
from services.store.formats.message import SCHEDULE_TOPIC
from tests.gateway.system_process import UpProcess, start_up

SMALL_INDEXER = {
    "MQSTORE_MAPPED_FILE_SIZE_CONSUME_QUEUE": "6000",
    "MQSTORE_MAX_HASH_SLOT_NUM": "100",
    "MQSTORE_MAX_INDEX_NUM": "400",
    "MQSTORE_MAX_MESSAGE_SIZE": str(4 * 1024 * 1024),
}
THREE_LEVELS = "1s 5s 10s"
Rows = Callable[..., list[dict[str, Any]]]


@pytest.fixture(scope="module")
def rocketmq_store_up(pristine_store: Callable[[str], Path],
                      tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpProcess]:
    """The RocketMQ fixture store (no topics.json), three delay levels."""
    store = tmp_path_factory.mktemp("rocketmq-up") / "store"
    shutil.copytree(pristine_store("normal-raw"), store, copy_function=shutil.copy2)
    assert not (store / "config" / "topics.json").exists()
    started = start_up(store, {**SMALL_INDEXER, "MQSTORE_MESSAGE_DELAY_LEVEL": THREE_LEVELS})
    try:
        yield started
        assert started.stop() == 0, started.logs()[-5000:]
    finally:
        started.kill_all()


def pull_queue(up: UpProcess, topic: str, queue_id: int, max_offset: int) -> list[query_pb2.StoredMessage]:
    """Every message of a queue up to ``max_offset``, waiting for the indexer to get there."""
    messages: list[query_pb2.StoredMessage] = []
    offset = 0
    deadline = time.monotonic() + 60
    while offset < max_offset:
        assert time.monotonic() < deadline, f"{topic}/{queue_id} stopped at {offset} of {max_offset}"
        response = up.stub.Pull(query_pb2.PullMessageRequest(topic=topic, queue_id=queue_id, queue_offset=offset,
                                                             max_messages=1024, max_bytes=8 * 1024 * 1024,
                                                             long_poll_ms=500), timeout=30)
        messages.extend(response.messages)
        offset = response.next_begin_offset if response.messages else offset
    return messages


def test_the_topics_of_a_rocketmq_store_route_and_read_without_topics_json(rocketmq_store_up: UpProcess,
                                                                          dump_rows: Rows) -> None:
    up = rocketmq_store_up
    routes = {topic: up.stub.GetRoute(gateway_pb2.GetRouteRequest(topic=topic), timeout=10)
              for topic in ("TopicA", "TopicB", "Topic-Long-Name_with.chars", SCHEDULE_TOPIC)}
    assert {t: len(r.queues) for t, r in routes.items()} == {
        "TopicA": 4, "TopicB": 2, "Topic-Long-Name_with.chars": 1, SCHEDULE_TOPIC: 3}
    assert all(q.readable and q.writable for r in routes.values() for q in r.queues)
    expected: dict[tuple[str, int], list[int]] = {}
    for row in dump_rows("normal", "cq"):
        expected.setdefault((row["topic"], row["queueId"]), []).append(row["phyOffset"])
    for (topic, queue_id), offsets in sorted(expected.items()):
        pulled = pull_queue(up, topic, queue_id, len(offsets))
        assert [m.commitlog_offset for m in pulled[:len(offsets)]] == offsets, (topic, queue_id)
        # Past the store's own records, only its delayed messages, now due, delivered by the scheduler
        # (the store has no delayOffset.json, so a RocketMQ broker given it would deliver them too).
        assert all((m.properties.get("REAL_TOPIC"), m.properties.get("REAL_QID")) == (topic, str(queue_id))
                   for m in pulled[len(offsets):]), (topic, queue_id)
    key = next(r for r in dump_rows("normal", "query") if r["topic"] == "TopicB" and r["queryMessageOffsets"])
    found = up.stub.QueryByKey(query_pb2.QueryMessageRequest(topic="TopicB", key=key["key"], max_num=64), timeout=10)
    assert [m.commitlog_offset for m in found.messages] == key["queryMessageOffsets"]
    assert (up.store / "config" / "topics.json").exists(), "the discovered topics are persisted"


def send_delayed(up: UpProcess, level: str) -> gateway_pb2.SendResult:
    message = common_pb2.Message(topic="TopicA", body=f"delayed {level}".encode(), properties={"DELAY": level})
    result: gateway_pb2.SendResult = up.stub.Send(gateway_pb2.SendRequest(message=message), timeout=10)
    return result


def test_delay_levels_of_a_store_with_three(rocketmq_store_up: UpProcess) -> None:
    results = [send_delayed(rocketmq_store_up, level) for level in ("1", "3", "18")]
    assert [(r.topic, r.queue_id) for r in results] == [(SCHEDULE_TOPIC, 0), (SCHEDULE_TOPIC, 2), (SCHEDULE_TOPIC, 2)]
    stored = rocketmq_store_up.stub.GetMessage(query_pb2.ViewMessageRequest(msg_id=results[2].offset_msg_id),
                                               timeout=10).message
    assert (stored.properties["DELAY"], stored.properties["REAL_TOPIC"]) == ("3", "TopicA")


def test_delay_level_18_with_the_default_levels(up: UpProcess) -> None:
    results = [send_delayed(up, level) for level in ("18", "999", "2")]
    assert [(r.topic, r.queue_id) for r in results] == [(SCHEDULE_TOPIC, 17), (SCHEDULE_TOPIC, 17), (SCHEDULE_TOPIC, 1)]
    route = up.stub.GetRoute(gateway_pb2.GetRouteRequest(topic=SCHEDULE_TOPIC), timeout=10)
    assert len(route.queues) == 18
