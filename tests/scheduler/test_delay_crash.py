"""Crash safety of scheduled delivery: the scheduler killed -9 again and again while it delivers a few
thousand level-1 and timer messages, restarted each time (real commitlog, indexer and scheduler
processes).

What docs/scheduling.md promises: exactly once. A level's offset (a timer unit's done mark) moves past
a unit only once the store acknowledged its re-put, so nothing is lost; the re-puts stored after the
last write of delayOffset.json / the timer checkpoint are in the log past its ``scanFromOffset``, and
a restart counts them before it delivers anything, so nothing is repeated, wherever the kill falls
(soon after a start, during a batch, long after the last write). A level's units are delivered in
queue order, so across every run the real queue holds the level-1 messages once each, in the order
they were sent.

``make soak-scheduler`` runs the same campaign with ``MQSTORE_SOAK_SCHEDULER_KILLS`` kills (90 there)
and ``MQSTORE_SOAK_SCHEDULER_PER_KILL`` level-1 messages per kill (1,000 there: the producer goes on
through about all the kills).
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from pathlib import Path

import grpc

from mqstore.v1 import commitlog_pb2, common_pb2, indexer_pb2
from services.scheduler.timer_delivery import wheel_slots
from services.store.formats.message import SCHEDULE_TOPIC
from services.store.rules.timer_message import DEFAULT_TIMER_MAX_DELAY_SEC, TIMER_TOPIC
from tests.scheduler.conftest import Shard
from tests.scheduler.scheduler_process import SchedulerProcess, queue_records, start_scheduler

TOPIC = "delay-crash"
TIMER_TOPIC_REAL = "timer-crash"
QUEUE = 0
KILLS = int(os.environ.get("MQSTORE_SOAK_SCHEDULER_KILLS", "6"))
#: 500 level-1 and 250 timer messages per kill (3,000 and 1,500 for the six of the normal suite)
MESSAGES = int(os.environ.get("MQSTORE_SOAK_SCHEDULER_PER_KILL", "500")) // 50 * 50 * KILLS
TIMERS = MESSAGES // 2
BATCH = 50
#: the producer spreads its appends over MESSAGES / BATCH * APPEND_EVERY_S seconds, so that units fall
#: due (one second later) all through the kills
APPEND_EVERY_S = 0.15
#: longer than any life here: what a kill leaves past the last write is never small
PERSIST_INTERVAL_MS = 5000


def _queue_end(shard: Shard, topic: str, queue_id: int) -> int:
    try:
        return int(shard.indexer.stub.GetQueueOffsets(
            indexer_pb2.GetQueueOffsetsRequest(topic=topic, queue_id=queue_id), timeout=5).max_offset)
    except grpc.RpcError as exc:
        if exc.code() == grpc.StatusCode.NOT_FOUND:
            return 0
        raise


def _settle(shard: Shard) -> None:
    """Wait until a re-put the killed scheduler left in flight is stored and dispatched."""
    time.sleep(0.3)
    end = shard.commitlog.stub.GetStoreInfo(commitlog_pb2.GetStoreInfoRequest(), timeout=5).max_offset
    shard.indexer.wait_caught_up(end)


def _offsets_path(shard: Shard, store: str) -> Path:
    return shard.root / store / "config" / "delayOffset.json"


def _persisted(shard: Shard, store: str) -> int:
    return int(json.loads(_offsets_path(shard, store).read_text())["offsetTable"]["1"])


def _fresh_store(shard: Shard, store: str) -> int:
    """A scheduler store that starts where SCHEDULE_TOPIC_XXXX queue 0 and rmq_sys_wheel_timer end now
    (the tests share one shard); level 1's offset."""
    seed = _queue_end(shard, SCHEDULE_TOPIC, 0)
    _offsets_path(shard, store).parent.mkdir(parents=True)
    _offsets_path(shard, store).write_text(json.dumps({"offsetTable": {"1": seed}}))
    check = shard.root / store / "timer" / "timercheck"
    check.parent.mkdir(parents=True)
    check.write_text(json.dumps({"enqueueOffset": _queue_end(shard, TIMER_TOPIC, 0), "timerLogPos": 0,
                                 "deliveredSecond": 0, "slots": wheel_slots(DEFAULT_TIMER_MAX_DELAY_SEC)}))
    return seed


def _produce(shard: Shard, failures: list[BaseException]) -> None:
    try:
        timers_per_batch = TIMERS * BATCH // MESSAGES
        for batch, first in enumerate(range(0, MESSAGES, BATCH)):
            messages = [common_pb2.Message(topic=TOPIC, queue_id=QUEUE, body=b"c%05d" % i,
                                           properties={"DELAY": "1", "UNIQ_KEY": f"{i:032X}"})
                        for i in range(first, first + BATCH)]
            due = time.time_ns() // 1_000_000 + 1000
            messages += [common_pb2.Message(topic=TIMER_TOPIC_REAL, queue_id=QUEUE, body=b"t%05d" % i,
                                            properties={"TIMER_DELIVER_MS": str(due + i % 7)})
                         for i in range(batch * timers_per_batch, (batch + 1) * timers_per_batch)]
            response = shard.commitlog.stub.AppendBatch(commitlog_pb2.AppendBatchRequest(messages=messages),
                                                        timeout=10)
            assert all(r.status == commitlog_pb2.PUT_MESSAGE_STATUS_PUT_OK for r in response.results), response
            time.sleep(APPEND_EVERY_S)
    except BaseException as exc:  # noqa: BLE001 - reported by the test
        failures.append(exc)


def _scheduler(shard: Shard, store: str) -> SchedulerProcess:
    return start_scheduler(shard.root / store, shard.root / "broker", shard.root / "indexer",
                           shard.commitlog.address, shard.indexer.address, shard.env, PERSIST_INTERVAL_MS)


def test_kill9_anywhere_during_delivery_loses_and_repeats_nothing(shard: Shard) -> None:
    store = "sched-crash"
    seed = _fresh_store(shard, store)
    failures: list[BaseException] = []
    producer = threading.Thread(target=_produce, args=(shard, failures), name="delayed-producer")
    producer.start()
    rng = random.Random(11)
    # (messages in the real queues at the kill, level 1's offset in delayOffset.json then)
    kills: list[tuple[int, int, int]] = []
    scheduler = _scheduler(shard, store)
    try:
        while len(kills) < KILLS:
            previous = kills[-1][0] if kills else 0
            if len(kills) % 3 == 2:  # soon after the start: before or during its first deliveries
                time.sleep(rng.uniform(0.0, 0.4))
            else:  # once this run has re-put something, a moment later
                progress_deadline = time.monotonic() + 15
                while _queue_end(shard, TOPIC, QUEUE) <= previous and time.monotonic() < progress_deadline:
                    time.sleep(0.02)
                time.sleep(rng.uniform(0.1, 1.2))
            scheduler.kill9()
            _settle(shard)
            kills.append((_queue_end(shard, TOPIC, QUEUE), _queue_end(shard, TIMER_TOPIC_REAL, QUEUE),
                          _persisted(shard, store)))
            scheduler = _scheduler(shard, store)
        producer.join(MESSAGES / BATCH * APPEND_EVERY_S * 2 + 60)
        assert not failures, failures
        deadline = time.monotonic() + 30
        while (_queue_end(shard, TOPIC, QUEUE) < MESSAGES or _queue_end(shard, TIMER_TOPIC_REAL, QUEUE) < TIMERS) \
                and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.0)  # a copy would be stored by now
    finally:
        producer.join(60)
        if scheduler.running:
            assert scheduler.stop() == 0, scheduler.logs()
    assert _persisted(shard, store) == seed + MESSAGES, "the clean stop writes the final offset"

    indexes = [int(record.body[1:]) for _, record in queue_records(shard.commitlog, shard.indexer, TOPIC, QUEUE)]
    timers = sorted(int(record.body[1:]) for _, record in
                    queue_records(shard.commitlog, shard.indexer, TIMER_TOPIC_REAL, QUEUE))
    # how far past the written offset each killed run had got: what today's restarts would repeat
    unwritten = [end - (persisted - seed) for end, _, persisted in kills]
    print(f"{len(kills)} kills (real queues then {[k[:2] for k in kills]}; re-puts past the written offset "
          f"{unwritten}); {len(indexes)} level-1 deliveries of {MESSAGES}, {len(timers)} timer deliveries of "
          f"{TIMERS}")
    assert indexes == list(range(MESSAGES)), \
        f"lost {sorted(set(range(MESSAGES)) - set(indexes))[:10]}, {len(indexes) - len(set(indexes))} copies"
    assert timers == list(range(TIMERS)), \
        f"lost {sorted(set(range(TIMERS)) - set(timers))[:10]}, {len(timers) - len(set(timers))} copies"
    assert sum(1 for n in unwritten if n > 0) >= 3, f"too few kills left re-puts past the last write: {unwritten}"
    assert sum(1 for end, _, _ in kills if 0 < end < MESSAGES) >= 3, f"too few kills during delivery: {kills}"
