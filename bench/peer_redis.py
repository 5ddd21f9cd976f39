"""Redis Streams clients of the peer harness (redis-py asyncio with hiredis), and its preload.

The workload maps onto Redis as it does onto mqstore: the topic's 8 queues are 8 streams
``TopicTest:0`` .. ``TopicTest:7`` written round robin, each entry a 1 KiB random body with the
fields UNIQ_KEY (32 hex digits, unique) and CLUSTER; the entry id is the message id (get by id is
``XRANGE s id id``), and ids start with the store time in ms (offset by time is ``XRANGE s <ms> + COUNT 1``).
Every reply is checked: an XADD's id, an XRANGE's entry count and body size.

The throughput paths (pipelined XADD, XRANGE of 1024) talk RESP over a plain asyncio connection with
hiredis (the C parser redis[hiredis] brings): commands packed before the clock starts, replies parsed
in C and checked, no per-entry Python objects, as the mqstore clients send pre-serialised requests and
decode only what they check. Without that the figure is redis-py's Python, not the server's. The
one-at-a-time calls (latency, gets, by time) use redis-py's asyncio client.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import hiredis
import redis
import redis.asyncio as aioredis

from bench.peer_runner import Job, Tally
from bench.workload import BODY_SIZE, CLUSTER, QUEUES, TOPIC, Workload

POOL = 8192
_pack: Any = hiredis.pack_command  # its stub types the command as a 1-tuple
CHECK_EVERY = 64


def stream(queue_id: int) -> str:
    return f"{TOPIC}:{queue_id}"


def _fields(workload: Workload, i: int) -> Any:
    return {"body": workload.body(i), "UNIQ_KEY": workload.uniq_key(i), "CLUSTER": CLUSTER}


def _host_port(target: str) -> tuple[str, int]:
    host, _, port = target.rpartition(":")
    return host, int(port)


class RawConnection:
    """One RESP connection: write packed commands, read their replies with hiredis (errors come back
    as ``hiredis.ReplyError`` objects, not raised)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.parser = hiredis.Reader()

    @classmethod
    async def open(cls, target: str) -> RawConnection:
        host, port = _host_port(target)
        reader, writer = await asyncio.open_connection(host, port, limit=64 * 1024 * 1024)
        return cls(reader, writer)

    async def call(self, payload: bytes, replies: int) -> list[Any]:
        self.writer.write(payload)
        out: list[Any] = []
        gets, feed, read = self.parser.gets, self.parser.feed, self.reader.read
        while len(out) < replies:
            reply = gets()
            if reply is False:
                data = await read(1 << 20)
                if not data:
                    raise ConnectionError("redis closed the connection")
                feed(data)
                continue
            out.append(reply)
        return out

    async def close(self) -> None:
        self.writer.close()
        await self.writer.wait_closed()


def packed_pipelines(proc: int, batch: int, pool: int = 16_384) -> list[bytes]:
    """XADD pipelines of ``batch`` commands, packed: ``pool`` distinct messages per process."""
    workload = Workload.fresh(POOL)
    first = proc * pool
    return [b"".join(_pack(("XADD", stream(i % QUEUES), "*", "body", workload.body(i),
                                           "UNIQ_KEY", workload.uniq_key(i), "CLUSTER", CLUSTER))
                     for i in range(start, start + batch))
            for start in range(first, first + max(pool, batch), batch)]


class RedisSession:
    def __init__(self, job: Job, client: aioredis.Redis) -> None:
        self.job = job
        self.client = client
        self.workload = Workload.fresh(POOL)
        self.counter = job.proc * 1_000_000_000
        self.payloads = packed_pipelines(job.proc, job.batch) if job.op == "xadd-raw" else []

    async def close(self) -> None:
        await self.client.aclose()

    async def worker(self, index: int, deadline_ns: int, tally: Tally) -> None:
        op = self.job.op
        if op == "xadd-raw":
            await self._xadd_raw(index, deadline_ns, tally)
        elif op == "xrange-raw":
            await self._xrange_raw(index, deadline_ns, tally)
        elif op == "xadd":
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

    async def _xadd_raw(self, index: int, deadline_ns: int, tally: Tally) -> None:
        payloads, batch = self.payloads, self.job.batch
        k = index * len(payloads) // max(self.job.concurrency, 1)
        connection = await RawConnection.open(self.job.target)
        clock, now, append = time.perf_counter_ns, time.monotonic_ns, tally.latencies.append
        try:
            while now() < deadline_ns:
                payload = payloads[k % len(payloads)]
                k += 1
                t0 = clock()
                replies = await connection.call(payload, batch)
                append(clock() - t0)
                ok = sum(1 for r in replies if isinstance(r, bytes))
                tally.ok += ok
                if ok != batch:
                    bad = next(r for r in replies if not isinstance(r, bytes))
                    tally.error(RuntimeError(repr(bad)), batch - ok)
        finally:
            await connection.close()

    async def _xrange_raw(self, index: int, deadline_ns: int, tally: Tally) -> None:
        """As _xrange, on a raw connection: the reply is parsed by hiredis into lists of bytes."""
        job = self.job
        consumer = job.proc * job.concurrency + index
        key = stream(consumer % QUEUES)
        start_ids: list[str] = list(job.data[0][consumer % QUEUES])
        begin: bytes = (random.Random(consumer).choice(start_ids) if start_ids else "-").encode()
        count = str(job.batch).encode()
        connection = await RawConnection.open(job.target)
        clock, now, append = time.perf_counter_ns, time.monotonic_ns, tally.latencies.append
        calls = 0
        try:
            while now() < deadline_ns:
                t0 = clock()
                (entries,) = await connection.call(_pack(
                    (b"XRANGE", key, begin, b"+", b"COUNT", count)), 1)
                append(clock() - t0)
                calls += 1
                if not isinstance(entries, list):
                    tally.error(RuntimeError(repr(entries)))
                    continue
                if not entries:
                    begin = b"-"
                    continue
                if calls % CHECK_EVERY == 1:
                    for _, fields in entries:
                        if len(fields[fields.index(b"body") + 1]) != BODY_SIZE:
                            raise RuntimeError(f"{key}: an entry without a {BODY_SIZE} B body")
                tally.ok += len(entries)
                begin = b"(" + entries[-1][0]
        finally:
            await connection.close()

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
