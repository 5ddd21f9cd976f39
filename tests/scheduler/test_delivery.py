"""Delayed delivery end to end: real commitlog service, indexer and scheduler processes (small geometry,
delay levels "1s 2s 3s").

A message sent with DELAY=n lands in SCHEDULE_TOPIC_XXXX queue n-1; the scheduler must re-put it to
its real topic and queue once its deliver time (store time + the level's delay) has come: not before,
soon after, with the fields RocketMQ 4.9.8's messageTimeup gives it, exactly once across a clean
restart and across kill -9.
"""

from __future__ import annotations

import json
import time

import grpc

from mqstore.v1 import commitlog_pb2, common_pb2, indexer_pb2
from services.store.formats.java_hash import java_string_hash
from services.store.formats.message import SCHEDULE_TOPIC
from tests.fault_proxy import DOWN, DROP, fault_proxy
from tests.scheduler.conftest import DELAY_MS, Shard
from tests.scheduler.scheduler_process import (
    SchedulerProcess,
    append,
    queue_records,
    start_scheduler,
    wait_for_records,
)

#: How late a delivery may be on a shared, loaded test machine (the design aims at ~0.1 s).
LATE_BOUND_MS = 1500


def _fresh_store(shard: Shard, store_name: str) -> dict[str, int]:
    """A scheduler store that starts where SCHEDULE_TOPIC_XXXX ends now: the tests share one shard and
    must not see each other's delayed messages delivered again."""
    table = {}
    for queue_id in range(len(DELAY_MS)):
        try:
            response = shard.indexer.stub.GetQueueOffsets(
                indexer_pb2.GetQueueOffsetsRequest(topic=SCHEDULE_TOPIC, queue_id=queue_id), timeout=5)
            table[str(queue_id + 1)] = response.max_offset
        except grpc.RpcError:
            table[str(queue_id + 1)] = 0
    path = shard.root / store_name / "config" / "delayOffset.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"offsetTable": table}))
    return table


def _scheduler(shard: Shard, store_name: str, persist_interval_ms: int = 200) -> SchedulerProcess:
    return start_scheduler(shard.root / store_name, shard.root / "broker", shard.root / "indexer",
                           shard.commitlog.address, shard.indexer.address, shard.env, persist_interval_ms)


def _delayed(topic: str, queue_id: int, body: bytes, delay: str, **properties: str) -> common_pb2.Message:
    return common_pb2.Message(topic=topic, queue_id=queue_id, body=body, flag=7, born_timestamp=1_700_000_000_123,
                              born_host="10.1.2.3:4567", reconsume_times=2,
                              properties={"DELAY": delay, "TAGS": "tag-a", "KEYS": "k1 k2", "custom": "v",
                                          **properties})


def _offsets_file(shard: Shard, store_name: str) -> dict[str, int]:
    document: dict[str, dict[str, int]] = json.loads(
        (shard.root / store_name / "config" / "delayOffset.json").read_text())
    return document["offsetTable"]


def test_every_level_delivered_on_time_with_messagetimeup_fields(shard: Shard) -> None:
    seeded = _fresh_store(shard, "sched-fields")
    scheduler = _scheduler(shard, "sched-fields")
    try:
        topic = "delay-fields"
        sends = [_delayed(topic, 1, b"d1", "1"), _delayed(topic, 1, b"d2", "2"), _delayed(topic, 1, b"d3", "3"),
                 _delayed(topic, 1, b"d9", "9")]  # above the 3 levels: clamped to 3 by the store
        results = append(shard.commitlog, shard.indexer, sends)
        assert [(r.topic, r.queue_id) for r in results] == [(SCHEDULE_TOPIC, 0), (SCHEDULE_TOPIC, 1),
                                                            (SCHEDULE_TOPIC, 2), (SCHEDULE_TOPIC, 2)]
        scheduled = {r.body: r for _, r in
                     (pair for q in range(3) for pair in queue_records(shard.commitlog, shard.indexer,
                                                                        SCHEDULE_TOPIC, q))}
        time.sleep(0.5)
        assert queue_records(shard.commitlog, shard.indexer, topic, 1) == [], "delivered before its delay"
        delivered = wait_for_records(shard.commitlog, shard.indexer, topic, 1, 4, timeout_s=10)
        assert sorted(r.body for _, r in delivered) == [b"d1", b"d2", b"d3", b"d9"]
        for unit, record in delivered:
            parked = scheduled[record.body]
            level = int(parked.properties["DELAY"])
            assert level == {b"d1": 1, b"d2": 2, b"d3": 3, b"d9": 3}[record.body]
            due = parked.store_timestamp + DELAY_MS[level - 1]
            assert due <= record.store_timestamp <= due + LATE_BOUND_MS, (record.body, record.store_timestamp - due)
            # messageTimeup: body, flag, sys_flag, born time and host, reconsume times and the properties
            # (REAL_TOPIC / REAL_QID and DELAY included) carried over; topic and queue the real ones.
            assert (record.topic, record.queue_id) == (topic, 1)
            assert record.body == parked.body and record.body_crc == parked.body_crc
            assert record.flag == parked.flag == 7
            assert record.sys_flag == parked.sys_flag
            assert record.born_timestamp == parked.born_timestamp == 1_700_000_000_123
            assert record.born_host == parked.born_host == "10.1.2.3:4567"
            assert record.store_host == parked.store_host
            assert record.reconsume_times == parked.reconsume_times == 2
            assert record.prepared_transaction_offset == 0
            # DELAY stays in the properties string, as 4.9.8 writes it (it serialises before clearing)
            assert record.properties == parked.properties
            assert record.properties["REAL_TOPIC"] == topic and record.properties["REAL_QID"] == "1"
            # the tags code is the TAGS hash again, not a deliver time
            assert unit.tags_code == java_string_hash("tag-a")
            assert parked.store_timestamp < record.store_timestamp
    finally:
        assert scheduler.stop() == 0, scheduler.logs()
    assert _offsets_file(shard, "sched-fields") == {"1": seeded["1"] + 1, "2": seeded["2"] + 1, "3": seeded["3"] + 2}


def test_clean_restart_neither_loses_nor_repeats(shard: Shard) -> None:
    store = "sched-restart"
    seeded = _fresh_store(shard, store)
    scheduler = _scheduler(shard, store)
    topic = "delay-restart"
    try:
        append(shard.commitlog, shard.indexer, [_delayed(topic, 0, b"a%d" % i, "1") for i in range(20)])
        append(shard.commitlog, shard.indexer, [_delayed(topic, 0, b"b%d" % i, "3") for i in range(20)])
        wait_for_records(shard.commitlog, shard.indexer, topic, 0, 20, timeout_s=10)
    finally:
        assert scheduler.stop() == 0, scheduler.logs()
    first = _offsets_file(shard, store)
    # the level-3 messages fall due while the scheduler is down; a restart delivers them once
    time.sleep(2.0)
    scheduler = _scheduler(shard, store)
    try:
        delivered = wait_for_records(shard.commitlog, shard.indexer, topic, 0, 40, timeout_s=10)
        time.sleep(0.5)
        delivered = queue_records(shard.commitlog, shard.indexer, topic, 0)
    finally:
        assert scheduler.stop() == 0, scheduler.logs()
    bodies = sorted(r.body for _, r in delivered)
    assert bodies == sorted([b"a%d" % i for i in range(20)] + [b"b%d" % i for i in range(20)])
    assert first["1"] == seeded["1"] + 20 and first["3"] == seeded["3"], "level 3 was not due at the stop"
    assert _offsets_file(shard, store) == {**seeded, "1": seeded["1"] + 20, "3": seeded["3"] + 20}


def test_kill9_before_the_persist_interval_repeats_nothing(shard: Shard) -> None:
    """Killed -9 after re-puts no write of delayOffset.json counts (the persist interval is longer than
    the test: only the early write after the first batch happens), a restart finds them in the log past
    scanFromOffset and delivers every message exactly once, two identical sends (a producer's retry)
    twice."""
    store = "sched-kill"
    topic = "delay-kill"
    persisted = _fresh_store(shard, store)
    scheduler = _scheduler(shard, store, persist_interval_ms=600_000)
    expected = []
    try:
        for wave in range(3):  # a batch each, 0.3 s apart: the early write counts only the first
            bodies = [b"k%d-%d" % (wave, i) for i in range(10)] + ([b"twin", b"twin"] if wave == 1 else [])
            append(shard.commitlog, shard.indexer, [_delayed(topic, 2, body, "1") for body in bodies])
            expected += bodies
            time.sleep(0.3)
        wait_for_records(shard.commitlog, shard.indexer, topic, 2, len(expected), timeout_s=10)
    finally:
        scheduler.kill9()
    written = _offsets_file(shard, store)["1"] - persisted["1"]
    assert written < len(expected), "the kill left no re-put the file does not count"
    scheduler = _scheduler(shard, store)
    try:
        deadline = time.monotonic() + 10
        while _offsets_file(shard, store)["1"] < persisted["1"] + len(expected) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)  # a copy would be stored by now: every unit was due before the restart
        delivered = queue_records(shard.commitlog, shard.indexer, topic, 2)
    finally:
        assert scheduler.stop() == 0, scheduler.logs()
    assert sorted(r.body for _, r in delivered) == sorted(expected), \
        f"{len(delivered)} deliveries of {len(expected)} messages ({written} counted by the file at the kill)"
    assert _offsets_file(shard, store)["1"] == persisted["1"] + len(expected)


def test_a_level_behind_does_not_hold_another_up_until_it_caught_up(shard: Shard) -> None:
    """Two levels with a backlog due at once: the loop takes one batch per level in turn, so level 2's
    first delivery comes after at most one batch of level 1's, not after all of them."""
    store = "sched-fair"
    _fresh_store(shard, store)
    first, second = 1200, 300
    for start in range(0, first, 300):
        append(shard.commitlog, shard.indexer, [_delayed("fair-1", 0, b"a%d" % i, "1")
                                                for i in range(start, start + 300)])
    append(shard.commitlog, shard.indexer, [_delayed("fair-2", 0, b"b%d" % i, "2") for i in range(second)])
    time.sleep(DELAY_MS[1] / 1000 + 0.2)  # both backlogs due before the scheduler starts
    scheduler = _scheduler(shard, store)
    try:
        level1 = wait_for_records(shard.commitlog, shard.indexer, "fair-1", 0, first, timeout_s=20)
        level2 = wait_for_records(shard.commitlog, shard.indexer, "fair-2", 0, second, timeout_s=20)
    finally:
        assert scheduler.stop() == 0, scheduler.logs()
    assert len(level1) == first and len(level2) == second
    first_of_level2 = min(unit.commitlog_offset for unit, _ in level2)
    level1_before = sum(1 for unit, _ in level1 if unit.commitlog_offset < first_of_level2)
    # MAX_BATCH (256) re-puts per level and round
    assert level1_before <= 256, f"level 2 waited for {level1_before} of level 1's {first} deliveries"


def test_a_consumer_send_back_is_delivered_to_its_retry_topic(shard: Shard) -> None:
    """A send-back parks a message for %RETRY%<group> (only the group flow may write that topic): the
    scheduler re-puts it there through Append with group_flow, where AppendBatch would be refused."""
    store = "sched-retry"
    _fresh_store(shard, store)
    scheduler = _scheduler(shard, store)
    topic = "%RETRY%delay-group"
    try:
        result = shard.commitlog.stub.Append(commitlog_pb2.AppendRequest(
            message=_delayed(topic, 0, b"retry-me", "1", RETRY_TOPIC="orders"), group_flow=True), timeout=10)
        assert (result.topic, result.queue_id) == (SCHEDULE_TOPIC, 0)
        delivered = wait_for_records(shard.commitlog, shard.indexer, topic, 0, 1, timeout_s=10)
    finally:
        assert scheduler.stop() == 0, scheduler.logs()
    assert [(r.topic, r.body, r.properties["RETRY_TOPIC"]) for _, r in delivered] == [(topic, b"retry-me", "orders")]


def test_a_batch_stored_whose_answer_was_lost_is_not_put_again(shard: Shard) -> None:
    """The commitlog stores a delivery but its answer never reaches the scheduler (the connection is
    reset while the answer is on its way: a leader killed as it waited for its followers). Trying the
    batch again must not store it twice: the re-put already in the log counts as delivered (a retry
    stored it twice before: tests/commitlog/test_metadata_replication.py saw a delay-level message
    delivered twice after a leader kill)."""
    store = "sched-lost-answer"
    _fresh_store(shard, store)
    topic = "delay-lost-answer"
    with fault_proxy(shard.commitlog.address) as proxy:
        scheduler = start_scheduler(shard.root / store, shard.root / "broker", shard.root / "indexer",
                                    proxy.address, shard.indexer.address, shard.env, 200)
        try:
            # Every answer of the commitlog to the scheduler arrives 3 s late from now on.
            proxy.delay(3.0, DOWN)
            append(shard.commitlog, shard.indexer, [_delayed(topic, 0, b"once", "1")])
            # Due 1 s after its store time: the re-put is in the log while its answer is held back.
            wait_for_records(shard.commitlog, shard.indexer, topic, 0, 1, timeout_s=10)
            proxy.set(DROP)  # the connection goes, with the answer on it
            time.sleep(0.3)
            proxy.heal()
            time.sleep(3.5)  # the scheduler tries again after 1 s, and would have stored it again by now
            delivered = queue_records(shard.commitlog, shard.indexer, topic, 0)
        finally:
            assert scheduler.stop() == 0, scheduler.logs()
    assert [r.body for _, r in delivered] == [b"once"], scheduler.logs()[-3000:]
