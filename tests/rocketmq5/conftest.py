"""Fixtures of the RocketMQ 5 protocol tests: ``up``, one ``mqstore up`` per test module (real processes)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.gateway.system_process import UpProcess, running_up


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpProcess]:
    with running_up(tmp_path_factory.mktemp("up") / "store") as started:
        yield started
