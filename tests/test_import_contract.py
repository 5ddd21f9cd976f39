"""The service boundaries hold (``make lint`` runs the same contract), and the contract can fail:
on a copy of the code where a gateway module imports the commitlog service's package, it breaks."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The import contract's root packages: each module's file is at the path its name says.
PACKAGES = ("services", "gateway", "pipeline", "mqstore/client")


def _lint_imports(cwd: Path, pythonpath: Path | None = None) -> subprocess.CompletedProcess[str]:
    script = Path(sys.executable).with_name("lint-imports")
    env = dict(os.environ)
    if pythonpath is not None:
        # The copy comes before the checkout (the editable install's .pth) on sys.path.
        env["PYTHONPATH"] = str(pythonpath)
    return subprocess.run([str(script)], cwd=cwd, capture_output=True, text=True, timeout=120, check=False, env=env)


def _copy_code(dest: Path) -> Path:
    """The packages under dest/src/ (the checkout's layout) and pyproject.toml."""
    src = dest / "src"
    for folder in PACKAGES:
        shutil.copytree(ROOT / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copy(ROOT / "pyproject.toml", dest / "pyproject.toml")
    return src


def test_the_code_keeps_the_contract() -> None:
    done = _lint_imports(ROOT)
    assert done.returncode == 0, done.stdout[-4000:]


def test_the_contract_breaks_when_the_gateway_imports_a_service(tmp_path: Path) -> None:
    src = _copy_code(tmp_path)
    assert _lint_imports(tmp_path, tmp_path / "src").returncode == 0, "the copy must start clean"
    route = src / "gateway" / "route.py"
    route.write_text(route.read_text() + "\nimport services.commitlog.commit_log  # noqa: E402,F401\n")
    done = _lint_imports(tmp_path, tmp_path / "src")
    assert done.returncode != 0
    assert "gateway is not allowed to import services.commitlog" in done.stdout
    assert "gateway.route -> services.commitlog.commit_log" in done.stdout
