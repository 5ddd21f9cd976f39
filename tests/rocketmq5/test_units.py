"""Units of gateway/rocketmq5: RocketMQ 5's request signature verified against a token's secret,
receipt handles, the hand-out state of one queue (FIFO groups, outdated handles, the committed offset)."""

from __future__ import annotations

import hashlib
import hmac
import time
from pathlib import Path

import pytest

from mqstore.gateway.auth import MAX_SIGNATURE_SKEW_S, UnauthenticatedError, load_token_table
from mqstore.gateway.rocketmq5.inflight import BadReceiptHandle, QueueLease, Receipt


def signed(access_key: str, secret: str, at: float | None = None, signature: str | None = None,
           signed_headers: str = "x-mq-date-time") -> list[tuple[str, str]]:
    """What a RocketMQ 5 client sends (the Python client's Signature.metadata)."""
    date_time = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if at is None else at))
    if signature is None:
        signature = hmac.new(secret.encode(), date_time.encode(), hashlib.sha1).hexdigest()
    return [("x-mq-date-time", date_time), ("authorization", f"MQv2-HMAC-SHA1 Credential={access_key}, "
                                                             f"SignedHeaders={signed_headers}, Signature={signature}")]


def test_a_signature_is_verified_with_the_tokens_secret(tmp_path: Path) -> None:
    path = tmp_path / "tokens.yaml"
    path.write_text("tokens:\n  - name: orders\n    token: s3cr3t-orders\n    produce: [orders]\n")
    table = load_token_table(path)
    assert table.authenticate(signed("orders", "s3cr3t-orders")).name == "orders"
    upper = signed("orders", "s3cr3t-orders")  # the Node client sends the hex digits in upper case
    upper[1] = ("authorization", upper[1][1][:-40] + upper[1][1][-40:].upper())
    assert table.authenticate(upper).name == "orders"
    refusals = {
        "wrong secret": signed("orders", "s3cr3t-other"),
        "unknown key": signed("payments", "s3cr3t-orders"),
        "the token as access key": signed("s3cr3t-orders", "anything"),
        "stale": signed("orders", "s3cr3t-orders", at=time.time() - MAX_SIGNATURE_SKEW_S - 60),
        "future": signed("orders", "s3cr3t-orders", at=time.time() + MAX_SIGNATURE_SKEW_S + 60),
        "date not signed": signed("orders", "s3cr3t-orders", signed_headers="x-mq-request-id"),
        "no access key": signed("", "s3cr3t-orders"),
        "no date": signed("orders", "s3cr3t-orders")[1:],
    }
    for case, metadata in refusals.items():
        with pytest.raises(UnauthenticatedError):
            table.authenticate(metadata)
            pytest.fail(case)


def test_token_names_are_unique_access_keys(tmp_path: Path) -> None:
    path = tmp_path / "tokens.yaml"
    path.write_text("tokens:\n  - name: a\n    token: token-one-1\n  - name: a\n    token: token-two-2\n")
    with pytest.raises(ValueError, match="repeats the name 'a'"):
        load_token_table(path)


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
