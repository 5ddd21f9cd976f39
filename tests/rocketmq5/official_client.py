"""Scenarios run with the official RocketMQ 5 Python client (rocketmq-python-client, unmodified) against
the gateway, in a process of their own: the client's generated protocol modules define the same
protobuf names as the gateway's (apache.rocketmq.v2), which one process cannot hold twice.

``python -m tests.rocketmq5.official_client <scenario> <endpoint> <json args>`` prints one JSON line.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from typing import Any

from rocketmq import (
    ClientConfiguration,
    ConsumeResult,
    Credentials,
    FilterExpression,
    Message,
    MessageListener,
    Producer,
    PushConsumer,
    SimpleConsumer,
    TransactionChecker,
)
from rocketmq.grpc_protocol import TransactionResolution

CHECKED: list[str] = []


class Checker(TransactionChecker):  # type: ignore[misc]
    """Commits every half it is asked about (and records its id)."""

    def check(self, message: Message) -> Any:
        CHECKED.append(message.message_id)
        return TransactionResolution.COMMIT


def _config(endpoint: str) -> ClientConfiguration:
    return ClientConfiguration(endpoint, Credentials())


def _message(topic: str, body: str, tag: str | None = None, keys: list[str] | None = None,
             properties: dict[str, str] | None = None) -> Message:
    message = Message()
    message.topic = topic
    message.body = body.encode()
    if tag:
        message.tag = tag
    for key in keys or ():
        message.keys = key  # the setter adds one key
    for name, value in (properties or {}).items():
        message.add_property(name, value)
    return message


def produce(endpoint: str, args: dict[str, Any]) -> dict[str, Any]:
    topic, fifo_topic = args["topic"], args["fifo_topic"]
    producer = Producer(_config(endpoint), (topic, fifo_topic), Checker())
    producer.startup()
    out: dict[str, Any] = {}
    try:
        normal = _message(topic, "normal body", "TagA", ["order-1", "user-7"], {"color": "blue"})
        out["normal"] = producer.send(normal).message_id
        delayed = _message(topic, "delayed body", "TagD")
        out["delay_due_s"] = int(time.time()) + args["delay_s"]
        delayed.delivery_timestamp = out["delay_due_s"]  # this client sends it as seconds
        out["delayed"] = producer.send(delayed).message_id
        out["fifo"] = []
        for i in range(args["fifo_count"]):
            fifo = _message(fifo_topic, f"fifo {i}", "TagF")
            fifo.message_group = "group-1"
            out["fifo"].append(producer.send(fifo).message_id)
        for outcome in ("commit", "rollback"):
            transaction = producer.begin_transaction()
            half = _message(topic, f"{outcome} body", "TagT", [f"tx-{outcome}"])
            receipt = producer.send(half, transaction)
            (transaction.commit if outcome == "commit" else transaction.rollback)()
            out[outcome] = receipt.message_id
    finally:
        producer.shutdown()
    return out


def _received(message: Any) -> dict[str, Any]:
    return {"id": message.message_id, "body": message.body.decode(), "tag": message.tag,
            "keys": sorted(message.keys), "properties": dict(message.properties),
            "attempt": message.delivery_attempt, "group": message.message_group, "at": time.time()}


def consume(endpoint: str, args: dict[str, Any]) -> dict[str, Any]:
    """Receive ``expect`` messages; ack all but ``keep`` (its invisible duration changed to ``change_s``
    instead), then receive it again once visible and ack it."""
    consumer = SimpleConsumer(_config(endpoint), args["group"], {args["topic"]: FilterExpression()}, 2)
    consumer.startup()
    received: list[dict[str, Any]] = []
    again: list[dict[str, Any]] = []
    try:
        deadline = time.time() + args["wait_s"]
        kept = None
        while time.time() < deadline and (len(received) < args["expect"] or (kept is not None and not again)):
            for message in consumer.receive(32, args["invisible_s"]) or []:
                if kept is not None and message.message_id == kept.message_id:
                    again.append(_received(message))  # visible again after the changed duration
                    consumer.ack(message)
                    continue
                received.append(_received(message))
                if message.body.decode() == args["keep"] and kept is None:
                    kept = message
                    consumer.change_invisible_duration(message, args["change_s"])
                    received[-1]["changed_at"] = time.time()
                else:
                    consumer.ack(message)
    finally:
        consumer.shutdown()
    return {"received": received, "again": again}


def consume_fifo(endpoint: str, args: dict[str, Any]) -> dict[str, Any]:
    """Receive one FIFO group's messages, acking each: the order they came in, and how many each
    receive returned."""
    consumer = SimpleConsumer(_config(endpoint), args["group"], {args["topic"]: FilterExpression()}, 2)
    consumer.startup()
    order: list[str] = []
    batches: list[int] = []
    try:
        deadline = time.time() + args["wait_s"]
        while len(order) < args["expect"] and time.time() < deadline:
            messages = consumer.receive(32, 10) or []
            batches.append(len(messages))
            for message in messages:
                order.append(message.body.decode())
                consumer.ack(message)
    finally:
        consumer.shutdown()
    return {"order": order, "batches": batches}


def orphan(endpoint: str, args: dict[str, Any]) -> dict[str, Any]:
    """A half left without commit or rollback: the server's check reaches the checker, which commits."""
    producer = Producer(_config(endpoint), (args["topic"],), Checker())
    producer.startup()
    try:
        transaction = producer.begin_transaction()
        receipt = producer.send(_message(args["topic"], "orphan body", "TagO"), transaction)
        deadline = time.time() + args["wait_s"]
        while not CHECKED and time.time() < deadline:
            time.sleep(0.1)
        time.sleep(1)  # the checker's EndTransaction is sent asynchronously
    finally:
        producer.shutdown()
    return {"id": receipt.message_id, "checked": CHECKED}


def push(endpoint: str, args: dict[str, Any]) -> dict[str, Any]:
    """A PushConsumer whose listener succeeds for every message but ``fail``: what it consumed, with
    each message's delivery attempt."""
    seen: list[dict[str, Any]] = []

    class Listener(MessageListener):  # type: ignore[misc]
        def consume(self, message: Message) -> Any:
            seen.append(_received(message))
            return ConsumeResult.FAILURE if message.body.decode() == args["fail"] else ConsumeResult.SUCCESS

    consumer = PushConsumer(_config(endpoint), args["group"], Listener(), {args["topic"]: FilterExpression()})
    consumer.startup()
    try:
        deadline = time.time() + args["wait_s"]
        while time.time() < deadline and sum(m["body"] == args["fail"] for m in seen) < args["attempts"]:
            time.sleep(0.1)
        time.sleep(args["linger_s"])
    finally:
        consumer.shutdown()
    return {"seen": seen}


def slow_push(endpoint: str, args: dict[str, Any]) -> dict[str, Any]:
    """A PushConsumer whose listener takes ``listen_s`` for every message: each call's start and end,
    and the message it got (a message delivered again while its first call still runs shows twice)."""
    calls: list[dict[str, Any]] = []

    class Listener(MessageListener):  # type: ignore[misc]
        def consume(self, message: Message) -> Any:
            call = _received(message)
            calls.append(call)
            time.sleep(args["listen_s"])
            call["done"] = time.time()
            return ConsumeResult.SUCCESS

    consumer = PushConsumer(_config(endpoint), args["group"], Listener(), {args["topic"]: FilterExpression()})
    consumer.startup()
    try:
        deadline = time.time() + args["wait_s"]
        while time.time() < deadline and not any("done" in c for c in calls):
            time.sleep(0.1)
        time.sleep(args["linger_s"])
    finally:
        consumer.shutdown()
    return {"calls": calls}


def tls_roundtrip(endpoint: str, args: dict[str, Any]) -> dict[str, Any]:
    """A send and a receive with ``tls_enable=True`` (the CA comes from GRPC_DEFAULT_SSL_ROOTS_FILE_PATH)."""
    producer = Producer(_config(endpoint), (args["topic"],), tls_enable=True)
    producer.startup()
    try:
        sent = producer.send(_message(args["topic"], "over tls", "TagS")).message_id
    finally:
        producer.shutdown()
    consumer = SimpleConsumer(_config(endpoint), args["group"], {args["topic"]: FilterExpression()}, 2,
                              tls_enable=True)
    consumer.startup()
    received: list[str] = []
    try:
        deadline = time.time() + args["wait_s"]
        while not received and time.time() < deadline:
            for message in consumer.receive(16, 10) or []:
                received.append(message.message_id)
                consumer.ack(message)
    finally:
        consumer.shutdown()
    return {"sent": sent, "received": received}


def signed_send(endpoint: str, args: dict[str, Any]) -> dict[str, Any]:
    """A producer with Credentials(access key, secret key) sends one message: its message id, or the
    error the client raised (a refused signature fails the route lookup at startup)."""
    config = ClientConfiguration(endpoint, Credentials(args["ak"], args["sk"]))
    producer = Producer(config, (args["topic"],))
    try:
        producer.startup()
        return {"sent": producer.send(_message(args["topic"], "signed body", "TagA")).message_id}
    except Exception as exc:  # noqa: BLE001 - reported to the test
        return {"error": f"{type(exc).__name__}: {exc}"}
    finally:
        with contextlib.suppress(Exception):  # a producer that never started
            producer.shutdown()


SCENARIOS = {"tls": tls_roundtrip, "push": push, "slow_push": slow_push, "orphan": orphan, "produce": produce,
             "consume": consume, "consume_fifo": consume_fifo, "signed_send": signed_send}

if __name__ == "__main__":
    result = SCENARIOS[sys.argv[1]](sys.argv[2], json.loads(sys.argv[3]))
    print("RESULT " + json.dumps(result), flush=True)
