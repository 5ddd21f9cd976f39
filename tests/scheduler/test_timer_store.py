"""The timer store's files and the store's timer rules, in process (fast): the commitlog parks a timer
message in rmq_sys_wheel_timer (DELAY wins over timer properties; a due message and a scheduler's re-put
are stored as they are), and the timer store's recovery undoes the units taken in after its checkpoint."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.commitlog.message_store import MessageStore
from services.scheduler.timer_delivery import TimerProgress
from services.store.formats.message import SCHEDULE_TOPIC, Message
from services.store.formats.record import decode_record
from services.store.formats.timer_files import UNIT_SIZE, TimerFiles
from services.store.rules.due_message import DueMessage
from services.store.rules.timer_message import TIMER_TOPIC, record_timer_out_ms
from tests.test_commitlog_engine import make_log


@pytest.fixture
def log(tmp_path: Path) -> Iterator[MessageStore]:
    commit_log = make_log(tmp_path)
    yield commit_log
    commit_log.shutdown()


def _stored(log: MessageStore, message: Message) -> tuple[str, int, dict[str, str]]:
    result = log.put_message(message)
    record = decode_record(log.read(result.commitlog_offset, result.wrote_bytes))
    return record.topic, record.queue_id, record.properties


def test_a_timer_message_is_parked_with_rocketmq5_properties(log: MessageStore) -> None:
    deliver = time.time_ns() // 1_000_000 + 60_000
    topic, queue_id, properties = _stored(log, Message("Later", 2, b"x", properties={"TIMER_DELIVER_MS": str(deliver)}))
    assert (topic, queue_id) == (TIMER_TOPIC, 0)
    assert properties == {"TIMER_DELIVER_MS": str(deliver), "TIMER_OUT_MS": str(deliver), "REAL_TOPIC": "Later",
                          "REAL_QID": "2"}
    before = time.time_ns() // 1_000_000
    _, _, relative = _stored(log, Message("Later", 0, b"x", properties={"TIMER_DELAY_SEC": "30"}))
    assert before + 30_000 <= int(relative["TIMER_OUT_MS"]) <= time.time_ns() // 1_000_000 + 30_000


def test_delay_wins_over_timer_properties_and_due_messages_stay_put(log: MessageStore) -> None:
    topic, queue_id, properties = _stored(log, Message("Later", 1, b"x", properties={"DELAY": "2",
                                                                                  "TIMER_DELAY_SEC": "30"}))
    assert (topic, queue_id) == (SCHEDULE_TOPIC, 1) and "TIMER_DELAY_SEC" not in properties
    # due already: its own topic at once, properties untouched
    assert _stored(log, Message("Now", 0, b"x", properties={"TIMER_DELIVER_MS": "1000"})) == \
        ("Now", 0, {"TIMER_DELIVER_MS": "1000"})
    # a parked message once more (TIMER_OUT_MS): not parked again (RocketMQ 5's double check)
    assert _stored(log, Message("Now", 0, b"x", properties={"TIMER_DELAY_SEC": "30", "TIMER_OUT_MS": "5"}))[0] == "Now"
    # the scheduler's re-put keeps DELAY / TIMER_* and is not parked again
    for props in ({"DELAY": "1", "REAL_TOPIC": "Now", "REAL_QID": "0"}, {"TIMER_DELAY_SEC": "30"}):
        assert _stored(log, DueMessage("Now", 0, b"x", properties=props)) == ("Now", 0, props)


def test_recovery_undoes_units_taken_in_after_the_checkpoint(tmp_path: Path) -> None:
    files = TimerFiles.open(tmp_path, slots=100)
    for i in range(3):
        files.append(1000, 1_000_000 + i, 5, 100 * i, 50, i)
    files.append(1001, 1_001_000, 5, 400, 50, 3)
    files.flush_writes()
    files.save(enqueue_offset=4, delivered_second=1000, done_positions=[0])
    # taken in after the checkpoint, then a crash (no save)
    files.append(1000, 1_000_500, 5, 500, 50, 4)
    files.append(1099, 1_099_000, 5, 600, 50, 5)  # a new slot
    files.append(1000, 1_000_900, 5, 700, 50, 6)
    files.close()

    files = TimerFiles.open(tmp_path, slots=100)
    try:
        assert files.log_end == 4 * UNIT_SIZE
        assert files.checkpoint.enqueue_offset == 4 and files.checkpoint.done_positions == [0]
        assert [u.queue_offset for u in files.units_of(1000)] == [0, 1, 2]
        assert [u.queue_offset for u in files.units_of(1001)] == [3]
        assert files.units_of(1099) == []
        # taken in again after the recovery: filed after the checkpointed ones
        files.append(1000, 1_000_500, 5, 500, 50, 4)
        assert [u.queue_offset for u in files.units_of(1000)] == [0, 1, 2, 4]
    finally:
        files.close()


@pytest.mark.parametrize("born_host", ["10.0.0.1:1", "[2001:db8::1]:9876"])
def test_timer_out_ms_read_from_the_properties_alone_matches_the_decoded_record(log: MessageStore,
                                                                                born_host: str) -> None:
    deliver = time.time_ns() // 1_000_000 + 90_000
    result = log.put_message(Message("Later", 1, b"body" * 50, born_host=born_host,
                                     properties={"TAGS": "a", "TIMER_DELIVER_MS": str(deliver), "z": "TIMER_OUT_MS"}))
    data = b"pad" + log.read(result.commitlog_offset, result.wrote_bytes)
    assert record_timer_out_ms(data, 3) == int(decode_record(data, 3).properties["TIMER_OUT_MS"]) == deliver
    plain = log.put_message(Message("Later", 1, b"x", properties={"TAGS": "a"}))
    assert record_timer_out_ms(log.read(plain.commitlog_offset, plain.wrote_bytes), 0) is None


def test_chunks_of_delivered_seconds_are_given_back(tmp_path: Path) -> None:
    files = TimerFiles.open(tmp_path, slots=100, chunk_units=4)
    for i in range(8):  # chunk 0: seconds 10-13, chunk 1: seconds 20-23
        files.append(10 + i if i < 4 else 16 + i, 0, 0, i, 1, i)
    files.append(40, 40_000, 0, 8, 1, 8)  # chunk 2 (partial)
    files.flush_writes()
    files.save(enqueue_offset=9, delivered_second=20, done_positions=[])
    assert files.checkpoint.chunk_seconds == {1: 23, 2: 40}
    data = (tmp_path / "timer" / "timerlog").read_bytes()
    assert data[:4 * UNIT_SIZE] == bytes(4 * UNIT_SIZE), "chunk 0 was not given back"
    assert data[4 * UNIT_SIZE:4 * UNIT_SIZE + 4] != bytes(4)
    files.save(enqueue_offset=9, delivered_second=41, done_positions=[])
    assert files.checkpoint.chunk_seconds == {2: 40}  # the last chunk is not whole yet
    files.close()
    files = TimerFiles.open(tmp_path, slots=100, chunk_units=4)
    try:
        assert files.checkpoint.chunk_seconds == {2: 40}
        assert [u.queue_offset for u in files.units_of(40)] == [8]
    finally:
        files.close()


def test_the_checkpoint_keeps_the_enqueue_offset_its_second_began_with(tmp_path: Path) -> None:
    """A replicated shard's TimerProgress needs it after a restart too (services/scheduler/timer_delivery.py)."""
    files = TimerFiles.open(tmp_path, slots=100)
    files.save(enqueue_offset=12, delivered_second=30, done_positions=[], scan_from=500, second_enqueue_offset=7)
    files.close()
    files = TimerFiles.open(tmp_path, slots=100)
    try:
        check = files.checkpoint
        assert (check.enqueue_offset, check.second_enqueue_offset, check.scan_from) == (12, 7, 500)
    finally:
        files.close()


def test_timer_progress_reads_back_what_it_writes() -> None:
    progress = TimerProgress(7, 30, frozenset({4096, 8192}), 500)
    assert TimerProgress.parse(progress.to_json()) == progress
    assert TimerProgress.parse(TimerProgress(0, 1, frozenset(), None).to_json()).scan_from is None
    with pytest.raises((ValueError, KeyError)):
        TimerProgress.parse(b'{"deliveredSecond": 1}')
