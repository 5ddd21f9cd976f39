"""Timer messages end to end (RocketMQ 5's TIMER_DELIVER_MS / TIMER_DELAY_SEC / TIMER_DELAY_MS): real
commitlog service, indexer and scheduler processes, small geometry.

A timer message not yet due is parked under rmq_sys_wheel_timer queue 0 and delivered to its real
topic and queue at its time (not before), with RocketMQ 5's properties; a due one is stored at once;
one beyond timerMaxDelaySec or not a number is refused, naming the property. Across a clean restart
and across kill -9 nothing is lost or repeated (docs/scheduling.md).
"""

from __future__ import annotations

import contextlib
import json
import re
import time

import grpc
import pytest

from mqstore.v1 import commitlog_pb2, common_pb2, indexer_pb2
from services.scheduler.timer_delivery import wheel_slots
from services.store.rules.timer_message import DEFAULT_TIMER_MAX_DELAY_SEC, TIMER_TOPIC
from tests.scheduler.conftest import Shard
from tests.scheduler.scheduler_process import (
    SchedulerProcess,
    append,
    queue_records,
    start_scheduler,
    wait_for_records,
)

LATE_BOUND_MS = 1500


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _fresh_timer_store(shard: Shard, store_name: str) -> None:
    """A timer store that starts where rmq_sys_wheel_timer ends now (the tests share one shard)."""
    try:
        response = shard.indexer.stub.GetQueueOffsets(
            indexer_pb2.GetQueueOffsetsRequest(topic=TIMER_TOPIC, queue_id=0), timeout=5)
        start = response.max_offset
    except grpc.RpcError:
        start = 0
    path = shard.root / store_name / "timer" / "timercheck"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"enqueueOffset": start, "timerLogPos": 0, "deliveredSecond": 0,
                                "slots": wheel_slots(DEFAULT_TIMER_MAX_DELAY_SEC)}))


def _scheduler(shard: Shard, store_name: str, persist_interval_ms: int = 200) -> SchedulerProcess:
    return start_scheduler(shard.root / store_name, shard.root / "broker", shard.root / "indexer",
                           shard.commitlog.address, shard.indexer.address, shard.env, persist_interval_ms)


def _timer(topic: str, queue_id: int, body: bytes, **properties: str) -> common_pb2.Message:
    return common_pb2.Message(topic=topic, queue_id=queue_id, body=body, flag=3, born_timestamp=1_700_000_000_456,
                              born_host="10.9.8.7:6543", reconsume_times=1,
                              properties={"TAGS": "t", "KEYS": "k", **properties})


def test_timers_delivered_at_their_time_with_rocketmq5_properties(shard: Shard) -> None:
    store = "timer-fields"
    _fresh_timer_store(shard, store)
    scheduler = _scheduler(shard, store)
    topic = "timer-fields"
    try:
        sent = _now_ms()
        sends = [_timer(topic, 1, b"abs", TIMER_DELIVER_MS=str(sent + 1500)),
                 _timer(topic, 1, b"sec", TIMER_DELAY_SEC="1"),
                 _timer(topic, 1, b"ms", TIMER_DELAY_MS="1200"),
                 _timer(topic, 1, b"past", TIMER_DELIVER_MS=str(sent - 5000))]
        results = append(shard.commitlog, shard.indexer, sends)
        assert [(r.topic, r.queue_id) for r in results] == [(TIMER_TOPIC, 0)] * 3 + [(topic, 1)]
        parked = {r.body: r for _, r in queue_records(shard.commitlog, shard.indexer, TIMER_TOPIC, 0)
                  if r.properties.get("REAL_TOPIC") == topic}
        assert set(parked) == {b"abs", b"sec", b"ms"}
        assert parked[b"abs"].properties["TIMER_OUT_MS"] == str(sent + 1500)
        assert parked[b"sec"].properties["REAL_QID"] == "1"
        time.sleep(0.6)
        assert [r.body for _, r in queue_records(shard.commitlog, shard.indexer, topic, 1)] == [b"past"]
        delivered = wait_for_records(shard.commitlog, shard.indexer, topic, 1, 4, timeout_s=10)
    finally:
        assert scheduler.stop() == 0, scheduler.logs()
    assert sorted(r.body for _, r in delivered) == [b"abs", b"ms", b"past", b"sec"]
    for _, record in delivered:
        if record.body == b"past":
            assert "TIMER_OUT_MS" not in record.properties and "REAL_TOPIC" not in record.properties
            continue
        source = parked[record.body]
        due = int(source.properties["TIMER_OUT_MS"])
        assert due <= record.store_timestamp <= due + LATE_BOUND_MS, (record.body, record.store_timestamp - due)
        assert (record.topic, record.queue_id) == (topic, 1)
        assert (record.body, record.flag, record.sys_flag, record.born_timestamp, record.born_host,
                record.reconsume_times, record.prepared_transaction_offset) == \
            (source.body, 3, source.sys_flag, 1_700_000_000_456, "10.9.8.7:6543", 1, 0)
        extra = {k: v for k, v in record.properties.items() if k not in source.properties}
        assert set(extra) == {"TIMER_ENQUEUE_MS", "TIMER_DEQUEUE_MS"}
        assert {k: record.properties[k] for k in source.properties} == source.properties
        assert int(extra["TIMER_ENQUEUE_MS"]) <= int(extra["TIMER_DEQUEUE_MS"]) <= record.store_timestamp


@pytest.mark.parametrize(("properties", "match"), [
    ({"TIMER_DELIVER_MS": "soon"}, r"TIMER_DELIVER_MS property 'soon' is not a whole number"),
    ({"TIMER_DELAY_SEC": "1.5"}, r"TIMER_DELAY_SEC property '1.5' is not a whole number"),
    ({"TIMER_DELAY_SEC": str(8 * 24 * 3600)}, r"TIMER_DELAY_SEC .* beyond the limit of 604800 s \(timerMaxDelaySec\)"),
    ({"TIMER_DELIVER_MS": str(_now_ms() + 8 * 86_400_000)}, r"TIMER_DELIVER_MS .* beyond the limit of 604800 s"),
])
def test_bad_timer_properties_are_refused_and_nothing_written(shard: Shard, properties: dict[str, str],
                                                              match: str) -> None:
    info = shard.commitlog.stub.GetStoreInfo(commitlog_pb2.GetStoreInfoRequest(), timeout=5)
    with pytest.raises(grpc.RpcError) as failure:
        shard.commitlog.stub.Append(commitlog_pb2.AppendRequest(message=_timer("timer-bad", 0, b"x", **properties)),
                                    timeout=5)
    assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT

    assert re.search(match, failure.value.details()), failure.value.details()
    after = shard.commitlog.stub.GetStoreInfo(commitlog_pb2.GetStoreInfoRequest(), timeout=5)
    assert after.max_offset == info.max_offset


def test_producers_may_not_send_to_the_timer_topic(shard: Shard) -> None:
    with pytest.raises(grpc.RpcError) as failure:
        shard.commitlog.stub.Append(commitlog_pb2.AppendRequest(message=_timer(TIMER_TOPIC, 0, b"x")), timeout=5)
    assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "system topic" in failure.value.details()


def test_timers_across_a_clean_restart_neither_lost_nor_repeated(shard: Shard) -> None:
    store = "timer-restart"
    topic = "timer-restart"
    _fresh_timer_store(shard, store)
    scheduler = _scheduler(shard, store)
    try:
        base = _now_ms()
        append(shard.commitlog, shard.indexer,
               [_timer(topic, 0, b"a%d" % i, TIMER_DELIVER_MS=str(base + 1000 + i * 10)) for i in range(20)])
        append(shard.commitlog, shard.indexer,
               [_timer(topic, 0, b"b%d" % i, TIMER_DELIVER_MS=str(base + 3500 + i * 10)) for i in range(20)])
        wait_for_records(shard.commitlog, shard.indexer, topic, 0, 20, timeout_s=10)
    finally:
        assert scheduler.stop() == 0, scheduler.logs()
    time.sleep(max(0.0, (base + 4000 - _now_ms()) / 1000))  # the b's fall due while it is down
    scheduler = _scheduler(shard, store)
    try:
        wait_for_records(shard.commitlog, shard.indexer, topic, 0, 40, timeout_s=10)
        time.sleep(1.0)
        delivered = queue_records(shard.commitlog, shard.indexer, topic, 0)
    finally:
        assert scheduler.stop() == 0, scheduler.logs()
    bodies = sorted(r.body for _, r in delivered)
    assert bodies == sorted([b"a%d" % i for i in range(20)] + [b"b%d" % i for i in range(20)])


def test_timers_across_kill9_during_delivery_neither_lost_nor_repeated(shard: Shard) -> None:
    """Killed -9 in the middle of 3 s of deliveries with no checkpoint since the early one after the
    first batch: a restart finds the later re-puts in the log past scanFromOffset (among them units
    the checkpoint's timerlog length left out, taken in again) and delivers every message exactly
    once, two identical sends (a producer's retry) twice."""
    store = "timer-kill"
    topic = "timer-kill"
    count = 300
    _fresh_timer_store(shard, store)
    scheduler = _scheduler(shard, store, persist_interval_ms=600_000)
    try:
        base = _now_ms() + 1000
        twins = [_timer(topic, 2, b"twin", TIMER_DELIVER_MS=str(base + 1500))] * 2
        append(shard.commitlog, shard.indexer,
               [_timer(topic, 2, b"k%d" % i, TIMER_DELIVER_MS=str(base + i * 10)) for i in range(count)] + twins)
        # kill it in the middle of the 3 s of deliveries
        before = wait_for_records(shard.commitlog, shard.indexer, topic, 2, count // 3, timeout_s=10)
    finally:
        scheduler.kill9()
    before = queue_records(shard.commitlog, shard.indexer, topic, 2)
    assert 0 < len(before) < count, "the kill did not fall during delivery"
    expected = sorted([b"k%d" % i for i in range(count)] + [b"twin", b"twin"])
    scheduler = _scheduler(shard, store)
    try:
        wait_for_records(shard.commitlog, shard.indexer, topic, 2, len(expected), timeout_s=15)
        time.sleep(1.0)  # a copy would be stored by now
        delivered = queue_records(shard.commitlog, shard.indexer, topic, 2)
    finally:
        assert scheduler.stop() == 0, scheduler.logs()
    bodies = sorted(r.body for _, r in delivered)
    print(f"timers: {len(before)} delivered before kill -9, {len(bodies) - len(expected)} copies after the restart")
    assert set(bodies) == set(expected), "a timer message was lost"
    assert bodies == expected, f"{len(bodies)} deliveries of {len(expected)} messages"


def test_committed_transaction_messages_with_a_delay_or_timer_keep_their_commit_type(shard: Shard) -> None:
    """4.9.8 parks a committed transaction message with DELAY (RocketMQ 5: with a timer) and delivers it
    with its commit sys_flag; the scheduler's re-put of such a message must not be refused."""
    store = "timer-commit"
    topic = "timer-commit"
    _fresh_timer_store(shard, store)
    levels = {str(q + 1): 0 for q in range(3)}
    for queue_id in range(3):
        with contextlib.suppress(grpc.RpcError):
            levels[str(queue_id + 1)] = shard.indexer.stub.GetQueueOffsets(
                indexer_pb2.GetQueueOffsetsRequest(topic="SCHEDULE_TOPIC_XXXX", queue_id=queue_id),
                timeout=5).max_offset
    (shard.root / store / "config").mkdir(parents=True)
    (shard.root / store / "config" / "delayOffset.json").write_text(json.dumps({"offsetTable": levels}))
    scheduler = _scheduler(shard, store)
    try:
        for body, props in ((b"delay", {"DELAY": "1"}), (b"timer", {"TIMER_DELAY_MS": "800"})):
            message = _timer(topic, 0, body, **props)
            message.sys_flag = 0x8  # TRANSACTION_COMMIT_TYPE
            result = shard.commitlog.stub.Append(commitlog_pb2.AppendRequest(message=message, transaction_flow=True),
                                                 timeout=10)
            assert result.topic in ("SCHEDULE_TOPIC_XXXX", TIMER_TOPIC)
        delivered = wait_for_records(shard.commitlog, shard.indexer, topic, 0, 2, timeout_s=10)
    finally:
        assert scheduler.stop() == 0, scheduler.logs()
    assert sorted((r.body, r.sys_flag & 0xC) for _, r in delivered) == [(b"delay", 0x8), (b"timer", 0x8)]
