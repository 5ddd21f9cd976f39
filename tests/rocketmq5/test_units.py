"""Units of gateway/rocketmq5: RocketMQ 5's request signature verified against a token's secret,
receipt handles, the auto renewal of push consumers' receipts."""

from __future__ import annotations

import gzip
import hashlib
import hmac
import time
import tracemalloc
from pathlib import Path

import pytest

from apache.rocketmq.v2 import definition_pb2
from gateway.auth import MAX_SIGNATURE_SKEW_S, UnauthenticatedError, load_token_table
from gateway.rocketmq5.inflight import BadReceiptHandle, Receipt, Renewal, Renewals
from gateway.rocketmq5.messages import BadMessage, to_mqstore


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


def test_renewals() -> None:
    renewals = Renewals(max_renew_s=100)
    ahead = Renewal("c1", "g", "t", Receipt(0, 1, 7), 30, visible_at=1000 + 30, delivered_at=1000, caller=None)
    short = Renewal("c1", "g", "t", Receipt(0, 2, 8), 4, visible_at=1000 + 4, delivered_at=1000, caller=None)
    other = Renewal("c2", "g", "t", Receipt(0, 3, 9), 30, visible_at=1000 + 30, delivered_at=1000, caller=None)
    for renewal in (ahead, short, other):
        renewals.add(renewal)
    assert [r.handle for r in renewals.due(1000)] == [], "30 s left: not yet"
    assert [r.handle for r in renewals.due(1002)] == ["0.2.8"], "half of a short duration ahead"
    assert {r.handle for r in renewals.due(1021)} == {"0.1.7", "0.2.8", "0.3.9"}, "10 s ahead"
    renewals.forget("0.1.7")
    renewals.drop_client("c2")
    assert [r.handle for r in renewals.due(1021)] == ["0.2.8"]
    assert renewals.due(1100) == [] and len(renewals) == 0, "past the maximum renew time: forgotten"


def test_max_delivery_attempts_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from gateway.rocketmq5 import registration
    monkeypatch.delenv(registration.ENV_MAX_DELIVERY_ATTEMPTS, raising=False)
    assert registration.max_delivery_attempts() == 16
    monkeypatch.setenv(registration.ENV_MAX_DELIVERY_ATTEMPTS, "3")
    assert registration.max_delivery_attempts() == 3
    for bad in ("0", "x", "-1"):
        monkeypatch.setenv(registration.ENV_MAX_DELIVERY_ATTEMPTS, bad)
        with pytest.raises(ValueError, match="MQSTORE_RMQ5_MAX_DELIVERY_ATTEMPTS"):
            registration.max_delivery_attempts()


def gzip_message(body: bytes) -> definition_pb2.Message:
    return definition_pb2.Message(topic=definition_pb2.Resource(name="T"), body=body,
                                  system_properties=definition_pb2.SystemProperties(
                                      body_encoding=definition_pb2.Encoding.GZIP))


def test_a_gzip_body_is_inflated_no_further_than_the_body_limit() -> None:
    """A few KiB of GZIP can claim gigabytes: the send stops inflating past the body limit."""
    bomb = gzip.compress(bytes(64 << 20))
    tracemalloc.start()
    try:
        with pytest.raises(BadMessage, match=f"inflates to more than the {4 << 20} bytes allowed"):
            to_mqstore(gzip_message(bomb), 4 << 20)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20


@pytest.mark.parametrize(("body", "error"), [
    (gzip.compress(b"one") + gzip.compress(b" two"), None),  # members, as gzip.decompress reads them
    (gzip.compress(b"x" * 100)[:-5], "does not decompress"),
    (b"not gzip", "does not decompress"),
])
def test_gzip_bodies(body: bytes, error: str | None) -> None:
    if error is None:
        assert to_mqstore(gzip_message(body), 1 << 20)[0].body == b"one two"
    else:
        with pytest.raises(BadMessage, match=error):
            to_mqstore(gzip_message(body), 1 << 20)
