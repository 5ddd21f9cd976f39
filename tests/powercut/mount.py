"""Mount, cut and unmount the power-cut file system (powercut_fs.py) from a test.

``PowerCutMount(base)`` keeps BACKING (base/backing), MOUNT (base/mnt) and the journal's work folder
(base/work) on one file system. ``cut(before_unmount)`` is one power failure: freeze the file system,
run ``before_unmount`` (kill the processes using it: they die in the same instant), unmount, let the
file system rewrite BACKING to its durable state, mount it again.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tests.powercut.powercut_fs import FREEZE_NAME, FUSERMOUNT

REPO_ROOT = Path(__file__).resolve().parents[2]


def available() -> str | None:
    """None when a FUSE file system can be mounted here, else why not."""
    if not Path("/dev/fuse").exists():
        return "no /dev/fuse"
    if shutil.which(FUSERMOUNT) is None:
        return f"no {FUSERMOUNT} (Debian's fuse3; `make powercut-deps` installs it)"
    try:
        import mfusepy  # noqa: F401
    except (ImportError, OSError) as exc:
        return f"mfusepy cannot load libfuse3 ({exc}; `make powercut-deps` installs both)"
    return None


class PowerCutMount:
    def __init__(self, base: Path, mode: str = "drop", seed: int = 0) -> None:
        self.backing = base / "backing"
        self.mount = base / "mnt"
        self.work = base / "work"
        for folder in (self.backing, self.mount, self.work):
            folder.mkdir(parents=True, exist_ok=True)
        self.mode = mode
        self.seed = seed
        self.cuts = 0
        self.log_path = base / "powercut-fs.log"
        self.outcomes: list[str] = []
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 15.0) -> None:
        """Mount (the file system's process is started once and mounts again after each cut)."""
        if self._proc is None or self._proc.poll() is not None:
            args = [sys.executable, "-m", "tests.powercut.powercut_fs", str(self.backing), str(self.mount),
                    str(self.work), "--mode", self.mode, "--seed", str(self.seed)]
            with open(self.log_path, "ab") as log_file:
                self._proc = subprocess.Popen(args, cwd=REPO_ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                              stderr=log_file)
        assert self._proc.stdin is not None
        self._proc.stdin.write(b"mount\n")
        self._proc.stdin.flush()
        deadline = time.monotonic() + timeout_s
        while not _is_mounted(self.mount):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"the power-cut file system did not mount:\n{self.logs()}")
            time.sleep(0.005)

    def cut(self, before_unmount: Callable[[], None]) -> str:
        """A power failure: nothing that was not made durable survives. Returns what was dropped."""
        with contextlib.suppress(FileNotFoundError):  # the file system's answer: it is frozen now
            (self.mount / FREEZE_NAME).stat()
        before_unmount()
        self.cuts += 1
        return self._unmount_and_wait()

    def stop(self) -> None:
        """Unmount without a cut (everything stays as written)."""
        if self._proc is not None and self._proc.poll() is None and _is_mounted(self.mount):
            self._unmount_and_wait()

    def _unmount_and_wait(self, timeout_s: float = 60.0) -> str:
        assert self._proc is not None and self._proc.stdout is not None
        deadline = time.monotonic() + timeout_s
        while subprocess.run([FUSERMOUNT, "-u", str(self.mount)], capture_output=True, check=False).returncode:
            if not _is_mounted(self.mount) or time.monotonic() > deadline:
                break
            time.sleep(0.02)  # busy: a killed process's files are still being closed
        outcome = self._proc.stdout.readline().decode().strip()
        if not outcome:
            raise RuntimeError(f"the power-cut file system exited with {self._proc.wait(10)}:\n{self.logs()}")
        self.outcomes.append(outcome)
        return outcome

    def kill(self) -> None:
        subprocess.run([FUSERMOUNT, "-uz", str(self.mount)], capture_output=True, check=False)
        if self._proc is not None and self._proc.poll() is None:
            assert self._proc.stdin is not None
            self._proc.stdin.close()
            try:
                self._proc.wait(5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(10)

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def _is_mounted(path: Path) -> bool:
    target = str(path.resolve())
    with open("/proc/self/mounts") as mounts:
        return any(line.split()[1] == target for line in mounts)
