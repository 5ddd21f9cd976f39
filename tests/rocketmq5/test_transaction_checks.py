"""A RocketMQ 5 producer's TransactionChecker answers mqstore's check of a half it never ended (the
check travels as RecoverOrphanedTransactionCommand on the producer's telemetry stream); the half is
then committed and readable under its topic."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.gateway.system_process import UpProcess, start_up
from tests.rocketmq5.test_official_python_client import official
from tests.rocketmq5.topics import create_topic, stored

ENV = {"MQSTORE_TRANSACTION_TIMEOUT_MS": "1000", "MQSTORE_TRANSACTION_CHECK_INTERVAL_MS": "500"}


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpProcess]:
    started = start_up(tmp_path_factory.mktemp("up") / "store", ENV)
    try:
        yield started
        assert started.stop() == 0, started.logs()[-5000:]
    finally:
        started.kill_all()


def test_the_checker_commits_an_orphaned_half(up: UpProcess, tmp_path: Path) -> None:
    create_topic(up, "rmq5-orphans", 2)
    result = official("orphan", up.gateway, tmp_path, topic="rmq5-orphans", wait_s=30)
    assert result["checked"] == [result["id"]], "the checker was asked about the half it left open"
    committed = stored(up, result["id"], "rmq5-orphans")
    assert (committed.topic, committed.body, committed.tags) == ("rmq5-orphans", b"orphan body", "TagO")
