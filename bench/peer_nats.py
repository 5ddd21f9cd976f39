"""NATS JetStream clients of the peer harness (nats-py), and its stream set-up and preload.

The topic is one stream ``TopicTest`` on file storage with the subjects ``TopicTest.0`` ..
``TopicTest.7`` (the 8 queues, written round robin); a message is a 1 KiB random body with the headers
UNIQ_KEY and CLUSTER. Its stream sequence is its id (get by id: the direct get API, ``allow_direct``);
a read of a range is an ordered push consumer on one subject; offset by time is an ephemeral pull
consumer with ``deliver_policy=by_start_time`` fetching one message (NATS 2.9 has no get by time).
Every publish is acknowledged by a PubAck before it counts; reads check the body size.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import random
import time
from typing import Any

import nats
from nats.js import api

from bench.peer_runner import Job, Tally
from bench.workload import BODY_SIZE, CLUSTER, QUEUES, TOPIC, Workload

POOL = 8192
CHUNK = 1024  # an ordered consumer's "call": the time to receive this many messages


def subject(queue_id: int) -> str:
    return f"{TOPIC}.{queue_id}"


def _headers(workload: Workload, i: int) -> dict[str, str]:
    return {"UNIQ_KEY": workload.uniq_key(i), "CLUSTER": CLUSTER}


async def connect(target: str) -> Any:
    return await nats.connect(f"nats://{target}", connect_timeout=10, max_reconnect_attempts=0,
                              pending_size=64 * 1024 * 1024)


async def create_stream(target: str) -> None:
    """(Re)create the stream empty: file storage, one replica, direct gets allowed."""
    nc = await connect(target)
    try:
        js = nc.jetstream()
        with contextlib.suppress(nats.js.errors.NotFoundError):
            await js.delete_stream(TOPIC)
        await js.add_stream(api.StreamConfig(name=TOPIC, subjects=[f"{TOPIC}.*"], storage=api.StorageType.FILE,
                                             num_replicas=1, allow_direct=True))
    finally:
        await nc.close()


class NatsSession:
    def __init__(self, job: Job, nc: Any) -> None:
        self.job = job
        self.nc = nc
        self.js = nc.jetstream(timeout=60)
        self.workload = Workload.fresh(POOL)
        self.counter = job.proc * 1_000_000_000

    async def close(self) -> None:
        await self.nc.close()

    async def worker(self, index: int, deadline_ns: int, tally: Tally) -> None:
        op = self.job.op
        if op == "publish-async":
            await self._publish_async(deadline_ns, tally)
        elif op == "publish":
            await self._publish(deadline_ns, tally)
        elif op == "ordered":
            await self._ordered(index, deadline_ns, tally)
        elif op == "get":
            await self._get(index, deadline_ns, tally)
        elif op == "time":
            await self._time(index, deadline_ns, tally)
        else:
            raise ValueError(f"unknown nats op {op!r}")

    async def _publish_async(self, deadline_ns: int, tally: Tally) -> None:
        """``batch`` async publishes, then their PubAcks (the call's latency: first publish to last ack)."""
        js, workload, batch = self.js, self.workload, self.job.batch
        clock, now, append = time.perf_counter_ns, time.monotonic_ns, tally.latencies.append
        while now() < deadline_ns:
            first = self.counter
            self.counter += batch
            t0 = clock()
            try:
                futures = [await js.publish_async(subject(i % QUEUES), workload.body(i), headers=_headers(workload, i))
                           for i in range(first, first + batch)]
                acks = await asyncio.gather(*futures, return_exceptions=True)
            except Exception as exc:  # noqa: BLE001 - counted, reported
                tally.error(exc, batch)
                continue
            append(clock() - t0)
            ok = sum(1 for a in acks if isinstance(a, api.PubAck) and a.seq > 0)
            tally.ok += ok
            if ok != batch:
                bad = next(a for a in acks if not (isinstance(a, api.PubAck) and a.seq > 0))
                tally.error(bad if isinstance(bad, BaseException) else RuntimeError(repr(bad)), batch - ok)

    async def _publish(self, deadline_ns: int, tally: Tally) -> None:
        js, workload = self.js, self.workload
        clock, now, append = time.perf_counter_ns, time.monotonic_ns, tally.latencies.append
        while now() < deadline_ns:
            i = self.counter
            self.counter += 1
            t0 = clock()
            try:
                ack = await js.publish(subject(i % QUEUES), workload.body(i), headers=_headers(workload, i))
            except Exception as exc:  # noqa: BLE001 - counted, reported
                tally.error(exc)
                continue
            append(clock() - t0)
            if ack.seq > 0:
                tally.ok += 1
            else:
                tally.error(RuntimeError(f"PubAck {ack!r}"))

    async def _ordered(self, index: int, deadline_ns: int, tally: Tally) -> None:
        """An ordered push consumer on one subject, from a random sequence; re-created at the subject's end.
        Messages are taken in the subscription's callback (nats-py's iterator and next_msg cost ~9x more
        per message); a "call" is ``CHUNK`` messages received."""
        job = self.job
        consumer = job.proc * job.concurrency + index
        queue_id = consumer % QUEUES
        per_queue = int(job.data[0])
        position = random.Random(consumer).randrange(per_queue)
        clock, now, append = time.perf_counter_ns, time.monotonic_ns, tally.latencies.append
        while now() < deadline_ns:
            remaining = per_queue - position
            done = asyncio.Event()
            state = {"got": 0, "t0": clock()}

            async def received(msg: Any, remaining: int = remaining, done: asyncio.Event = done,
                               state: dict[str, int] = state) -> None:
                got = state["got"] = state["got"] + 1
                if got % CHUNK == 0 or got == remaining:
                    if len(msg.data) != BODY_SIZE:  # an exception here would only reach nats' error_cb
                        state["bad"] = len(msg.data)
                    t1 = clock()
                    append(t1 - state["t0"])
                    state["t0"] = t1
                if got >= remaining or now() >= deadline_ns:
                    done.set()

            # Sequences of one subject are every 8th: the queue's message k has sequence k*8 + q + 1.
            sub = await self.js.subscribe(subject(queue_id), ordered_consumer=True, cb=received,
                                          config=api.ConsumerConfig(deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE,
                                                                    opt_start_seq=position * QUEUES + queue_id + 1))
            try:
                await asyncio.wait_for(done.wait(), timeout=max(1.0, (deadline_ns - now()) / 1e9 + 30))
            finally:
                await sub.unsubscribe()
            if "bad" in state:
                raise RuntimeError(f"{subject(queue_id)}: a {state['bad']} B body")
            tally.ok += min(state["got"], remaining)
            position = 0

    async def _get(self, index: int, deadline_ns: int, tally: Tally) -> None:
        last_seq = int(self.job.data[0])
        rng = random.Random(self.job.proc * 1000 + index)
        js = self.js
        clock, now, append = time.perf_counter_ns, time.monotonic_ns, tally.latencies.append
        while now() < deadline_ns:
            seq = rng.randint(1, last_seq)
            t0 = clock()
            try:
                msg = await js.get_msg(TOPIC, seq=seq, direct=True)
            except Exception as exc:  # noqa: BLE001 - counted, reported
                tally.error(exc)
                continue
            append(clock() - t0)
            if msg.seq == seq and msg.data is not None and len(msg.data) == BODY_SIZE:
                tally.ok += 1
            else:
                tally.error(RuntimeError(f"seq {seq}: got {msg.seq}"))

    async def _time(self, index: int, deadline_ns: int, tally: Tally) -> None:
        first_ms, last_ms = self.job.data[0]
        rng = random.Random(self.job.proc * 1000 + index)
        clock, now, append = time.perf_counter_ns, time.monotonic_ns, tally.latencies.append
        while now() < deadline_ns:
            queue_id, ms = rng.randrange(QUEUES), rng.randint(first_ms, last_ms)
            start = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)
            t0 = clock()
            try:
                sub = await self.js.pull_subscribe(subject(queue_id), stream=TOPIC, config=api.ConsumerConfig(
                    deliver_policy=api.DeliverPolicy.BY_START_TIME, opt_start_time=start,
                    ack_policy=api.AckPolicy.NONE, inactive_threshold=5.0))
                try:
                    msgs = await sub.fetch(1, timeout=2)
                finally:
                    await sub.unsubscribe()
            except Exception as exc:  # noqa: BLE001 - counted, reported
                tally.error(exc)
                continue
            append(clock() - t0)
            if len(msgs) == 1:
                tally.ok += 1
            else:
                tally.error(RuntimeError(f"{subject(queue_id)} at {ms} ms: {len(msgs)} messages"))


async def prepare(job: Job) -> NatsSession:
    return NatsSession(job, await connect(job.target))


def _ms(msg: Any) -> int:
    """A stored message's time (RFC 3339 with nanoseconds) in ms since the epoch."""
    text = str(msg.time)
    head, _, frac = text.rstrip("Z").partition(".")
    stamp = datetime.datetime.fromisoformat(head).replace(tzinfo=datetime.UTC)
    return int(stamp.timestamp() * 1000) + int((frac + "000")[:3])


async def _preload(target: str, count: int) -> dict[str, Any]:
    nc = await connect(target)
    try:
        js = nc.jetstream(timeout=60)
        workload = Workload.fresh(POOL)
        per_queue = max(1, count // QUEUES)
        total = per_queue * QUEUES
        started = time.monotonic()
        for start in range(0, total, 1024):
            futures = [await js.publish_async(subject(i % QUEUES), workload.body(i), headers=_headers(workload, i))
                       for i in range(start, min(total, start + 1024))]
            for ack in await asyncio.gather(*futures):
                if ack.seq <= 0:
                    raise RuntimeError(f"preload: PubAck {ack!r}")
        info = await js.stream_info(TOPIC)
        if info.state.messages != total:
            raise RuntimeError(f"preload: the stream holds {info.state.messages}, expected {total}")
        # Offset by time asks within the stored times: from the first message's to the earliest of the
        # subjects' last messages (a later time would find nothing on some subject and wait).
        first_ms = _ms(await js.get_msg(TOPIC, seq=info.state.first_seq))
        last_ms = _ms(await js.get_msg(TOPIC, seq=max(info.state.first_seq, info.state.last_seq - QUEUES + 1)))
        return {"per_queue": per_queue, "last_seq": info.state.last_seq, "first_ms": first_ms, "last_ms": last_ms,
                "seconds": time.monotonic() - started}
    finally:
        await nc.close()


def preload(target: str, count: int) -> dict[str, Any]:
    """A fresh stream with ``count`` messages (whole queues), published async in 1024s, not timed."""
    asyncio.run(create_stream(target))
    return asyncio.run(_preload(target, count))
