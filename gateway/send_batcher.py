"""Concurrent single-message Sends to one shard, forwarded as few AppendBatch calls.

A unary gRPC call costs each Python process hundreds of microseconds, far more than appending one
message; 64 producers each calling Send would otherwise cost 64 calls from the gateway to the
commitlog per round. The batcher sends whatever has arrived as one AppendBatch (at most two in
flight, so one gathers while the other is being flushed: under SYNC_FLUSH the whole batch shares
one fdatasync). A batch is all or nothing at the commitlog, so a message it refuses (named by its
position in the status's detail, services/server/status.py) gets that error alone and the others are
sent again at once: nothing was written, no duplicate can result. Tracing: each Send has a
``gateway.batched_append`` span for its wait; the AppendBatch call (and the commitlog's spans) join
the trace of the batch's first Send.
"""

from __future__ import annotations

import asyncio
import contextvars

import grpc

from gateway.resilience import BackendError
from gateway.shard import ShardClient
from mqstore.v1 import commitlog_pb2
from services.server import tracing
from services.store.rules.batch_codec import MAX_BATCH_MESSAGES

_Waiter = tuple[bytes, "asyncio.Future[commitlog_pb2.AppendResult]", contextvars.Context]


class SendBatcher:
    def __init__(self, shard: ShardClient, timeout_s: float, max_in_flight: int = 2) -> None:
        self._shard = shard
        self._timeout_s = timeout_s
        self._slots = asyncio.Semaphore(max_in_flight)
        self._pending: list[_Waiter] = []
        self._arrived = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def send(self, entry: bytes) -> commitlog_pb2.AppendResult:
        """``entry``: one serialised field-1 entry of an AppendBatchRequest (a SendRequest without its
        routing fields). Raises the BackendError that refused it."""
        loop = asyncio.get_running_loop()
        if self._task is None:
            # An empty context: the loop serves every producer, it belongs to no request's trace.
            self._task = loop.create_task(self._run(), name=f"send-batcher-{self._shard.name}",
                                          context=contextvars.Context())
        future: asyncio.Future[commitlog_pb2.AppendResult] = loop.create_future()
        self._pending.append((entry, future, contextvars.copy_context()))
        self._arrived.set()
        with tracing.child_span("gateway.batched_append", shard=self._shard.name):
            return await future

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        for _, future, _ in self._pending:
            if not future.done():
                future.set_exception(BackendError(grpc.StatusCode.UNAVAILABLE, "the gateway is stopping"))

    async def _run(self) -> None:
        while True:
            await self._arrived.wait()
            self._arrived.clear()
            while self._pending:
                await self._slots.acquire()
                batch, self._pending = self._pending[:MAX_BATCH_MESSAGES], self._pending[MAX_BATCH_MESSAGES:]
                # The AppendBatch call joins the trace of the batch's first Send.
                asyncio.get_running_loop().create_task(self._flush(batch), context=batch[0][2])

    async def _flush(self, batch: list[_Waiter]) -> None:
        try:
            await self._flush_batch(batch)
        except Exception as exc:  # noqa: BLE001 - whatever went wrong, no producer may wait forever
            for _, future, _ in batch:
                if not future.done():
                    future.set_exception(exc)
        finally:
            self._slots.release()

    async def _flush_batch(self, batch: list[_Waiter]) -> None:
        while batch:
            batch = [waiter for waiter in batch if not waiter[1].done()]  # callers gone
            if not batch:
                return
            try:
                response = await self._append(b"".join([waiter[0] for waiter in batch]))
            except BackendError as exc:
                refused = exc.refused if len(batch) > 1 else None
                if exc.code != grpc.StatusCode.INVALID_ARGUMENT or refused is None or \
                        not 0 <= refused.index < len(batch):
                    for _, future, _ in batch:
                        if not future.done():
                            future.set_exception(exc)
                    return
                bad = batch.pop(refused.index)[1]
                if not bad.done():
                    # The producer sent one message: its error names no batch position.
                    bad.set_exception(BackendError(exc.code, refused.error))
                continue
            for (_, future, _), result in zip(batch, response.results, strict=True):
                if not future.done():
                    future.set_result(result)
            return

    async def _append(self, data: bytes) -> commitlog_pb2.AppendBatchResponse:
        # No retry here: each Send is retried on its own by the servicer's policy (it may pick another shard).
        return await self._shard.on_commitlog(self._shard.append_batch_bytes, data, self._timeout_s)
