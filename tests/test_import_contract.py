"""The service boundaries hold (``make lint`` runs the same contract), and the contract can fail:
on a copy of the code where a gateway module imports the commitlog service's package, it breaks."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("services", "gateway", "pipeline", "mqstore_client")


def _lint_imports(cwd: Path) -> subprocess.CompletedProcess[str]:
    script = Path(sys.executable).with_name("lint-imports")
    return subprocess.run([str(script)], cwd=cwd, capture_output=True, text=True, timeout=120, check=False)


def _copy_code(dest: Path) -> None:
    for package in PACKAGES:
        shutil.copytree(ROOT / package, dest / package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copy(ROOT / "pyproject.toml", dest / "pyproject.toml")


def test_the_code_keeps_the_contract() -> None:
    done = _lint_imports(ROOT)
    assert done.returncode == 0, done.stdout[-4000:]


def test_the_contract_breaks_when_the_gateway_imports_a_service(tmp_path: Path) -> None:
    _copy_code(tmp_path)
    assert _lint_imports(tmp_path).returncode == 0, "the copy must start clean"
    route = tmp_path / "gateway" / "route.py"
    route.write_text(route.read_text() + "\nimport services.commitlog.commit_log  # noqa: E402,F401\n")
    done = _lint_imports(tmp_path)
    assert done.returncode != 0
    assert "gateway is not allowed to import services.commitlog" in done.stdout
    assert "gateway.route -> services.commitlog.commit_log" in done.stdout
