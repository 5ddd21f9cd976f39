"""``mqstore up`` starts its children held (services/held_start.py): each imports its service's modules at
once and starts only when released, so the imports overlap while the services still start in order."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.commitlog.commitlog_process import free_port


def _held(store: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "services.held_start", "serve", "commitlog", "--store", str(store),
                             "--listen", f"127.0.0.1:{free_port()}"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def test_a_held_child_whose_input_ends_exits_without_starting(tmp_path: Path) -> None:
    proc = _held(tmp_path / "store")
    output, _ = proc.communicate(b"", timeout=60)
    assert proc.returncode == 0, output.decode(errors="replace")
    assert not (tmp_path / "store").exists(), "the service started although it was never released"


def test_a_released_child_runs_its_service(tmp_path: Path) -> None:
    proc = _held(tmp_path / "store")
    try:
        assert proc.stdin is not None
        proc.stdin.write(b"go\n")
        proc.stdin.close()
        assert proc.stdout is not None
        for line in proc.stdout:
            if b"listening on" in line:
                break
        else:
            raise AssertionError(f"the commitlog exited with {proc.wait()} before it listened")
        assert (tmp_path / "store" / "commitlog").is_dir()
    finally:
        proc.terminate()
        proc.wait(60)
