"""Fixtures that run the commitlog service as a real process (helpers in commitlog_process.py).

* ``start_commitlog(store_dir, env_overrides=None) -> CommitLogProcess``: per-test factory.
* ``module_start_commitlog``: the same, with processes living for the whole test module.
* ``commitlog``: one process on a fresh store for one test; ``module_commitlog``: one per module.

At teardown every process still running is stopped with SIGTERM and must exit 0 and leave no
``abort`` file (a clean stop). Processes a test stopped or killed itself are left alone.
Test modules import the helpers directly: ``from tests.commitlog.commitlog_process import CommitLogProcess``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.commitlog.commitlog_process import CommitLogProcess, Launcher, StartCommitLog


@pytest.fixture
def start_commitlog() -> Iterator[StartCommitLog]:
    launcher = Launcher()
    yield launcher
    launcher.stop_all()


@pytest.fixture(scope="module")
def module_start_commitlog() -> Iterator[StartCommitLog]:
    launcher = Launcher()
    yield launcher
    launcher.stop_all()


@pytest.fixture
def commitlog(start_commitlog: StartCommitLog, tmp_path: Path) -> CommitLogProcess:
    return start_commitlog(tmp_path / "store")


@pytest.fixture(scope="module")
def module_commitlog(module_start_commitlog: StartCommitLog,
                     tmp_path_factory: pytest.TempPathFactory) -> CommitLogProcess:
    return module_start_commitlog(tmp_path_factory.mktemp("commitlog") / "store")
