"""What ``mqstore up`` prints when it is up: commands a user can paste into their own shell, whatever
directory ``up`` was started from (``make -C repo run`` starts it in the repository, not in the shell's
directory)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from services import runner


def test_the_try_lines_name_the_venvs_commands_by_absolute_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # the shell finds neither mqstore nor grpcurl
    monkeypatch.chdir(tmp_path)  # and runs in another directory than the venv's
    runner._print_welcome("127.0.0.1:9876", tmp_path / "store", None)
    out = capsys.readouterr().out
    mqstore = Path(sys.executable).parent / "mqstore"
    assert f"try:      {mqstore.absolute()} send --topic demo" in out
    line = next(line for line in out.splitlines() if " send " in line)
    assert os.path.isabs(line.split()[1]) and Path(line.split()[1]).exists()
