"""Transactional messages: RocketMQ's TransactionMQProducer over the gateway (docs/transactions.md).

    def local_transaction(message, arg):         # runs after the half is stored
        db.insert_order(arg)                      # your local transaction
        return TransactionState.COMMIT            # or ROLLBACK, or UNKNOWN (decide later)

    def check(check):                             # the store asks about a half left UNKNOWN
        return TransactionState.COMMIT if db.has_order(check.message.keys) else TransactionState.ROLLBACK

    with TransactionProducer("order-producers", local_transaction, check) as producer:
        result = producer.send("orders", b"order 1", arg=order)

``send`` stores a half (invisible to consumers), runs ``local_transaction`` and ends the transaction
with its answer. A half left UNKNOWN (or whose end was lost) is checked: the producer keeps a
TransactionChecks stream open for its group, on a thread of its own, and answers each check with
``check``'s state. An exception in either callback counts as UNKNOWN, as RocketMQ's producer does.
"""

from __future__ import annotations

import enum
import logging
import queue
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import grpc

from mqstore.client import tracing
from mqstore.client.connection import Connection, Endpoint, Tls
from mqstore.client.models import Keys, OutgoingMessage, SendReceipt
from mqstore.v1 import gateway_pb2, transaction_pb2

log = logging.getLogger(__name__)

PROPERTY_TRANSACTION_PREPARED = "TRAN_MSG"
PROPERTY_PRODUCER_GROUP = "PGROUP"
#: Between attempts to open the check stream again (the gateway restarting).
RECONNECT_S = 1.0
#: How long close() waits for the answers already given to reach the gateway before it cancels the stream.
CLOSE_GRACE_S = 5.0


class TransactionState(enum.Enum):
    """RocketMQ's LocalTransactionState."""

    COMMIT = transaction_pb2.COMMIT
    ROLLBACK = transaction_pb2.ROLLBACK
    UNKNOWN = transaction_pb2.UNKNOWN


@dataclass(slots=True, frozen=True)
class TransactionCheck:
    """The store asks what became of a transaction (the half as it was sent)."""

    transaction_id: str
    offset_msg_id: str
    check_times: int
    shard: str
    topic: str
    body: bytes
    properties: dict[str, str]

    @property
    def tags(self) -> str | None:
        return self.properties.get("TAGS")

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(self.properties.get("KEYS", "").split())


@dataclass(slots=True, frozen=True)
class TransactionResult:
    """A transactional send: the half's receipt, the state it was ended with, and (COMMIT) the message
    as stored under its topic."""

    half: SendReceipt
    state: TransactionState
    applied: bool
    committed: SendReceipt | None = None

    @property
    def transaction_id(self) -> str:
        return self.half.uniq_key


LocalTransaction = Callable[[OutgoingMessage, Any], TransactionState]
CheckListener = Callable[[TransactionCheck], TransactionState]


class TransactionProducer(Endpoint):
    """Sends transactional messages for one producer group and answers the group's checks."""

    def __init__(self, group: str, local_transaction: LocalTransaction | None = None,
                 check: CheckListener | None = None, address: str | None = None, token: str | None = None, *,
                 connection: Connection | None = None, timeout: float = 10.0, tls: Tls | bool | None = None) -> None:
        super().__init__(address, token, connection=connection, timeout=timeout, tls=tls)
        self.group = group
        self.local_transaction = local_transaction
        self.check = check
        self._closing = threading.Event()
        self._call: Any = None
        self._answers: queue.Queue[transaction_pb2.TransactionCheckStreamRequest | None] | None = None
        #: Held while a check is answered and its answer queued, so close() half-closes after it.
        self._answering = threading.Lock()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        if check is not None:
            self._thread = threading.Thread(target=self._serve_checks, name=f"mqstore-checks-{group}", daemon=True)
            self._thread.start()

    # -- sending -------------------------------------------------------------------------------------
    def send_half(self, topic: str, body: bytes | str, *, tags: str | None = None, keys: Keys | None = None,
                  properties: Mapping[str, str] | None = None, sharding_key: str | None = None,
                  queue_id: int | None = None, timeout: float | None = None) -> tuple[OutgoingMessage, SendReceipt]:
        """Only the half (end it with :meth:`end`)."""
        wire = dict(properties or {})
        wire[PROPERTY_TRANSACTION_PREPARED] = "true"
        wire[PROPERTY_PRODUCER_GROUP] = self.group
        message = OutgoingMessage(body=body, topic=topic, tags=tags, keys=keys, properties=wire,
                                  sharding_key=sharding_key, queue_id=queue_id)
        connection = self.connection
        # Inside send(): its span is current, and the half stores its context (the commit copies the
        # half's properties, so the consumer of the committed message finds the send in them).
        span = tracing.current_span()
        request = message.to_request()
        tracing.add_properties(request.message.properties, tracing.message_properties(span))
        answer = connection.call("Send", request, timeout, tracing.call_metadata(span, connection.metadata))
        return message, SendReceipt.from_proto(answer)

    def send(self, topic: str, body: bytes | str, *, arg: Any = None, tags: str | None = None,
             keys: Keys | None = None, properties: Mapping[str, str] | None = None, sharding_key: str | None = None,
             queue_id: int | None = None, local_transaction: LocalTransaction | None = None,
             timeout: float | None = None) -> TransactionResult:
        """Half, local transaction, end (RocketMQ's sendMessageInTransaction): one PRODUCER span around
        the three when the application traces, so the commit is in the message's trace."""
        with tracing.send_span(topic, self.connection.address, tags=tags, keys=keys) as span:
            message, half = self.send_half(topic, body, tags=tags, keys=keys, properties=properties,
                                           sharding_key=sharding_key, queue_id=queue_id, timeout=timeout)
            tracing.sent(span, [half.uniq_key])
            run = local_transaction or self.local_transaction
            state = TransactionState.UNKNOWN
            if run is not None:
                try:
                    state = TransactionState(run(message, arg))
                except Exception:
                    log.exception("local transaction of %s failed: left UNKNOWN (it will be checked)", half.uniq_key)
            return self.end(half, state, timeout=timeout)

    def end(self, half: SendReceipt, state: TransactionState, *, timeout: float | None = None) -> TransactionResult:
        request = transaction_pb2.EndTransactionRequest(producer_group=self.group, transaction_id=half.uniq_key,
                                                        offset_msg_id=half.offset_msg_id, resolution=state.value)
        connection = self.connection
        answer: gateway_pb2.EndTransactionResult = connection.call(
            "EndTransaction", request, timeout, tracing.call_metadata(tracing.current_span(), connection.metadata))
        committed = SendReceipt.from_proto(answer.committed) if answer.HasField("committed") else None
        return TransactionResult(half, state, answer.applied, committed)

    # -- checks --------------------------------------------------------------------------------------
    def _serve_checks(self) -> None:
        while not self._closing.is_set():
            answers: queue.Queue[transaction_pb2.TransactionCheckStreamRequest | None] = queue.Queue()
            with self._lock:
                if self._closing.is_set():
                    return
                self._answers = answers
                self._call = self.connection.stream("TransactionChecks", self._requests(answers))
            try:
                for wire in self._call:
                    with self._answering:
                        answers.put(transaction_pb2.TransactionCheckStreamRequest(answer=self._answer(wire)))
            except grpc.RpcError as exc:
                if not self._closing.is_set():
                    log.warning("transaction check stream of %r broke (%s); reopening", self.group, exc.code())
            finally:
                answers.put(None)
            self._closing.wait(RECONNECT_S)

    def _requests(self, answers: queue.Queue[transaction_pb2.TransactionCheckStreamRequest | None]
                  ) -> Iterator[transaction_pb2.TransactionCheckStreamRequest]:
        """The stream's requests: the group first, then the answers as the checks are answered."""
        yield transaction_pb2.TransactionCheckStreamRequest(producer_group=self.group)
        while True:
            item = answers.get()
            if item is None:
                return
            yield item

    def _answer(self, wire: transaction_pb2.TransactionCheck) -> transaction_pb2.EndTransactionRequest:
        check = TransactionCheck(transaction_id=wire.transaction_id, offset_msg_id=wire.offset_msg_id,
                                 check_times=wire.check_times, shard=wire.shard, topic=wire.message.topic,
                                 body=bytes(wire.message.body), properties=dict(wire.message.properties))
        state = TransactionState.UNKNOWN
        try:
            assert self.check is not None
            state = TransactionState(self.check(check))
        except Exception:
            log.exception("transaction check of %s failed: answered UNKNOWN", check.transaction_id)
        return transaction_pb2.EndTransactionRequest(producer_group=self.group, transaction_id=check.transaction_id,
                                                     offset_msg_id=check.offset_msg_id, resolution=state.value,
                                                     from_transaction_check=True)

    def close(self) -> None:
        """Half-closes the check stream after the answers already given (one being computed included),
        so the gateway ends those halves before the stream ends; cancels it only if that takes too long.
        Cancelling at once would drop an answer not yet sent: a COMMIT the application decided on would
        be lost, and the half checked again (or discarded when no producer of the group is left)."""
        with self._lock:
            self._closing.set()
            call, answers = self._call, self._answers
        if call is not None and answers is not None and self._thread is not None:
            if self._answering.acquire(timeout=CLOSE_GRACE_S):
                answers.put(None)
                self._answering.release()
            self._thread.join(timeout=CLOSE_GRACE_S)
            if self._thread.is_alive():
                call.cancel()
        if self._thread is not None:
            self._thread.join(timeout=5)
        super().close()
