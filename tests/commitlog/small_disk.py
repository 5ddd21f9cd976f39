"""A real, small filesystem for disk-full tests: tmpfs of a few tens of MiB, else an ext4 loop file.

Both need root (CI runs as root). Where neither can be mounted the test is skipped with the reason;
a mounted filesystem is always unmounted at the end, lazily if a process still holds it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

MIB = 1024 * 1024


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)


def _mount_tmpfs(target: Path, size_mib: int) -> str | None:
    done = _run("mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", str(target))
    return None if done.returncode == 0 else f"mount -t tmpfs: {done.stderr.strip()}"


def _mount_loop_ext4(target: Path, image: Path, size_mib: int) -> str | None:
    if shutil.which("mkfs.ext4") is None:
        return "mkfs.ext4 is not installed"
    with open(image, "wb") as file:
        file.truncate(size_mib * MIB)
    made = _run("mkfs.ext4", "-q", "-F", "-m", "0", str(image))
    if made.returncode != 0:
        return f"mkfs.ext4: {made.stderr.strip()}"
    done = _run("mount", "-o", "loop", str(image), str(target))
    return None if done.returncode == 0 else f"mount -o loop: {done.stderr.strip()}"


@contextlib.contextmanager
def small_filesystem(base: Path, size_mib: int) -> Iterator[Path]:
    """Mount a filesystem of ``size_mib`` MiB at ``base/disk`` and yield that path."""
    target = base / "disk"
    target.mkdir(parents=True)
    if os.geteuid() != 0:
        pytest.skip("mounting a small filesystem needs root (CI runs these tests as root)")
    tmpfs_failed = _mount_tmpfs(target, size_mib)
    if tmpfs_failed is not None:
        loop_failed = _mount_loop_ext4(target, base / "disk.img", size_mib)
        if loop_failed is not None:
            pytest.skip(f"cannot mount a small filesystem here: {tmpfs_failed}; {loop_failed}")
    try:
        yield target
    finally:
        if _run("umount", str(target)).returncode != 0:
            _run("umount", "-l", str(target))


def fill(path: Path, leave_bytes: int) -> int:
    """Grow the ballast file ``path`` until its filesystem has about ``leave_bytes`` free (another
    tenant of the disk); returns the bytes added."""
    st = os.statvfs(path.parent)
    want = st.f_bavail * st.f_frsize - leave_bytes
    if want <= 0:
        return 0
    with open(path, "ab") as file:
        try:
            file.write(b"\0" * want)  # written, not sparse: the blocks are really taken
            file.flush()
        except OSError:
            pass  # a full disk: as full as it gets
    return want


def until_accepted(call: Callable[[], object], timeout_s: float) -> None:
    """Repeat ``call`` while the store still refuses it as full (it sees freed space within a second
    or so); any other error, or a refusal past the timeout, fails."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            call()
            return
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and time.monotonic() < deadline, exc
            time.sleep(0.1)
