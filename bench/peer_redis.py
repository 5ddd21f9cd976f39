"""Redis Streams clients of the peer harness (redis-py asyncio with hiredis), and its preload.

The workload maps onto Redis as it does onto mqstore: the topic's 8 queues are 8 streams
``TopicTest:0`` .. ``TopicTest:7`` written round robin, each entry a 1 KiB random body with the
fields UNIQ_KEY (32 hex digits, unique) and CLUSTER; the entry id is the message id (get by id is
``XRANGE s id id``), and ids start with the store time in ms (offset by time is ``XRANGE s <ms> + COUNT 1``).
Every reply is checked: an XADD's id, an XRANGE's entry count and body size.
"""

from __future__ import annotations

import random
import time
from typing import Any

import redis
import redis.asyncio as aioredis

from bench.peer_runner import Job, Tally
from bench.workload import BODY_SIZE, CLUSTER, QUEUES, TOPIC, Workload

POOL = 8192
CHECK_EVERY = 64


def stream(queue_id: int) -> str:
    return f"{TOPIC}:{queue_id}"


def _fields(workload: Workload, i: int) -> Any:
    return {"body": workload.body(i), "UNIQ_KEY": workload.uniq_key(i), "CLUSTER": CLUSTER}


def _host_port(target: str) -> tuple[str, int]:
    host, _, port = target.rpartition(":")
    return host, int(port)


class RedisSession:
    def __init__(self, job: Job, client: aioredis.Redis) -> None:
        self.job = job
        self.client = client
        self.workload = Workload.fresh(POOL)
        self.counter = job.proc * 1_000_000_000

    async def close(self) -> None:
        await self.client.aclose()

    async def worker(self, index: int, deadline_ns: int, tally: Tally) -> None:
        op = self.job.op
        if op == "xadd":
            await self._xadd(deadline_ns, tally)
        elif op == "xrange":
            await self._xrange(index, deadline_ns, tally)
        elif op == "get":
            await self._get(index, deadline_ns, tally)
        elif op == "time":
            await self._time(index, deadline_ns, tally)
        else:
            raise ValueError(f"unknown redis op {op!r}")

    async def _xadd(self, deadline_ns: int, tally: Tally) -> None:
        """XADD one at a time (batch 1) or ``batch`` per pipeline (no MULTI)."""
        client, workload, batch = self.client, self.workload, self.job.batch
        clock, now, append = time.perf_counter_ns, time.monotonic_ns, tally.latencies.append
        while now() < deadline_ns:
            first = self.counter
            self.counter += batch
            t0 = clock()
            try:
                if batch == 1:
                    ids = [await client.xadd(stream(first % QUEUES), _fields(workload, first))]
                else:
                    pipe = client.pipeline(transaction=False)
                    for i in range(first, first + batch):
                        pipe.xadd(stream(i % QUEUES), _fields(workload, i))
                    ids = await pipe.execute(raise_on_error=False)
            except redis.RedisError as exc:
                tally.error(exc, batch)
                continue
            append(clock() - t0)
            ok = sum(1 for i in ids if isinstance(i, bytes | str))
            tally.ok += ok
            if ok != batch:
                tally.failed += batch - ok
                bad = next(i for i in ids if not isinstance(i, bytes | str))
                tally.error(bad if isinstance(bad, BaseException) else RuntimeError(repr(bad)), 0)

    async def _xrange(self, index: int, deadline_ns: int, tally: Tally) -> None:
        """Read a stream from a random entry on, ``batch`` entries per XRANGE, wrapping at its end."""
        job = self.job
        consumer = job.proc * job.concurrency + index
        key = stream(consumer % QUEUES)
        start_ids: list[str] = list(job.data[0][consumer % QUEUES])  # sample ids of this stream
        begin = random.Random(consumer).choice(start_ids) if start_ids else "-"
        client, count = self.client, job.batch
        clock, now, append = time.perf_counter_ns, time.monotonic_ns, tally.latencies.append
        calls = 0
        while now() < deadline_ns:
            t0 = clock()
            try:
                entries: Any = await client.xrange(key, min=begin, max="+", count=count)
            except redis.RedisError as exc:
                tally.error(exc)
                continue
            append(clock() - t0)
            calls += 1
            if not entries:
                begin = "-"
                continue
            if calls % CHECK_EVERY == 1 and any(len(fields[b"body"]) != BODY_SIZE for _, fields in entries):
                raise RuntimeError(f"{key}: an entry without a {BODY_SIZE} B body")
            tally.ok += len(entries)
            last = entries[-1][0]
            begin = "(" + (last.decode() if isinstance(last, bytes) else last)

    async def _get(self, index: int, deadline_ns: int, tally: Tally) -> None:
        ids: list[tuple[int, str]] = list(self.job.data[0])
        rng = random.Random(self.job.proc * 1000 + index)
        client = self.client
        clock, now, append = time.perf_counter_ns, time.monotonic_ns, tally.latencies.append
        while now() < deadline_ns:
            queue_id, entry_id = ids[rng.randrange(len(ids))]
            t0 = clock()
            try:
                entries: Any = await client.xrange(stream(queue_id), min=entry_id, max=entry_id)
            except redis.RedisError as exc:
                tally.error(exc)
                continue
            append(clock() - t0)
            if len(entries) == 1 and len(entries[0][1][b"body"]) == BODY_SIZE:
                tally.ok += 1
            else:
                tally.error(RuntimeError(f"{entry_id}: {len(entries)} entries"))

    async def _time(self, index: int, deadline_ns: int, tally: Tally) -> None:
        first_ms, last_ms = self.job.data[0]
        rng = random.Random(self.job.proc * 1000 + index)
        client = self.client
        clock, now, append = time.perf_counter_ns, time.monotonic_ns, tally.latencies.append
        while now() < deadline_ns:
            queue_id, ms = rng.randrange(QUEUES), rng.randint(first_ms, last_ms)
            t0 = clock()
            try:
                entries: Any = await client.xrange(stream(queue_id), min=str(ms), max="+", count=1)
            except redis.RedisError as exc:
                tally.error(exc)
                continue
            append(clock() - t0)
            if len(entries) == 1:
                tally.ok += 1
            else:
                tally.error(RuntimeError(f"{stream(queue_id)} at {ms} ms: nothing at or after"))


async def prepare(job: Job) -> RedisSession:
    host, port = _host_port(job.target)
    client = aioredis.Redis(host=host, port=port, decode_responses=False, socket_timeout=60)
    if not await client.ping():
        raise RuntimeError(f"redis at {job.target} does not answer PING")
    return RedisSession(job, client)


def preload(target: str, count: int, pipeline: int = 1024) -> dict[str, Any]:
    """``count`` entries (rounded down to whole queues) in the 8 streams, pipelined, not timed. Returns
    sample ids per stream (every 97th), (queue, id) pairs for gets, and the first and last ms."""
    host, port = _host_port(target)
    client = redis.Redis(host=host, port=port, socket_timeout=120)
    workload = Workload.fresh(POOL)
    per_queue = max(1, count // QUEUES)
    samples: list[list[str]] = [[] for _ in range(QUEUES)]
    started = time.monotonic()
    first_ms = int(time.time() * 1000)
    total = per_queue * QUEUES
    for start in range(0, total, pipeline):
        pipe = client.pipeline(transaction=False)
        for i in range(start, min(total, start + pipeline)):
            pipe.xadd(stream(i % QUEUES), _fields(workload, i))
        for k, entry_id in enumerate(pipe.execute(), start=start):
            if not isinstance(entry_id, bytes):
                raise RuntimeError(f"preload: XADD answered {entry_id!r}")
            if k % 97 == 0:
                samples[k % QUEUES].append(entry_id.decode())
    lengths = [int(client.xlen(stream(q))) for q in range(QUEUES)]
    # Offset by time asks within the stored times: up to the earliest of the streams' last entries.
    last: Any = [client.xrevrange(stream(q), count=1) for q in range(QUEUES)]
    last_ms = min(int(entries[0][0].split(b"-")[0]) for entries in last)
    first_ms = min(first_ms, last_ms)
    client.close()
    if lengths != [per_queue] * QUEUES:
        raise RuntimeError(f"preload: the streams hold {lengths}, expected {per_queue} each")
    return {"samples": samples, "ids": [(q, i) for q, ids in enumerate(samples) for i in ids],
            "first_ms": first_ms, "last_ms": last_ms, "seconds": time.monotonic() - started, "per_queue": per_queue}


def flush(target: str) -> None:
    """Empty the server between cases (FLUSHALL SYNC)."""
    host, port = _host_port(target)
    with redis.Redis(host=host, port=port, socket_timeout=120) as client:
        client.flushall()
