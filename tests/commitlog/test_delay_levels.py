"""DELAY messages: every level of ``messageDelayLevel`` has its SCHEDULE_TOPIC_XXXX queue (18 by
default, as RocketMQ's broker creates the topic), a level above the highest is lowered to it as
RocketMQ 4.9.8 does, and the real topic is checked as a send to it would be. In-process and through
the commitlog service."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from mqstore.v1 import commitlog_pb2 as pb
from mqstore.v1 import common_pb2
from services.commitlog.message_store import MessageStore
from services.commitlog.put_result import PutMessageError
from services.store.errors import InvalidArgumentError, NotFoundError
from services.store.formats.message import SCHEDULE_TOPIC, Message
from services.store.formats.record import decode_record
from services.store.rules.topics import TopicConfig
from tests.commitlog.commitlog_process import StartCommitLog
from tests.test_commitlog_engine import make_log

THREE_LEVELS = "1s 5s 10s"


@pytest.fixture
def log(tmp_path: Path) -> Iterator[MessageStore]:
    commit_log = make_log(tmp_path)
    yield commit_log
    commit_log.shutdown()


def delayed(log: MessageStore, level: str, topic: str = "Later", queue_id: int = 1) -> tuple[int, dict[str, str]]:
    """Put one DELAY message; the SCHEDULE_TOPIC_XXXX queue it went to and the stored properties."""
    result = log.put_message(Message(topic, queue_id, b"later", properties={"DELAY": level}))
    record = decode_record(log.read(result.commitlog_offset, result.wrote_bytes))
    assert (result.topic, record.topic, record.queue_id) == (SCHEDULE_TOPIC, SCHEDULE_TOPIC, result.queue_id)
    assert (record.properties["REAL_TOPIC"], record.properties["REAL_QID"]) == (topic, str(queue_id))
    return result.queue_id, record.properties


def test_every_default_level_has_its_queue(log: MessageStore) -> None:
    assert [delayed(log, str(level))[0] for level in range(1, 19)] == list(range(18))
    assert log.topics.get(SCHEDULE_TOPIC) == TopicConfig(SCHEDULE_TOPIC, 18, 18)


def test_a_level_above_the_highest_is_lowered_to_it_as_rocketmq_does(log: MessageStore) -> None:
    queue_id, properties = delayed(log, "999")
    assert (queue_id, properties["DELAY"]) == (17, "18"), "stored as the level it is delivered at"
    assert delayed(log, "18")[1]["DELAY"] == "18"


def test_custom_levels_give_as_many_queues(tmp_path: Path) -> None:
    log = make_log(tmp_path, message_delay_level=THREE_LEVELS)
    try:
        assert [delayed(log, level)[0] for level in ("1", "2", "3")] == [0, 1, 2]
        queue_id, properties = delayed(log, "18")
        assert (queue_id, properties["DELAY"]) == (2, "3")
        assert log.topics.get(SCHEDULE_TOPIC) == TopicConfig(SCHEDULE_TOPIC, 3, 3)
        with pytest.raises(PutMessageError, match=r"not an integer: give a delay level 1\.\.3"):
            log.put_message(Message("Later", 0, b"x", properties={"DELAY": "soon"}))
    finally:
        log.shutdown()


def test_levels_zero_or_below_are_not_delayed(log: MessageStore) -> None:
    for level in ("0", "-3"):
        result = log.put_message(Message("Now", 0, b"now", properties={"DELAY": level}))
        assert (result.topic, result.queue_id) == ("Now", 0)


def test_a_schedule_topic_with_too_few_queues_gets_one_per_level_at_start(tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.mkdir()
    (config / "topics.json").write_text(json.dumps({"topics": {  # as stores written before the fix hold it
        SCHEDULE_TOPIC: {"read_queue_nums": 8, "write_queue_nums": 8, "perm": 6},
        "Later": {"read_queue_nums": 2, "write_queue_nums": 2, "perm": 6}}}))
    log = make_log(tmp_path)
    try:
        assert log.topics.get(SCHEDULE_TOPIC) == TopicConfig(SCHEDULE_TOPIC, 18, 18)
        assert log.topics.get("Later") == TopicConfig("Later", 2, 2), "other topics stay as configured"
        assert delayed(log, "18")[0] == 17
        with pytest.raises(InvalidArgumentError, match="needs 18 read and write queues"):
            log.update_topic(TopicConfig(SCHEDULE_TOPIC, 8, 8))
    finally:
        log.shutdown()
    stored = json.loads((config / "topics.json").read_text())["topics"][SCHEDULE_TOPIC]
    assert (stored["read_queue_nums"], stored["write_queue_nums"]) == (18, 18)


def test_the_real_topic_is_checked_and_created_like_a_send_to_it(tmp_path: Path) -> None:
    log = make_log(tmp_path)
    try:
        with pytest.raises(PutMessageError, match="queue id 9 is out of range for topic 'Real'"):
            log.put_messages([Message("Real", 0, b"ok"), Message("Real", 9, b"x", properties={"DELAY": "2"})])
        assert log.topics.get(SCHEDULE_TOPIC) is None and log.max_offset == 0, "a refused batch creates nothing"
        delayed(log, "2", topic="Fresh")
        assert log.topics.get("Fresh") == TopicConfig("Fresh", 8, 8)
    finally:
        log.shutdown()
    strict = make_log(tmp_path / "strict", auto_create_topic_enable=False)
    try:
        with pytest.raises(NotFoundError, match="'Missing' does not exist"):
            strict.put_message(Message("Missing", 0, b"x", properties={"DELAY": "2"}))
        strict.create_topic(TopicConfig("Real", 2, 2))
        assert delayed(strict, "2", topic="Real")[0] == 1, "the store's own schedule topic needs no auto-create"
    finally:
        strict.shutdown()


# -- the commitlog service -------------------------------------------------------------------------

def append_delayed(stub: Any, level: str) -> pb.AppendResult:
    message = common_pb2.Message(topic="Later", queue_id=0, body=b"later", properties={"DELAY": level})
    result: pb.AppendResult = stub.Append(pb.AppendRequest(message=message), timeout=10)
    return result


def test_the_service_takes_every_level(tmp_path: Path, start_commitlog: StartCommitLog) -> None:
    server = start_commitlog(tmp_path / "default")
    assert [(r.topic, r.queue_id) for r in (append_delayed(server.stub, "18"), append_delayed(server.stub, "999"))] \
        == [(SCHEDULE_TOPIC, 17)] * 2
    custom = start_commitlog(tmp_path / "custom", {"MQSTORE_MESSAGE_DELAY_LEVEL": THREE_LEVELS})
    assert [append_delayed(custom.stub, level).queue_id for level in ("1", "3", "18")] == [0, 2, 2]
    listed = {t.topic: t for t in custom.stub.ListTopics(pb.ListTopicsRequest(), timeout=10).topics}
    assert (listed[SCHEDULE_TOPIC].read_queue_nums, listed[SCHEDULE_TOPIC].write_queue_nums) == (3, 3)
    with pytest.raises(grpc.RpcError) as refused:
        append_delayed(custom.stub, "soon")
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "delay level 1..3" in (refused.value.details() or "")
