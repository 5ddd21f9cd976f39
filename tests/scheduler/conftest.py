"""Fixtures of the scheduler tests: a real commitlog service and indexer in small geometry with short
delay levels ("1s 2s 3s"); each test starts its own scheduler (tests use their own topics)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.commitlog.commitlog_process import CommitLogProcess, start_commitlog
from tests.geometry import SMALL
from tests.indexer.indexer_process import IndexerProcess, start_indexer

DELAY_LEVELS = "1s 2s 3s"
DELAY_MS = (1000, 2000, 3000)


@dataclass
class Shard:
    root: Path
    commitlog: CommitLogProcess
    indexer: IndexerProcess
    env: dict[str, str]


@pytest.fixture(scope="module")
def shard(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shard]:
    root = tmp_path_factory.mktemp("scheduler-shard")
    env = {**SMALL.env(), "MQSTORE_MESSAGE_DELAY_LEVEL": DELAY_LEVELS}
    commitlog = start_commitlog(root / "broker", env)
    try:
        indexer = start_indexer(root / "indexer", commitlog.address, env)
    except BaseException:
        commitlog.kill9()
        raise
    try:
        yield Shard(root, commitlog, indexer, env)
        assert indexer.stop() == 0, indexer.logs()
        assert commitlog.stop() == 0, commitlog.logs()
    finally:
        for handle in (indexer, commitlog):
            if handle.running:
                handle.kill9()
