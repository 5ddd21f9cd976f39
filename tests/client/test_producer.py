"""Producer against a running system: receipts, batches and streams, and errors as MqstoreError."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import pytest

from mqstore.client import (
    Client,
    InvalidArgumentError,
    Message,
    MqstoreError,
    NotFoundError,
    OutgoingMessage,
    Producer,
    PullConsumer,
    SendReceipt,
    UnavailableError,
)
from tests.client.conftest import eventually
from tests.gateway.system_process import free_port_block


def _assert_dense(receipts: list[SendReceipt]) -> None:
    """Per queue, offsets follow each other with no gap or repeat, in the order of the receipts."""
    per_queue: dict[int, list[int]] = defaultdict(list)
    for receipt in receipts:
        per_queue[receipt.queue_id].append(receipt.queue_offset)
    for queue_id, offsets in per_queue.items():
        assert offsets == list(range(offsets[0], offsets[0] + len(offsets))), f"queue {queue_id}"


def test_send_returns_a_receipt_the_message_is_found_by(gateway: str, client: Client, topic: str) -> None:
    with Producer(gateway) as producer:
        receipt = producer.send(topic, "hello", tags="TagA", keys=["order-1", "order-2"], properties={"a": "b"})
    assert receipt.ok and receipt.topic == topic and len(receipt.msg_id) == 32 and len(receipt.offset_msg_id) == 32
    found = eventually(lambda: client.get_message(receipt.msg_id))
    assert (found.topic, found.queue_id, found.queue_offset) == (topic, receipt.queue_id, receipt.queue_offset)
    assert found.msg_id == found.uniq_key == receipt.msg_id and found.offset_msg_id == receipt.offset_msg_id
    assert found.body == b"hello" and found.tags == "TagA" and found.keys == ("order-1", "order-2")
    assert found.properties["a"] == "b"
    assert client.get_message(receipt.offset_msg_id, kind="offset").msg_id == receipt.msg_id
    assert [m.msg_id for m in eventually(lambda: client.query(topic, "order-2")).messages] == [receipt.msg_id]


def test_send_batch_of_3000_is_acknowledged_in_order(gateway: str, client: Client, topic: str) -> None:
    bodies = [f"batch-{i}".encode() for i in range(3000)]
    with Producer(gateway) as producer:
        receipts = producer.send_batch(topic, bodies, tags="bulk")
    assert len(receipts) == 3000 and all(r.ok and r.topic == topic for r in receipts)
    assert len({r.msg_id for r in receipts}) == 3000
    _assert_dense(receipts)
    # Chunks of at most 1024 messages, each to one queue.
    assert len({r.queue_id for r in receipts[:1024]}) == 1
    sample = eventually(lambda: client.get_message(receipts[2999].msg_id, topic=topic))
    assert sample.body == b"batch-2999" and sample.tags == "bulk"


def test_send_stream_of_3000_is_acknowledged_in_order(gateway: str, client: Client, topic: str) -> None:
    def messages() -> Iterator[str | OutgoingMessage]:
        for i in range(3000):
            yield OutgoingMessage(body=f"stream-{i}", keys=f"k{i}") if i % 2 else f"stream-{i}"

    with Producer(gateway) as producer:
        receipts = list(producer.send_stream(messages(), topic))
    assert len(receipts) == 3000 and all(r.ok for r in receipts)
    _assert_dense(receipts)
    for i in (0, 1, 1500, 2999):
        msg_id = receipts[i].msg_id
        found = eventually(lambda: client.get_message(msg_id, topic=topic))  # noqa: B023 (called at once)
        assert found.body == f"stream-{i}".encode()
    # Sharding keys keep a key's messages on one queue.
    with Producer(gateway) as producer:
        keyed = list(producer.send_stream((f"o-{i}" for i in range(50)), topic, sharding_key="order-42"))
    assert len({r.queue_id for r in keyed}) == 1
    _assert_dense(keyed)


def test_a_bad_item_in_a_stream_raises_after_the_good_ones(gateway: str, topic: str) -> None:
    def messages() -> Iterator[Any]:
        yield "one"
        yield "two"
        yield 3

    received: list[SendReceipt] = []
    with Producer(gateway) as producer, pytest.raises(TypeError, match="bytes, str or OutgoingMessage"):
        for receipt in producer.send_stream(messages(), topic):
            received.append(receipt)
    assert len(received) == 2


def test_refusals_are_mqstore_errors(gateway: str, client: Client) -> None:
    with Producer(gateway) as producer, pytest.raises(InvalidArgumentError, match="illegal characters") as bad:
        producer.send("bad topic!", "x")
    assert bad.value.code == "INVALID_ARGUMENT" and not bad.value.retryable
    with pytest.raises(NotFoundError):
        client.get_message("0" * 32)
    with pytest.raises(NotFoundError, match="does not exist"):
        client.route("no_such_topic_anywhere")


def test_no_gateway_is_unavailable_not_a_grpc_error() -> None:
    port = free_port_block(1)
    with Producer(f"127.0.0.1:{port}", timeout=5) as producer, pytest.raises(UnavailableError) as failed:
        producer.send("t", "x")
    assert isinstance(failed.value, MqstoreError) and failed.value.retryable
    assert f"127.0.0.1:{port}" in failed.value.message and "mqstore up" in failed.value.message


@pytest.mark.parametrize("raw_records", [True, False], ids=["raw-pull", "decoded-pull"])
def test_uniq_key_and_offset_msg_id_are_the_same_on_send_pull_get_and_query(
        gateway: str, client: Client, topic: str, raw_records: bool) -> None:
    client.create_topic(topic, 1)
    with Producer(gateway) as producer:
        receipts = [producer.send(topic, "one", keys="ids-1"), *producer.send_batch(topic, ["two", "three"])]
    assert all(len(r.uniq_key) == 32 and len(r.offset_msg_id) == 32 for r in receipts)
    assert [r.msg_id for r in receipts] == [r.uniq_key for r in receipts], "msg_id: the deprecated alias"
    sent = {r.queue_offset: (r.uniq_key, r.offset_msg_id) for r in receipts}
    pulled: list[Message] = []
    with PullConsumer(None, topic, gateway, raw_records=raw_records) as consumer:
        for _ in range(50):
            pulled += consumer.poll(timeout=0.2)
            if len(pulled) >= 3:
                break
    assert {m.queue_offset: (m.uniq_key, m.offset_msg_id) for m in pulled} == sent
    assert all(m.msg_id == m.uniq_key for m in pulled), "msg_id: the deprecated alias"
    for receipt in receipts:
        for found in (eventually(lambda r=receipt: client.get_message(r.uniq_key)),
                      client.get_message(receipt.offset_msg_id, kind="offset")):
            assert (found.uniq_key, found.offset_msg_id) == (receipt.uniq_key, receipt.offset_msg_id)
    [keyed] = eventually(lambda: client.query(topic, "ids-1")).messages
    assert (keyed.uniq_key, keyed.offset_msg_id) == (receipts[0].uniq_key, receipts[0].offset_msg_id)
