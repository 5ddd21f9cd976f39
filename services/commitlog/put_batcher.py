"""Group many concurrent producers' puts into few engine calls, for asyncio servers and clients.

Each producer awaits its own result; the batcher appends everything that has arrived in one hold of
the put lock (in a worker thread, so the event loop keeps accepting) and, under SYNC_FLUSH, the
engine's group commit acknowledges the whole batch with one fdatasync. While one batch is being
flushed the next one gathers, so producers never queue behind a flush one by one. Coroutines make
this cheap: waking an OS thread per acknowledgement costs more than the append itself in CPython.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Protocol

from services.commitlog.put_result import PutMessageResult
from services.store.errors import StoreError, UnavailableError
from services.store.formats.message import Message

_Waiter = tuple[Message, "asyncio.Future[PutMessageResult]"]


class PutEach(Protocol):
    """What the batcher needs of the engine (the CommitLog, or a wrapper that meters it)."""

    def put_each(self, messages: Sequence[Message]) -> list[PutMessageResult | StoreError]: ...


class PutBatcher:
    def __init__(self, commit_log: PutEach, max_batch: int = 256, max_in_flight: int = 2) -> None:
        self._log = commit_log
        self._max_batch = max_batch
        self._slots = asyncio.Semaphore(max_in_flight)
        self._pending: list[_Waiter] = []
        self._arrived = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="put-batcher")

    async def close(self) -> None:
        self._closed = True
        self._arrived.set()
        if self._task is not None:
            await self._task
        for _, future in self._pending:
            if not future.done():
                future.set_exception(UnavailableError("the commitlog service is stopping"))
        self._pending.clear()

    async def put(self, message: Message) -> PutMessageResult:
        """Append one message; raises the StoreError that rejected it. (One future, no gather: this
        is the per-message path of every unary Append.)"""
        if self._closed:
            raise UnavailableError("the commitlog service is stopping")
        future: asyncio.Future[PutMessageResult] = asyncio.get_running_loop().create_future()
        self._pending.append((message, future))
        self._arrived.set()
        return await future

    async def put_many(self, messages: Sequence[Message]) -> list[PutMessageResult]:
        if self._closed:
            raise UnavailableError("the commitlog service is stopping")
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in messages]
        self._pending.extend(zip(messages, futures, strict=True))
        self._arrived.set()
        return list(await asyncio.gather(*futures))

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        in_flight: set[asyncio.Task[None]] = set()
        while not (self._closed and not self._pending):
            await self._arrived.wait()
            self._arrived.clear()
            while self._pending:
                await self._slots.acquire()
                batch, self._pending = self._pending[:self._max_batch], self._pending[self._max_batch:]
                task = loop.create_task(self._append(batch))
                in_flight.add(task)
                task.add_done_callback(in_flight.discard)
        if in_flight:
            await asyncio.gather(*in_flight)

    async def _append(self, batch: list[_Waiter]) -> None:
        try:
            outcomes = await asyncio.to_thread(self._log.put_each, [m for m, _ in batch])
        except StoreError as exc:
            outcomes = [exc] * len(batch)
        except Exception as exc:  # never leave a producer waiting forever
            outcomes = [StoreError(f"append failed: {exc}")] * len(batch)
        finally:
            self._slots.release()
        for (_, future), outcome in zip(batch, outcomes, strict=True):
            if future.done():
                continue
            if isinstance(outcome, StoreError):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)
