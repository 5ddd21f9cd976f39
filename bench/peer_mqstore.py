"""mqstore's read-side clients of the peer harness (through the gateway, grpc.aio), and their preloads.

The produce rows reuse bench/gateway.py's cases as they are (SendBatch, SendStream, Send, SYNC_FLUSH);
this module adds what the peer table needs beyond them, all through the gateway's public API:

* ``pull``: Pull of ``batch`` (1024) messages from a random offset of a queue, wrapping at its end.
  When the generated code has ``PullMessageRequest.raw_records`` the pull asks for the stored record
  bytes (``PullMessageResponse.records`` + ``record_count``), reads them with the client library's lazy
  view (``PulledRecords``, as hiredis parses XRANGE's entries) and checks their count and each body's
  size (which checks its CRC); otherwise
  it decodes the answer's header only (as bench/gateway.py's ``pull raw``), every 64th in full.
* ``get``: GetMessage by an offset msg id of the preloaded messages (kind OFFSET), body size checked.
* ``key``: QueryByKey of a random key of the ~1M keys indexed (bench/query.py's key layout).
* ``time``: SearchOffset of a random queue at a random time of the preload, offset in range checked.
* ``blob`` / ``blob-stream``: SendBatch, or SendBatchStream, of ``batch`` messages as one bytes blob in
  RocketMQ's batch encoding (``SendBatchRequest.encoded_messages``), when the generated code has it;
  each answer's receipt (or per-message results) is checked, and the caller checks afterwards that the
  topic's queues hold what was acknowledged.
"""

from __future__ import annotations

import itertools
import random
import time
from collections import deque
from typing import Any

import grpc

from bench.gateway import (
    CHANNEL_OPTIONS,
    PULL_TOPIC,
    PUT_OK,
    SERVICE,
    PullHeader,
    create_topic,
    wait_dispatched,
)
from bench.peer_runner import Job, Tally, windowed_stream
from bench.query import KEY_BODY, KEY_TOPIC, KEYS_PER_MESSAGE, key_of
from bench.workload import BODY_SIZE, BORN_HOST, CLUSTER, QUEUES, RECORD_SIZE, TOPIC, Workload
from mqstore.client.record_view import PulledRecords
from mqstore.v1 import common_pb2, gateway_pb2, query_pb2

MIB = 1024 * 1024
REQUEST_POOL = 4096
CHECK_EVERY = 64
FOUND = query_pb2.GET_MESSAGE_STATUS_FOUND


def raw_pull_available() -> bool:
    """Whether this checkout's Pull can answer stored record bytes (PullMessageRequest.raw_records)."""
    request_fields = query_pb2.PullMessageRequest.DESCRIPTOR.fields_by_name
    response_fields = query_pb2.PullMessageResponse.DESCRIPTOR.fields_by_name
    return "raw_records" in request_fields and "records" in response_fields and "record_count" in response_fields


def blob_available() -> bool:
    """Whether SendBatch takes a blob in RocketMQ's batch encoding (and answers a receipt)."""
    return ("encoded_messages" in gateway_pb2.SendBatchRequest.DESCRIPTOR.fields_by_name
            and "receipt" in gateway_pb2.SendBatchResponse.DESCRIPTOR.fields_by_name)


def batch_stream_available() -> bool:
    return blob_available() and "SendBatchStream" in gateway_pb2.DESCRIPTOR.services_by_name[
        "MessagingService"].methods_by_name


def blob_requests(proc: int, batch: int, pool: int = 16_384) -> list[bytes]:
    """Serialised blob SendBatchRequests of ``batch`` messages each (the workload's bodies, UNIQ_KEY, CLUSTER)."""
    from services.store.rules.batch_codec import encode_blob

    workload = Workload.fresh(min(pool, 8192))
    first = proc * pool
    requests = []
    for start in range(first, first + max(pool, batch), batch):
        blob = encode_blob((workload.body(i), 0, {"UNIQ_KEY": workload.uniq_key(i), "CLUSTER": CLUSTER})
                           for i in range(start, start + batch))
        request: Any = gateway_pb2.SendBatchRequest(topic=TOPIC)
        request.encoded_messages = blob
        request.born_timestamp = workload.born_timestamp
        request.born_host = BORN_HOST
        requests.append(request.SerializeToString())
    return requests


def count_acked(answer: bytes, batch: int, tally: Tally) -> None:
    """A blob SendBatch answer: its receipt, or one result per message (not stored alike)."""
    response: Any = gateway_pb2.SendBatchResponse.FromString(answer)
    if response.HasField("receipt"):
        if response.receipt.status == PUT_OK and len(response.receipt.commitlog_offsets) == batch:
            tally.ok += batch
        else:
            tally.error(RuntimeError(f"receipt status {response.receipt.status}, "
                                     f"{len(response.receipt.commitlog_offsets)} offsets"), batch)
        return
    ok = sum(1 for r in response.results if r.status == PUT_OK)
    tally.ok += ok
    if ok != batch:
        tally.error(RuntimeError(f"{batch - ok} of {batch} not PUT_OK"), batch - ok)


def pull_mode() -> str:
    if raw_pull_available():
        return "Pull 1024, raw_records read by mqstore_client's lazy view"
    return "Pull 1024, decoded (header only)"


class MqstoreSession:
    def __init__(self, job: Job, channel: grpc.aio.Channel) -> None:
        self.job = job
        self.channel = channel
        self.requests = blob_requests(job.proc, job.batch) if job.op.startswith("blob") else []

    async def close(self) -> None:
        await self.channel.close(None)

    async def worker(self, index: int, deadline_ns: int, tally: Tally) -> None:
        op = self.job.op
        if op == "pull":
            await self._pull(index, deadline_ns, tally)
        elif op == "blob":
            await self._blob(index, deadline_ns, tally)
        elif op == "blob-stream":
            await self._blob_stream(index, deadline_ns, tally)
        elif op in ("get", "key", "time"):
            await self._lookup(op, index, deadline_ns, tally)
        else:
            raise ValueError(f"unknown mqstore op {op!r}")

    async def _blob(self, index: int, deadline_ns: int, tally: Tally) -> None:
        requests, batch = self.requests, self.job.batch
        call = self.channel.unary_unary(f"/{SERVICE}/SendBatch", request_serializer=None, response_deserializer=None)
        k = index * len(requests) // max(self.job.concurrency, 1)
        clock, now, append = time.perf_counter_ns, time.monotonic_ns, tally.latencies.append
        while now() < deadline_ns:
            request = requests[k % len(requests)]
            k += 1
            t0 = clock()
            try:
                answer = await call(request, timeout=60)
            except grpc.aio.AioRpcError as exc:
                tally.error(exc, batch)
                continue
            append(clock() - t0)
            count_acked(answer, batch, tally)

    async def _blob_stream(self, index: int, deadline_ns: int, tally: Tally) -> None:
        """One SendBatchStream, at most ``data[0]`` batches unanswered; latency per batch, send to answer."""
        requests, batch = self.requests, self.job.batch
        call = self.channel.stream_stream(f"/{SERVICE}/SendBatchStream", request_serializer=None,
                                          response_deserializer=None)(None, timeout=self.job.duration_s + 120)
        frames = itertools.islice(itertools.cycle(requests), index * len(requests) // max(self.job.concurrency, 1),
                                  None)
        await windowed_stream(call, frames.__next__, int(self.job.data[0]), deadline_ns, tally,
                              lambda answer: count_acked(answer, batch, tally), batch)

    async def _pull(self, index: int, deadline_ns: int, tally: Tally) -> None:
        job = self.job
        consumer = job.proc * job.concurrency + index
        queue_id, depth = consumer % QUEUES, int(job.data[0])
        offset = random.Random(consumer).randrange(depth)
        raw = raw_pull_available()
        call = self.channel.unary_unary(f"/{SERVICE}/Pull", request_serializer=None, response_deserializer=None)
        max_bytes = min(32 * MIB, max(4 * MIB, job.batch * RECORD_SIZE * 2))
        header, full = PullHeader.FromString, query_pb2.PullMessageResponse.FromString
        clock, now, append = time.perf_counter_ns, time.monotonic_ns, tally.latencies.append
        calls = 0
        while now() < deadline_ns:
            request = query_pb2.PullMessageRequest(topic=PULL_TOPIC, queue_id=queue_id, queue_offset=offset,
                                                   max_messages=job.batch, max_bytes=max_bytes)
            if raw:
                request.raw_records = True
            t0 = clock()
            try:
                answer = await call(request.SerializeToString(), timeout=60)
            except grpc.aio.AioRpcError as exc:
                tally.error(exc, 0)
                continue
            append(clock() - t0)
            calls += 1
            if raw:
                response: Any = full(answer)
                status, next_offset = response.status, response.next_begin_offset
                got = next_offset - offset
                # Read by the client library's lazy view, as a consumer that checks each body's length
                # would (each body CRC-checked when read), as hiredis parses XRANGE's entries.
                pulled = PulledRecords(response.records, queue_id) if status == FOUND else ()
                if status == FOUND and (len(pulled) != got or any(len(m.body) != BODY_SIZE for m in pulled)):
                    raise RuntimeError(f"queue {queue_id} at {offset}: {len(pulled)} records in "
                                       f"{len(response.records)} B, the next offset says {got}")
            else:
                head: Any = header(answer)
                status, next_offset = head.status, head.next_begin_offset
                got = next_offset - offset
                if calls % CHECK_EVERY == 1 and status == FOUND:
                    response = full(answer)
                    if len(response.messages) != got or any(len(m.body) != BODY_SIZE for m in response.messages):
                        raise RuntimeError(f"queue {queue_id} at {offset}: {len(response.messages)} messages, "
                                           f"the next offset says {got}")
            if status != FOUND or got <= 0:
                offset = 0
                continue
            tally.ok += got
            offset = next_offset if next_offset < depth else 0

    def _requests(self, op: str, rng: random.Random) -> list[bytes]:
        data = self.job.data
        if op == "get":
            ids: list[str] = list(data[0])
            return [query_pb2.ViewMessageRequest(msg_id=rng.choice(ids), kind=query_pb2.MESSAGE_ID_KIND_OFFSET)
                    .SerializeToString() for _ in range(REQUEST_POOL)]
        if op == "key":
            messages = int(data[0])
            return [query_pb2.QueryMessageRequest(topic=KEY_TOPIC, key=key_of(rng.randrange(messages),
                                                                              rng.randrange(KEYS_PER_MESSAGE)),
                                                  max_num=32).SerializeToString() for _ in range(REQUEST_POOL)]
        first_ms, last_ms = data[0]
        return [query_pb2.SearchOffsetRequest(topic=PULL_TOPIC, queue_id=rng.randrange(QUEUES),
                                              timestamp=rng.randint(first_ms, last_ms)).SerializeToString()
                for _ in range(REQUEST_POOL)]

    async def _lookup(self, op: str, index: int, deadline_ns: int, tally: Tally) -> None:
        job = self.job
        rng = random.Random(job.proc * 1000 + index)
        requests = self._requests(op, rng)
        method, parse = {"get": ("GetMessage", query_pb2.ViewMessageResponse.FromString),
                         "key": ("QueryByKey", query_pb2.QueryMessageResponse.FromString),
                         "time": ("SearchOffset", query_pb2.SearchOffsetResponse.FromString)}[op]
        call = self.channel.unary_unary(f"/{SERVICE}/{method}", request_serializer=None, response_deserializer=None)
        depth = int(job.data[1]) if op == "time" else 0
        clock, now, append = time.perf_counter_ns, time.monotonic_ns, tally.latencies.append
        k = 0
        while now() < deadline_ns:
            request = requests[k % REQUEST_POOL]
            k += 1
            t0 = clock()
            try:
                answer = await call(request, timeout=60)
            except grpc.aio.AioRpcError as exc:
                tally.error(exc)
                continue
            append(clock() - t0)
            response: Any = parse(answer)
            if op == "get":
                good = len(response.message.body) == BODY_SIZE
            elif op == "key":
                good = len(response.messages) >= 1 and len(response.messages[0].body) == len(KEY_BODY)
            else:
                good = 0 <= response.offset <= depth
            if good:
                tally.ok += 1
            else:
                tally.error(RuntimeError(f"{method}: unexpected answer {str(response)[:200]!r}"))


async def prepare(job: Job) -> MqstoreSession:
    channel = grpc.aio.insecure_channel(job.target, options=CHANNEL_OPTIONS)
    await channel.channel_ready()
    return MqstoreSession(job, channel)


def sample_pulled(target: str, per_queue: int, rng: random.Random, every: int = 7) -> dict[str, Any]:
    """Offset msg ids and the store time range of PULL_TOPIC's preloaded messages (from a few decoded pulls)."""
    ids: list[str] = []
    times: list[int] = []
    with grpc.insecure_channel(target, options=CHANNEL_OPTIONS) as channel:
        pull = channel.unary_unary(f"/{SERVICE}/Pull",
                                   request_serializer=query_pb2.PullMessageRequest.SerializeToString,
                                   response_deserializer=query_pb2.PullMessageResponse.FromString)
        for queue_id in range(QUEUES):
            for offset in {0, max(0, per_queue - 256), rng.randrange(per_queue)}:
                response = pull(query_pb2.PullMessageRequest(topic=PULL_TOPIC, queue_id=queue_id, queue_offset=offset,
                                                             max_messages=256, max_bytes=8 * MIB), timeout=60)
                for i, message in enumerate(response.messages):
                    times.append(message.store_timestamp)
                    if i % every == 0:
                        ids.append(message.msg_id)
    if not ids:
        raise RuntimeError(f"no messages pulled from {PULL_TOPIC}")
    return {"ids": ids, "first_ms": min(times), "last_ms": max(times)}


def preload_keys(target: str, messages: int) -> float:
    """``messages`` on KEY_TOPIC with 3 KEYS each (bench/query.py's layout), SendBatch of 1024 with a
    few in flight, then wait until dispatched; returns the seconds it took (untimed set-up)."""
    create_topic(target, KEY_TOPIC)
    workload = Workload.fresh(64)
    started = time.monotonic()
    with grpc.insecure_channel(target, options=CHANNEL_OPTIONS) as channel:
        call = channel.unary_unary(f"/{SERVICE}/SendBatch", request_serializer=None, response_deserializer=None)
        in_flight: deque[tuple[Any, int]] = deque()
        for start in range(0, messages, 1024):
            end = min(messages, start + 1024)
            request = gateway_pb2.SendBatchRequest(messages=[common_pb2.Message(
                topic=KEY_TOPIC, body=KEY_BODY, born_timestamp=workload.born_timestamp, born_host="127.0.0.1:50000",
                properties={"KEYS": " ".join(key_of(i, k) for k in range(KEYS_PER_MESSAGE)),
                            "UNIQ_KEY": workload.uniq_key(i), "CLUSTER": CLUSTER}) for i in range(start, end)])
            in_flight.append((call.future(request.SerializeToString(), timeout=120), end - start))
            while len(in_flight) >= 4:
                _check_batch(*in_flight.popleft())
        while in_flight:
            _check_batch(*in_flight.popleft())
    wait_dispatched(target, KEY_TOPIC, messages, messages, timeout_s=600)
    return time.monotonic() - started


def _check_batch(future: Any, size: int) -> None:
    results = gateway_pb2.SendBatchResponse.FromString(future.result()).results
    if len(results) != size or any(r.status != PUT_OK for r in results):
        raise RuntimeError(f"key preload: a batch of {size} came back with {[r.status for r in results][:5]}")
