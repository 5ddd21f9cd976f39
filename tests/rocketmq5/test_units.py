"""Units of gateway/rocketmq5: the access key of a RocketMQ 5 signature as mqstore's bearer token,
receipt handles, the hand-out state of one queue (FIFO groups, outdated handles, the committed offset)."""

from __future__ import annotations

import pytest

from mqstore.gateway.rocketmq5.inflight import BadReceiptHandle, QueueLease, Receipt
from mqstore.gateway.rocketmq5.local_call import bearer_metadata

SIGNED = "MQv2-HMAC-SHA1 Credential=token-1, SignedHeaders=x-mq-date-time, Signature=ABCDEF"


def test_the_access_key_is_the_bearer_token() -> None:
    assert bearer_metadata([("authorization", SIGNED), ("x-mq-client-id", "c")]) == [
        ("authorization", "Bearer token-1"), ("x-mq-client-id", "c")]
    assert bearer_metadata([("authorization", "MQv2-HMAC-SHA1 Credential=, SignedHeaders=x, Signature=y")]) == []
    assert bearer_metadata([("authorization", "Bearer t")]) == [("authorization", "Bearer t")]


def test_receipt_handles() -> None:
    assert Receipt.decode(Receipt(3, 17, 2).encode()) == Receipt(3, 17, 2)
    with pytest.raises(BadReceiptHandle, match="not one this gateway handed out"):
        Receipt.decode("3.17")


def test_a_queue_lease() -> None:
    lease = QueueLease(0, next_offset=10)
    first, attempts = lease.hand_out(10, "m10", 30, group_key="g")
    assert attempts == 1 and lease.committed == 10
    assert lease.blocked("g", 11) and not lease.blocked("other", 11) and not lease.blocked(None, 11)
    lease.next_offset = 12
    renewed = lease.change_invisible(first, 0)
    with pytest.raises(BadReceiptHandle, match="earlier hand-out"):
        lease.ack(first)
    [(offset, _)] = lease.expired(float("inf"))
    again, attempts = lease.hand_out(offset, "m10", 30, "g")
    assert attempts == 2
    with pytest.raises(BadReceiptHandle, match="earlier hand-out"):
        lease.ack(renewed)
    lease.ack(again)
    assert lease.committed == 12 and not lease.blocked("g", 11)
    with pytest.raises(BadReceiptHandle, match="not in flight"):
        lease.ack(again)


def test_max_delivery_attempts_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from mqstore.gateway.rocketmq5 import registration
    monkeypatch.delenv(registration.ENV_MAX_DELIVERY_ATTEMPTS, raising=False)
    assert registration.max_delivery_attempts() == 16
    monkeypatch.setenv(registration.ENV_MAX_DELIVERY_ATTEMPTS, "3")
    assert registration.max_delivery_attempts() == 3
    for bad in ("0", "x", "-1"):
        monkeypatch.setenv(registration.ENV_MAX_DELIVERY_ATTEMPTS, bad)
        with pytest.raises(ValueError, match="MQSTORE_RMQ5_MAX_DELIVERY_ATTEMPTS"):
            registration.max_delivery_attempts()
