"""``fs``: a mounted power-cut file system (tests/powercut/powercut_fs.py) for one test, unmounted after."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.powercut.mount import PowerCutMount


@pytest.fixture
def fs(tmp_path: Path) -> Iterator[PowerCutMount]:
    mount = PowerCutMount(tmp_path / "fs")
    mount.start()
    yield mount
    mount.kill()
