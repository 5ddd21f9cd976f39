"""Fixtures of the gateway tests: the whole system started by ``mqstore up`` (real processes).

``up``: one system for the test module; tests use their own topics so they do not see each other's
messages. It must stop cleanly (exit code 0, no abort file) at teardown.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.gateway.system_process import UpProcess, running_up


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpProcess]:
    with running_up(tmp_path_factory.mktemp("up") / "store") as started:
        yield started
