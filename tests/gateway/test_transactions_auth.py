"""Transaction checks with tokens on: a check carries the half's body and its answer decides the
transaction, so it goes only to a TransactionChecks stream whose token may produce to the half's topic.
Another tenant's streams of the same producer group are never chosen for it and spend none of its
transactionCheckMax checks; a token that may produce to no topic cannot open a stream at all."""

from __future__ import annotations

import time
from collections.abc import Iterator

import grpc
import pytest

from mqstore.v1 import common_pb2, gateway_pb2
from tests.gateway import test_gateway_auth as auth
from tests.gateway.system_process import UpProcess, start_up
from tests.gateway.test_transactions import CHECK_MAX, CHECK_MAX_TOPIC, ENV, HALF_TOPIC, SilentProducer, _system_queue

GROUP = "securedTxGroup"
TOKENS = auth.TOKENS + """\
  - name: tenant-a
    token: tok-tenant-a
    produce: ["a-*"]
  - name: tenant-b
    token: tok-tenant-b
    produce: ["b-*"]
"""
TENANT_A = (("authorization", "Bearer tok-tenant-a"),)
TENANT_B = (("authorization", "Bearer tok-tenant-b"),)


@pytest.fixture(scope="module")
def secured_tx(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpProcess]:
    root = tmp_path_factory.mktemp("tx-auth")
    (root / "tokens.yaml").write_text(TOKENS)
    started = start_up(root / "store", ENV, extra_args=["--auth-file", str(root / "tokens.yaml")])
    try:
        yield started
        assert started.stop() == 0, started.logs()[-5000:]
    finally:
        started.kill_all()


def _half(up: UpProcess, topic: str, group: str, metadata: tuple[tuple[str, str], ...]) -> gateway_pb2.SendResult:
    return up.stub.Send(gateway_pb2.SendRequest(message=common_pb2.Message(
        topic=topic, body=b"secret order", properties={"TRAN_MSG": "true", "PGROUP": group})),
        timeout=10, metadata=metadata)


def test_a_token_that_may_produce_to_no_topic_cannot_open_a_check_stream(secured_tx: UpProcess) -> None:
    consumer = SilentProducer(secured_tx, GROUP, auth.CONSUMER)
    try:
        deadline = time.monotonic() + 10
        while consumer.error is None and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        consumer.close()
    assert consumer.error is not None and consumer.error.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "may produce to no topic" in (consumer.error.details() or "")


def test_another_tenants_streams_never_take_or_spend_a_halfs_checks(secured_tx: UpProcess) -> None:
    group = "tenantBGroup"
    # Tenant A (no right on b-*) opens 80 streams of B's producer group: allowed (it may produce to
    # a-*), but never handed a check of B's half nor counted against it.
    a_streams = [SilentProducer(secured_tx, group, TENANT_A) for _ in range(80)]
    try:
        sent = _half(secured_tx, "b-orders", group, TENANT_B)
        time.sleep(3.5)  # rounds enough to discard it (check max 3 every 0.5 s), were A's checks counted
        copies = [m for m in _system_queue(secured_tx, HALF_TOPIC) if m.uniq_key == sent.msg_id]
        assert len(copies) > 1, "put back each round while no producer that may be asked is connected"
        assert all("TRANSACTION_CHECK_TIMES" not in m.properties for m in copies), "no check spent"
        b_stream = SilentProducer(secured_tx, group, TENANT_B)
        try:
            deadline = time.monotonic() + 10
            while len(b_stream.checks) < CHECK_MAX and time.monotonic() < deadline:
                time.sleep(0.1)
        finally:
            b_stream.close()
        assert [c.transaction_id for c in b_stream.checks] == [sent.msg_id] * CHECK_MAX
        assert [c.check_times for c in b_stream.checks] == list(range(1, CHECK_MAX + 1))
        assert all(s.checks == [] and s.error is None for s in a_streams), "A's streams see none of B's checks"
    finally:
        for stream in a_streams:
            stream.close()
    deadline = time.monotonic() + 10
    while not [m for m in _system_queue(secured_tx, CHECK_MAX_TOPIC) if m.uniq_key == sent.msg_id]:
        assert time.monotonic() < deadline, "discarded after B's own checks went unanswered"
        time.sleep(0.1)
