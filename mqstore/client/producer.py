"""Sending messages: one at a time, in batches (one queue, one lock hold), or pipelined on a stream."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import grpc

from mqstore.client import tracing
from mqstore.client.batch_encoder import UNIQ_KEY, UNIQ_KEYS, encode_entry, properties_bytes
from mqstore.client.connection import MIB, Endpoint
from mqstore.client.errors import MqstoreError, from_rpc_error
from mqstore.client.limits import MAX_BATCH_MESSAGES
from mqstore.client.models import PROPERTY_SHARDING_KEY, Keys, OutgoingMessage, SendReceipt, _put_status, encode_body
from mqstore.v1 import gateway_pb2

#: Batches are also cut by size, far below the gateway's 65 MiB receive limit.
MAX_BATCH_BYTES = 16 * MIB

Item = bytes | str | OutgoingMessage


def as_message(item: Item, tags: str | None = None, keys: Keys | None = None,
               properties: Mapping[str, str] | None = None) -> OutgoingMessage:
    """A body gets the call's tags, keys and properties; an OutgoingMessage keeps its own."""
    if isinstance(item, OutgoingMessage):
        return item
    if not isinstance(item, bytes | bytearray | memoryview | str):
        raise TypeError(f"a message is bytes, str or OutgoingMessage, not {type(item).__name__}")
    return OutgoingMessage(body=bytes(item) if not isinstance(item, str) else item, tags=tags, keys=keys,
                           properties=properties)


@dataclass(slots=True)
class BatchChunk:
    """One SendBatch's worth of messages as RocketMQ's batch blob, with the UNIQ_KEY of each message."""

    topic: str
    blob: bytes
    uniq_keys: list[str]


def batch_chunks(topic: str, messages: Iterable[Item], tags: str | None = None, keys: Keys | None = None,
                 properties: Mapping[str, str] | None = None,
                 trace_properties: Mapping[str, str] | None = None,
                 sharding_key: str | None = None) -> Iterator[BatchChunk]:
    """Blobs the gateway accepts (<= 1024 messages, <= 16 MiB), each message with its own UNIQ_KEY (one it
    carries in its properties is kept), the send's ``trace_properties`` (mqstore/client/tracing.py) and
    its ``sharding_key`` as the message group (``__SHARDINGKEY``, as the gateway keeps a message form's)."""
    parts: list[bytes] = []
    uniq_keys: list[str] = []
    size = 0
    for item in messages:
        message = as_message(item, tags, keys, properties)
        if message.sharding_key is not None or message.queue_id is not None:
            raise ValueError("a batch goes to one queue: give sharding_key or queue_id to send_batch, "
                             "not to its messages")
        if message.topic and message.topic != topic:
            raise ValueError(f"message topic {message.topic!r} differs from the batch's topic {topic!r}")
        wire_properties = message.wire_properties()
        if trace_properties:
            tracing.add_properties(wire_properties, trace_properties)
        if sharding_key:
            wire_properties.setdefault(PROPERTY_SHARDING_KEY, sharding_key)
        uniq_key = wire_properties.get(UNIQ_KEY) or wire_properties.setdefault(UNIQ_KEY, UNIQ_KEYS.next())
        entry = encode_entry(encode_body(message.body), message.flag, properties_bytes(wire_properties))
        if parts and (len(parts) >= MAX_BATCH_MESSAGES or size + len(entry) > MAX_BATCH_BYTES):
            yield BatchChunk(topic, b"".join(parts), uniq_keys)
            parts, uniq_keys, size = [], [], 0
        parts.append(entry)
        uniq_keys.append(uniq_key)
        size += len(entry)
    if parts:
        yield BatchChunk(topic, b"".join(parts), uniq_keys)


def batch_request(chunk: BatchChunk, sharding_key: str | None, queue_id: int | None) -> Any:
    request = gateway_pb2.SendBatchRequest(topic=chunk.topic, encoded_messages=chunk.blob,
                                           sharding_key=sharding_key or "")
    if queue_id is not None:
        request.queue_id = queue_id
    return request


def batch_receipts(chunk: BatchChunk, response: Any) -> list[SendReceipt]:
    """A SendBatch answer as receipts in message order: one receipt for the batch (the usual answer to a
    blob) or a result per message (e.g. DELAY messages, stored under queues of their own)."""
    if not response.HasField("receipt"):
        return [SendReceipt.from_proto(r) for r in response.results]
    r = response.receipt
    ids = list(r.uniq_keys or r.msg_ids) or chunk.uniq_keys
    status = _put_status(r.status)
    prefix, first = r.offset_msg_id_prefix, r.first_queue_offset
    return [SendReceipt(uniq_key=uniq_key, offset_msg_id=f"{prefix}{offset:016X}", topic=r.topic, queue_id=r.queue_id,
                        queue_offset=first + i, store_timestamp=r.store_timestamp, shard=r.shard, status=status)
            for i, (uniq_key, offset) in enumerate(zip(ids, r.commitlog_offsets, strict=True))]


def stream_request(item: Item, topic: str | None, tags: str | None, keys: Keys | None,
                   properties: Mapping[str, str] | None, sharding_key: str | None, queue_id: int | None) -> Any:
    """One SendRequest of a stream: a message's own routing wins over the stream's."""
    message = as_message(item, tags, keys, properties)
    request = message.to_request(topic)
    if message.sharding_key is None and sharding_key:
        request.sharding_key = sharding_key
    if message.queue_id is None and queue_id is not None:
        request.queue_id = queue_id
    return request


class Producer(Endpoint):
    """Sends to the gateway. Thread-safe; ``with Producer() as p:`` closes the channel it opened.

    Without ``sharding_key`` or ``queue_id`` the gateway picks the queue (round robin over the
    topic's writable queues); topics are created on first send when the gateway auto-creates them.
    """

    def send(self, topic: str, body: bytes | str, *, tags: str | None = None, keys: Keys | None = None,
             properties: Mapping[str, str] | None = None, sharding_key: str | None = None,
             queue_id: int | None = None, delay_level: int | None = None,
             timeout: float | None = None) -> SendReceipt:
        """One message; ``keys`` is a list of keys or one space-separated string (RocketMQ's KEYS)."""
        message = OutgoingMessage(body=body, topic=topic, tags=tags, keys=keys, properties=properties,
                                  sharding_key=sharding_key, queue_id=queue_id, delay_level=delay_level)
        return self.send_message(message, timeout=timeout)

    def send_message(self, message: OutgoingMessage, *, timeout: float | None = None) -> SendReceipt:
        connection = self.connection
        with tracing.send_span(message.topic, connection.address, tags=message.tags, keys=message.keys) as span:
            request = message.to_request()
            tracing.add_properties(request.message.properties, tracing.message_properties(span))
            receipt = SendReceipt.from_proto(connection.call("Send", request, timeout,
                                                             tracing.call_metadata(span, connection.metadata)))
            tracing.sent(span, [receipt.uniq_key])
            return receipt

    def send_batch(self, topic: str, messages: Iterable[Item], *, tags: str | None = None,
                   keys: Keys | None = None, properties: Mapping[str, str] | None = None,
                   sharding_key: str | None = None, queue_id: int | None = None,
                   timeout: float | None = None) -> list[SendReceipt]:
        """Many messages to one topic, as SendBatch calls of up to 1024: each call goes to one queue
        under one hold of the store's lock. Receipts come in message order. On a failure the error's
        ``receipts`` lists the messages stored before it."""
        receipts: list[SendReceipt] = []
        connection = self.connection
        with tracing.send_span(topic, connection.address, tags=tags, keys=keys) as span:
            metadata = tracing.call_metadata(span, connection.metadata)
            for chunk in batch_chunks(topic, messages, tags, keys, properties, tracing.message_properties(span),
                                      sharding_key):
                try:
                    response = connection.call("SendBatch", batch_request(chunk, sharding_key, queue_id), timeout,
                                               metadata)
                except MqstoreError as exc:
                    exc.receipts = receipts
                    raise
                receipts.extend(batch_receipts(chunk, response))
            tracing.sent(span, [r.uniq_key for r in receipts])
        return receipts

    def send_stream(self, messages: Iterable[Item], topic: str | None = None, *, tags: str | None = None,
                    keys: Keys | None = None, properties: Mapping[str, str] | None = None,
                    sharding_key: str | None = None, queue_id: int | None = None,
                    timeout: float | None = None) -> Iterator[SendReceipt]:
        """Pipelined sends on one SendStream: requests keep flowing while receipts come back, in
        order; the gateway appends whatever has arrived as one batch. Lazy: iterate to send. Messages
        without a topic get ``topic``. A failure ends the stream; every receipt yielded before it was
        stored. Leaving the loop early cancels the stream: messages sent but not yet acknowledged
        may or may not be stored."""
        failure: list[BaseException] = []

        def requests() -> Iterator[Any]:
            # gRPC reads this on its own thread and would only log an exception: keep it for the caller.
            try:
                for item in messages:
                    yield stream_request(item, topic, tags, keys, properties, sharding_key, queue_id)
            except Exception as exc:
                failure.append(exc)

        call = self.connection.stream("SendStream", requests(), timeout)
        try:
            for result in call:
                yield SendReceipt.from_proto(result)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc, self.connection.address, timeout) from None
        finally:
            call.cancel()
        if failure:
            raise failure[0]
