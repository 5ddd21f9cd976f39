"""Closing a TransactionProducer right after its check callback answered still ends the half.

Before, close() cancelled the check stream at once, so an answer not yet sent on it was dropped: the
application's COMMIT was lost, the half checked again, and discarded once no producer of the group
was left. Own ``mqstore up`` with checks every 0.5 s (the defaults would take a minute).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from mqstore.client import PullConsumer, TransactionCheck, TransactionProducer, TransactionState
from tests.gateway.system_process import UpProcess, start_up

ENV = {"MQSTORE_TRANSACTION_TIMEOUT_MS": "1000", "MQSTORE_TRANSACTION_CHECK_INTERVAL_MS": "500"}


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpProcess]:
    started = start_up(tmp_path_factory.mktemp("tx-close") / "store", ENV)
    try:
        yield started
        assert started.stop() == 0, started.logs()[-3000:]
    finally:
        started.kill_all()


@pytest.mark.parametrize("attempt", range(3))
def test_an_answer_given_just_before_close_is_applied(up: UpProcess, attempt: int) -> None:
    topic = f"tx_close_{attempt}"
    answered = threading.Event()

    def check(half: TransactionCheck) -> TransactionState:
        answered.set()
        return TransactionState.COMMIT

    with TransactionProducer(f"closers{attempt}", lambda message, arg: TransactionState.UNKNOWN, check,
                             address=up.gateway) as producer:
        producer.send(topic, f"order {attempt}")
        assert answered.wait(20), "no check came"
    # Closed as soon as the callback returned: the COMMIT must still have been sent and applied.
    with PullConsumer(None, topic, address=up.gateway) as consumer:
        delivered = consumer.poll(timeout=5)
    assert [m.text for m in delivered] == [f"order {attempt}"]
