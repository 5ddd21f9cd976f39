"""Crash safety of delayed delivery: the scheduler killed -9 again and again while it delivers a few
thousand level-1 messages, restarted each time (real commitlog, indexer and scheduler processes).

What RocketMQ's ScheduleMessageService promises, and docs/scheduling.md repeats: at least once. A
level's offset moves past a unit only once the store acknowledged its re-put, and is written to
config/delayOffset.json every persist interval; a restart carries on from the written offset. So:
no message is lost; the repeats after a kill are exactly the units delivered since the file's last
write (the offsets between the written one and where the killed process had got to), each first
stored after that write; and each run delivers its units in queue order, from the written offset
on, without gaps. (A process that lived a persist interval wrote the file within one interval of its
kill; one killed sooner repeats what every life since the last write delivered.)
"""

from __future__ import annotations

import json
import random
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import grpc

from mqstore.services.store.message import SCHEDULE_TOPIC
from mqstore.v1 import commitlog_pb2, common_pb2, indexer_pb2
from tests.scheduler.conftest import Shard
from tests.scheduler.scheduler_process import SchedulerProcess, queue_records, start_scheduler

TOPIC = "delay-crash"
QUEUE = 0
MESSAGES = 3000
BATCH = 50
#: the producer spreads its appends over MESSAGES / BATCH * APPEND_EVERY_S seconds, so that units fall
#: due (one second later: level 1) all through the kills
APPEND_EVERY_S = 0.15
KILLS = 6
PERSIST_INTERVAL_MS = 500
#: how long before a write of delayOffset.json a unit it does not cover may have been stored on a
#: loaded shared machine (the re-put in flight while the table was taken, acknowledged after it)
SLACK_MS = 1000


@dataclass
class Kill:
    at_ms: int
    #: messages in the real queue after the kill (their appends settled)
    queue_end: int
    #: level 1's offset in delayOffset.json at the kill
    persisted: int
    #: when delayOffset.json was last written before the kill (ms since the epoch)
    written_ms: int


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def _schedule_end(shard: Shard) -> int:
    try:
        return int(shard.indexer.stub.GetQueueOffsets(
            indexer_pb2.GetQueueOffsetsRequest(topic=SCHEDULE_TOPIC, queue_id=0), timeout=5).max_offset)
    except grpc.RpcError:
        return 0


def _real_queue_end(shard: Shard) -> int:
    try:
        return int(shard.indexer.stub.GetQueueOffsets(
            indexer_pb2.GetQueueOffsetsRequest(topic=TOPIC, queue_id=QUEUE), timeout=5).max_offset)
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


def _produce(shard: Shard, failures: list[BaseException]) -> None:
    try:
        for first in range(0, MESSAGES, BATCH):
            messages = [common_pb2.Message(topic=TOPIC, queue_id=QUEUE, body=b"c%05d" % i,
                                           properties={"DELAY": "1", "UNIQ_KEY": f"{i:032X}"})
                        for i in range(first, first + BATCH)]
            response = shard.commitlog.stub.AppendBatch(commitlog_pb2.AppendBatchRequest(messages=messages),
                                                        timeout=10)
            assert all(r.status == commitlog_pb2.PUT_MESSAGE_STATUS_PUT_OK for r in response.results), response
            time.sleep(APPEND_EVERY_S)
    except BaseException as exc:  # noqa: BLE001 - reported by the test
        failures.append(exc)


def _scheduler(shard: Shard, store: str) -> SchedulerProcess:
    return start_scheduler(shard.root / store, shard.root / "broker", shard.root / "indexer",
                           shard.commitlog.address, shard.indexer.address, shard.env, PERSIST_INTERVAL_MS)


def test_kill9_during_delivery_loses_nothing_and_repeats_only_the_unpersisted(shard: Shard) -> None:
    store = "sched-crash"
    seed = _schedule_end(shard)  # this store delivers from where SCHEDULE_TOPIC_XXXX queue 0 ends now
    (shard.root / store / "config").mkdir(parents=True)
    (shard.root / store / "config" / "delayOffset.json").write_text(json.dumps({"offsetTable": {"1": seed}}))
    failures: list[BaseException] = []
    producer = threading.Thread(target=_produce, args=(shard, failures), name="delayed-producer")
    producer.start()
    rng = random.Random(11)
    kills: list[Kill] = []
    scheduler = _scheduler(shard, store)
    try:
        while len(kills) < KILLS:
            # Kill during delivery: once this run has re-put something, a moment later.
            previous = kills[-1].queue_end if kills else 0
            progress_deadline = time.monotonic() + 15
            while _real_queue_end(shard) <= previous and time.monotonic() < progress_deadline:
                time.sleep(0.02)
            time.sleep(rng.uniform(0.1, 1.2))  # a life shorter or longer than the persist interval
            at = now_ms()
            scheduler.kill9()
            _settle(shard)
            kills.append(Kill(at, _real_queue_end(shard), _persisted(shard, store),
                              _offsets_path(shard, store).stat().st_mtime_ns // 1_000_000))
            scheduler = _scheduler(shard, store)
            if not producer.is_alive() and kills[-1].persisted == seed + MESSAGES:
                break  # everything delivered and written: nothing left to interrupt
        producer.join(60)
        assert not failures, failures
        # Where each killed run had got to: it started at the offset written before, and delivered
        # the units in order. What it had delivered past its last write comes again.
        reached, previous_end, start = [], 0, seed
        for kill in kills:
            reached.append(start + kill.queue_end - previous_end)
            previous_end, start = kill.queue_end, kill.persisted
        repeats = [end - kill.persisted for end, kill in zip(reached, kills, strict=True)]
        expected_total = MESSAGES + sum(repeats)
        deadline = time.monotonic() + 30
        while _real_queue_end(shard) < expected_total and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)  # anything beyond the expected copies would show now
    finally:
        producer.join(60)
        if scheduler.running:
            assert scheduler.stop() == 0, scheduler.logs()
    assert _persisted(shard, store) == seed + MESSAGES, "the clean stop writes the final offset"

    delivered = queue_records(shard.commitlog, shard.indexer, TOPIC, QUEUE)
    indexes = [int(record.body[1:]) for _, record in delivered]
    duplicates = len(indexes) - len(set(indexes))
    print(f"{len(kills)} kills; {len(indexes)} deliveries of {MESSAGES} messages: duplicates {duplicates} "
          f"(per kill {repeats}; offsets reached {[r - seed for r in reached]}, "
          f"written {[k.persisted - seed for k in kills]})")
    assert set(indexes) == set(range(MESSAGES)), f"lost: {sorted(set(range(MESSAGES)) - set(indexes))[:20]}"
    assert duplicates == sum(repeats) and len(indexes) == expected_total
    interrupted = sum(1 for end in reached if end < seed + MESSAGES)
    assert interrupted >= 3 and duplicates > 0, f"too few kills hit a delivery in progress: {reached}, {repeats}"

    # Run by run: units in queue order from the written offset on, without gaps or extras.
    runs = [indexes[a:b] for a, b in zip([0, *(k.queue_end for k in kills)],
                                         [*(k.queue_end for k in kills), len(indexes)], strict=True)]
    starts = [seed, *(k.persisted for k in kills)]
    for run, begin in zip(runs, starts, strict=True):
        assert run == list(range(begin - seed, begin - seed + len(run))), (begin - seed, run[:5], run[-5:])
    # The written offset never goes back, and never past what was delivered.
    written = [k.persisted for k in kills]
    assert written == sorted(written) and all(w <= r for w, r in zip(written, reached, strict=True))

    # The repeats of a kill are the deliveries since the file's last write: every one of them was
    # first stored after that write (less the re-puts in flight while it was written). A process that
    # lived a persist interval wrote the file within one interval of its kill; one killed sooner
    # repeats what every life since the last write delivered.
    stored_at: dict[int, int] = {}
    for _, record in delivered:
        stored_at.setdefault(int(record.body[1:]), record.store_timestamp)
    for kill, end in zip(kills, reached, strict=True):
        for index in range(kill.persisted - seed, end - seed):
            assert stored_at[index] >= kill.written_ms - SLACK_MS, (index, kill.written_ms - stored_at[index])
