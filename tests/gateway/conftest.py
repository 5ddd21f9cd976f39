"""Fixtures of the gateway tests: the whole system started by ``mqstore up`` (real processes).

``up``: one system for the test module; tests use their own topics so they do not see each other's
messages. It must stop cleanly (exit code 0, no abort file) at teardown.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.gateway.system_process import UpProcess, start_up


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpProcess]:
    started = start_up(tmp_path_factory.mktemp("up") / "store")
    try:
        yield started
    finally:
        try:
            code = started.stop()
            assert code == 0, f"mqstore up exited with {code}:\n{started.logs()[-5000:]}"
            assert not (started.store / "abort").exists(), "a clean stop must leave no abort file"
        finally:
            started.kill_all()
