"""Fixtures of the query service tests: real commitlog, indexer and query processes on loopback.

``system``: one whole system on a fresh root for the test module (tests use their own topics so they
do not see each other's messages). Every process is stopped at teardown and must stop cleanly.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.query.query_process import System, running_system


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    with running_system(tmp_path_factory.mktemp("query-system")) as started:
        yield started
