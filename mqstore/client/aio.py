"""asyncio versions of Producer and PullConsumer, on grpc.aio.

Same behaviour and bookkeeping as the sync classes (they share the request builders and
:class:`OffsetTracker`); only the waiting differs: a long poll is one task per queue, and the first
that brings messages cancels the others.

    async with AsyncProducer() as producer:
        receipt = await producer.send("orders", b"hello")
    async with AsyncPullConsumer("billing", "orders") as consumer:
        async for message in consumer:
            ...
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, Self

import grpc

from mqstore.client import tracing
from mqstore.client.connection import (
    CHANNEL_OPTIONS,
    DEFAULT_TIMEOUT_S,
    Tls,
    auth_metadata,
    resolve_address,
    resolve_tls,
    resolve_token,
)
from mqstore.client.consumer import (
    DEFAULT_BATCH,
    DEFAULT_COMMIT_INTERVAL_S,
    DEFAULT_LONG_POLL_MS,
    PULL_MARGIN_S,
    MissingTopics,
    OffsetTracker,
    PullOptions,
    max_long_poll_of,
)
from mqstore.client.errors import MqstoreError, NotFoundError, PermissionDeniedError, from_rpc_error
from mqstore.client.models import Keys, Message, OutgoingMessage, SendReceipt, TopicRoute
from mqstore.client.producer import Item, batch_chunks, batch_receipts, batch_request, stream_request
from mqstore.client.retry import RETRY_ROUTE_RECHECK_S, SendBackReceipt, as_original, retry_topic, send_back_request
from mqstore.v1 import gateway_pb2, gateway_pb2_grpc, query_pb2


class AsyncConnection:
    """A grpc.aio channel to the gateway with the token and default deadline of every call."""

    def __init__(self, address: str | None = None, token: str | None = None, *,
                 timeout: float = DEFAULT_TIMEOUT_S, tls: Tls | bool | None = None) -> None:
        self.address = resolve_address(address)
        self.token = resolve_token(token)
        self.timeout = timeout
        self.metadata = auth_metadata(self.token)
        self.tls = resolve_tls(tls)
        options = list(CHANNEL_OPTIONS)
        self.channel = (grpc.aio.insecure_channel(self.address, options=options) if self.tls is None
                        else grpc.aio.secure_channel(self.address, self.tls.credentials(), options=options))
        self.stub = gateway_pb2_grpc.MessagingServiceStub(self.channel)

    async def call(self, method: str, request: Any, timeout: float | None = None,
                   metadata: Sequence[tuple[str, str]] | None = None) -> Any:
        deadline = self.timeout if timeout is None else timeout
        try:
            return await getattr(self.stub, method)(request, timeout=deadline,
                                                    metadata=self.metadata if metadata is None else metadata)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc, self.address, deadline) from None

    async def call_many(self, method: str, requests: Sequence[Any],
                        timeout: float | None = None) -> list[Any | MqstoreError]:
        """Concurrent calls; each answer is the response or that request's error."""
        answers = await asyncio.gather(*(self.call(method, r, timeout) for r in requests), return_exceptions=True)
        for answer in answers:
            if isinstance(answer, BaseException) and not isinstance(answer, MqstoreError):
                raise answer
        return list(answers)

    async def close(self) -> None:
        await self.channel.close(None)


class _AsyncEndpoint:
    def __init__(self, address: str | None, token: str | None, connection: AsyncConnection | None,
                 timeout: float, tls: Tls | bool | None = None) -> None:
        self._owns_connection = connection is None
        self.connection = (connection if connection is not None
                           else AsyncConnection(address, token, timeout=timeout, tls=tls))

    async def close(self) -> None:
        if self._owns_connection:
            await self.connection.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()


class AsyncProducer(_AsyncEndpoint):
    """Producer on asyncio: the same calls, awaited."""

    def __init__(self, address: str | None = None, token: str | None = None, *,
                 connection: AsyncConnection | None = None, timeout: float = DEFAULT_TIMEOUT_S,
                 tls: Tls | bool | None = None) -> None:
        super().__init__(address, token, connection, timeout, tls)

    async def send(self, topic: str, body: bytes | str, *, tags: str | None = None, keys: Keys | None = None,
                   properties: Mapping[str, str] | None = None, sharding_key: str | None = None,
                   queue_id: int | None = None, delay_level: int | None = None,
                   timeout: float | None = None) -> SendReceipt:
        message = OutgoingMessage(body=body, topic=topic, tags=tags, keys=keys, properties=properties,
                                  sharding_key=sharding_key, queue_id=queue_id, delay_level=delay_level)
        return await self.send_message(message, timeout=timeout)

    async def send_message(self, message: OutgoingMessage, *, timeout: float | None = None) -> SendReceipt:
        connection = self.connection
        with tracing.send_span(message.topic, connection.address, tags=message.tags, keys=message.keys) as span:
            request = message.to_request()
            tracing.add_properties(request.message.properties, tracing.message_properties(span))
            receipt = SendReceipt.from_proto(await connection.call("Send", request, timeout,
                                                                   tracing.call_metadata(span, connection.metadata)))
            tracing.sent(span, [receipt.uniq_key])
            return receipt

    async def send_batch(self, topic: str, messages: Iterable[Item], *, tags: str | None = None,
                         keys: Keys | None = None, properties: Mapping[str, str] | None = None,
                         sharding_key: str | None = None, queue_id: int | None = None,
                         timeout: float | None = None) -> list[SendReceipt]:
        """As Producer.send_batch: SendBatch calls of up to 1024 messages, receipts in order."""
        receipts: list[SendReceipt] = []
        connection = self.connection
        with tracing.send_span(topic, connection.address, tags=tags, keys=keys) as span:
            metadata = tracing.call_metadata(span, connection.metadata)
            for chunk in batch_chunks(topic, messages, tags, keys, properties, tracing.message_properties(span),
                                      sharding_key):
                try:
                    response = await connection.call("SendBatch", batch_request(chunk, sharding_key, queue_id),
                                                     timeout, metadata)
                except MqstoreError as exc:
                    exc.receipts = receipts
                    raise
                receipts.extend(batch_receipts(chunk, response))
            tracing.sent(span, [r.uniq_key for r in receipts])
        return receipts

    async def send_stream(self, messages: Iterable[Item] | AsyncIterable[Item], topic: str | None = None, *,
                          tags: str | None = None, keys: Keys | None = None,
                          properties: Mapping[str, str] | None = None, sharding_key: str | None = None,
                          queue_id: int | None = None, timeout: float | None = None) -> AsyncIterator[SendReceipt]:
        """As Producer.send_stream: pipelined on one SendStream, receipts in order."""
        failure: list[BaseException] = []

        async def requests() -> AsyncIterator[Any]:
            try:
                if isinstance(messages, AsyncIterable):
                    async for item in messages:
                        yield stream_request(item, topic, tags, keys, properties, sharding_key, queue_id)
                else:
                    for item in messages:
                        yield stream_request(item, topic, tags, keys, properties, sharding_key, queue_id)
            except Exception as exc:
                failure.append(exc)

        call = self.connection.stub.SendStream(requests(), timeout=timeout, metadata=self.connection.metadata)
        try:
            async for result in call:
                yield SendReceipt.from_proto(result)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc, self.connection.address, timeout) from None
        finally:
            call.cancel()
        if failure:
            raise failure[0]


class AsyncPullConsumer(PullOptions, _AsyncEndpoint):
    """PullConsumer on asyncio (same options and semantics; see :class:`mqstore.client.PullConsumer`)."""

    def __init__(self, group: str | None, topic: str, address: str | None = None, token: str | None = None, *,
                 connection: AsyncConnection | None = None, queue_ids: Sequence[int] | None = None,
                 subscription: str = "*", long_poll_ms: int = DEFAULT_LONG_POLL_MS, batch_size: int = DEFAULT_BATCH,
                 max_bytes: int = 0, auto_commit: bool = True, commit_interval_s: float = DEFAULT_COMMIT_INTERVAL_S,
                 from_latest: bool = False, start_offsets: Mapping[int, int] | None = None,
                 timeout: float | None = None, raw_records: bool = True, retry: bool = True,
                 tls: Tls | bool | None = None) -> None:
        super().__init__(address, token, connection, DEFAULT_TIMEOUT_S, tls)
        self._configure(group, topic, queue_ids, subscription, long_poll_ms, batch_size, max_bytes, auto_commit,
                        commit_interval_s, from_latest, start_offsets, timeout, raw_records)
        self._retry_wanted = retry and group is not None and not topic.startswith(("%RETRY%", "%DLQ%"))
        self._retry_feed: AsyncPullConsumer | None = None
        self._retry_checked_at = float("-inf")
        self._missing = MissingTopics()

    async def start(self) -> OffsetTracker:
        """Reads the route and the starting offsets (poll() does it on first use)."""
        if self._tracker is not None:
            return self._tracker
        call = self.connection.call
        if self._queue_ids is None:
            try:
                route = await call("GetRoute", gateway_pb2.GetRouteRequest(topic=self.topic), self.timeout)
            except NotFoundError as exc:
                self._missing.missing(self.topic, exc)
                raise
            self._missing.found(self.topic)
            self._queue_ids = TopicRoute.from_proto(route).readable_queue_ids
        ids = self._queue_ids
        committed: dict[int, int | None] = {q: None for q in ids}
        if self.group:
            answers = await self.connection.call_many("QueryOffset", [
                query_pb2.QueryConsumerOffsetRequest(consumer_group=self.group, topic=self.topic, queue_id=q)
                for q in ids], self.timeout)
            for q, answer in zip(ids, answers, strict=True):
                if isinstance(answer, MqstoreError) and not isinstance(answer, NotFoundError):
                    raise answer
                committed[q] = None if isinstance(answer, MqstoreError) else answer.offset
        missing = [q for q in ids if q not in self._explicit and committed[q] is None]
        ranges = await self.connection.call_many("GetQueueOffsets", [
            query_pb2.GetQueueOffsetRangeRequest(topic=self.topic, queue_id=q) for q in missing], self.timeout)
        edges: dict[int, int] = {}
        for q, answer in zip(missing, ranges, strict=True):
            if isinstance(answer, MqstoreError):
                raise answer
            edges[q] = answer.max_offset if self.from_latest else answer.min_offset
        starts: dict[int, tuple[int, int | None]] = {}
        for q in ids:
            known = committed[q]
            start = self._explicit[q] if q in self._explicit else known if known is not None else edges[q]
            starts[q] = (start, known)
        self._tracker = OffsetTracker(starts)
        return self._tracker

    async def positions(self) -> dict[int, int]:
        return (await self.start()).positions()

    async def poll(self, max_messages: int = DEFAULT_BATCH, timeout: float | None = None) -> list[Message]:
        """Up to ``max_messages`` messages, waiting up to ``timeout`` s (default: the long poll)."""
        if self._closed:
            raise RuntimeError("the consumer is closed")
        started_ns = time.time_ns()
        tracker = await self._started_or_waited(timeout)
        if tracker is None:
            return []
        if self.auto_commit and time.monotonic() - self._last_commit >= self.commit_interval_s:
            await self.commit()
        if not tracker.buffered:
            await self._fetch(tracker, self.long_poll_ms / 1000 if timeout is None else max(timeout, 0.0))
        messages = tracker.take(max(max_messages, 1))
        tracing.received(self.group, self.connection.address, started_ns, messages)  # the retry feed: its own
        if len(messages) < max_messages:
            feed = await self._retries()
            if feed is not None:
                messages += [as_original(m) for m in await feed.poll(max_messages - len(messages), timeout=0)]
        return messages

    async def _started_or_waited(self, timeout: float | None) -> OffsetTracker | None:
        """start(), or, while the topic does not exist yet, look for it again (bounded backoff) until the
        poll's wait is over: None then (as PullConsumer's)."""
        deadline = time.monotonic() + (self.long_poll_ms / 1000 if timeout is None else max(timeout, 0.0))
        while True:
            if time.monotonic() >= self._missing.next_at:
                try:
                    return await self.start()
                except NotFoundError:
                    if not self._missing.waiting:  # not a missing route: the error is the caller's
                        raise
            pause = min(self._missing.next_at, deadline) - time.monotonic()
            if pause <= 0 and time.monotonic() >= deadline:
                return None
            await asyncio.sleep(max(pause, 0.0))

    async def _retries(self) -> AsyncPullConsumer | None:
        """The group's retry topic's consumer, once the topic exists (as PullConsumer's)."""
        if self._retry_feed is not None or not self._retry_wanted:
            return self._retry_feed
        if time.monotonic() - self._retry_checked_at < RETRY_ROUTE_RECHECK_S:
            return None
        self._retry_checked_at = time.monotonic()
        assert self.group is not None
        feed = AsyncPullConsumer(self.group, retry_topic(self.group), connection=self.connection,
                                 batch_size=self.batch_size, auto_commit=self.auto_commit,
                                 commit_interval_s=self.commit_interval_s, timeout=self.timeout,
                                 raw_records=self.raw_records, retry=False)
        feed._missing = MissingTopics(announce=False)
        try:
            await feed.start()
        except NotFoundError:
            return None
        except PermissionDeniedError:
            # A token that may not consume %RETRY%<group> reads its topic alone, as before retries.
            self._retry_wanted = False
            return None
        self._retry_feed = feed
        return feed

    async def consume_later(self, message: Message | str, delay_level: int = 0, *,
                            max_reconsume_times: int | None = None) -> SendBackReceipt:
        """See :meth:`mqstore.client.PullConsumer.consume_later`."""
        request = send_back_request(self.group, message, delay_level, max_reconsume_times)
        return SendBackReceipt.from_proto(await self.connection.call("ConsumerSendBack", request, self.timeout))

    async def __aiter__(self) -> AsyncIterator[Message]:
        while not self._closed:
            for message in await self.poll(self.batch_size):
                yield message

    async def _fetch(self, tracker: OffsetTracker, wait_s: float) -> int:
        pulls = [(q, *self._request(tracker, q, 0)) for q in tracker.fetchable()]
        answers = await asyncio.gather(*(self.connection.call("Pull", r, PULL_MARGIN_S) for _, _, r in pulls))
        got = sum(tracker.absorb(q, offset, answer) for (q, offset, _), answer in zip(pulls, answers, strict=True))
        if got or wait_s <= 0:
            return got
        return await self._long_poll(tracker, time.monotonic() + wait_s)

    async def _long_poll(self, tracker: OffsetTracker, deadline: float) -> int:
        tasks: dict[asyncio.Task[Any], tuple[int, int]] = {}

        def launch(q: int) -> None:
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            if remaining_ms <= 0:
                return
            wait_ms = min(self.long_poll_ms, remaining_ms)
            offset, request = self._request(tracker, q, wait_ms)
            task = asyncio.ensure_future(self.connection.call("Pull", request, wait_ms / 1000 + PULL_MARGIN_S))
            tasks[task] = (q, offset)

        got = 0
        try:
            for q in tracker.fetchable():
                launch(q)
            if not tasks:
                await asyncio.sleep(max(deadline - time.monotonic(), 0.0))
            while tasks and not got:
                done, _ = await asyncio.wait(tasks, timeout=max(deadline - time.monotonic(), 0.0) + 0.05,
                                             return_when=asyncio.FIRST_COMPLETED)
                if not done:
                    break
                for task in done:
                    q, offset = tasks.pop(task)
                    try:
                        got += tracker.absorb(q, offset, task.result())
                    except MqstoreError as exc:
                        limit = max_long_poll_of(exc)
                        if limit is None or limit >= self.long_poll_ms:
                            raise
                        self.long_poll_ms = limit
                    if not got:
                        launch(q)
        finally:
            for task, (q, offset) in tasks.items():
                if task.done() and not task.cancelled() and task.exception() is None:
                    got += tracker.absorb(q, offset, task.result())
                else:
                    task.cancel()
        return got

    async def commit(self) -> dict[int, int]:
        """Stores the consumed offsets of queues that moved since the last commit; returns them."""
        if self.group is None:
            raise ValueError("this consumer has no group: there is nothing to commit to")
        if self._tracker is None:
            return {}
        if self._retry_feed is not None:
            await self._retry_feed.commit()
        pending = self._tracker.to_commit()
        answers = await self.connection.call_many("CommitOffset", self._commit_requests(pending), self.timeout)
        return self._committed(pending, answers)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if self.auto_commit and self._tracker is not None:
                await self.commit()
        finally:
            if self._retry_feed is not None:
                self._retry_feed._closed = True
            await super().close()
