"""Transaction checks with tokens on: a check carries the half's body, so only a TransactionChecks
stream whose token may produce to the half's topic receives it (the others never see it; it is asked
again next interval, and a stream that may produce to the topic gets it)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import grpc
import pytest

from mqstore.v1 import common_pb2, gateway_pb2, transaction_pb2
from tests.gateway import test_gateway_auth as auth
from tests.gateway.system_process import UpProcess, start_up
from tests.gateway.test_transactions import ENV

GROUP = "securedTxGroup"


@pytest.fixture(scope="module")
def secured_tx(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpProcess]:
    root = tmp_path_factory.mktemp("tx-auth")
    (root / "tokens.yaml").write_text(auth.TOKENS)
    started = start_up(root / "store", ENV, extra_args=["--auth-file", str(root / "tokens.yaml")])
    try:
        yield started
        assert started.stop() == 0, started.logs()[-5000:]
    finally:
        started.kill_all()


def _checks_within(up: UpProcess, metadata: tuple[tuple[str, str], ...], seconds: float) -> list[str]:
    """The transaction ids of the checks a stream of GROUP with this token receives within ``seconds``."""
    hold = threading.Event()

    def requests() -> Iterator[transaction_pb2.TransactionCheckStreamRequest]:
        yield transaction_pb2.TransactionCheckStreamRequest(producer_group=GROUP)
        hold.wait()

    received: list[str] = []
    stream = up.stub.TransactionChecks(requests(), timeout=seconds, metadata=metadata)
    try:
        for check in stream:
            received.append(check.transaction_id)
    except grpc.RpcError as exc:
        assert exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED, exc.details()
    finally:
        hold.set()
    return received


def test_only_a_stream_that_may_produce_to_the_topic_sees_its_checks(secured_tx: UpProcess) -> None:
    seen: dict[str, list[str]] = {}

    def watch(name: str, metadata: tuple[tuple[str, str], ...]) -> None:
        seen[name] = _checks_within(secured_tx, metadata, 5.0)

    # Two streams of the group, checks handed out in turn: the consumer's token may not produce to
    # "orders", so none of the checks (every 0.5 s after 1 s, at most 3) may reach it.
    watchers = [threading.Thread(target=watch, args=(name, metadata))
                for name, metadata in (("consumer", auth.CONSUMER), ("producer", auth.PRODUCER))]
    for watcher in watchers:
        watcher.start()
    half = secured_tx.stub.Send(gateway_pb2.SendRequest(message=common_pb2.Message(
        topic="orders", body=b"secret order", properties={"TRAN_MSG": "true", "PGROUP": GROUP})),
        timeout=10, metadata=auth.PRODUCER)
    for watcher in watchers:
        watcher.join()
    assert seen["consumer"] == []
    assert half.msg_id in seen["producer"]
