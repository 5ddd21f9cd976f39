"""The store root's guard files: ``lock`` (one process per store) and ``abort`` (exists while running).

An ``abort`` file found at start means the last run did not stop cleanly, which selects abnormal
recovery. The lock is an flock held for the life of the process; its content names the holder
so a second process can say who holds it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

LOCK_FILE = "lock"
ABORT_FILE = "abort"


class StoreLockedError(RuntimeError):
    """Another process holds the store's lock."""


class StoreLock:
    def __init__(self, root: Path) -> None:
        self.path = root / LOCK_FILE
        self._fd = -1

    def acquire(self) -> None:
        make_dirs(self.path.parent)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip() or "an unknown process"
            os.close(fd)
            raise StoreLockedError(f"store {self.path.parent} is locked by {holder}; "
                                   "stop that process or use another store directory") from None
        info = json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                           "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
        os.ftruncate(fd, 0)
        os.pwrite(fd, info.encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd >= 0:
            os.ftruncate(self._fd, 0)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = -1


class AbortFile:
    def __init__(self, root: Path) -> None:
        self.path = root / ABORT_FILE

    def exists(self) -> bool:
        return self.path.exists()

    def create(self) -> None:
        self.path.touch()
        fsync_dir(self.path.parent)

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)
        fsync_dir(self.path.parent)


def fsync_dir(path: Path) -> None:
    """Make a directory's entries (a created, renamed or removed file) durable. POSIX makes a new,
    renamed or removed name durable only with an fsync of its directory: an fsync of the file itself
    is not enough (XFS and others lose the name at a power cut; ext4 happens to keep it)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_dirs(path: Path) -> None:
    """``mkdir -p`` whose result survives a power cut: each directory created is made durable in its
    parent (the store root's parent included)."""
    missing: list[Path] = []
    while not path.is_dir():
        missing.append(path)
        path = path.parent
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):  # made meanwhile by another thread or process
            directory.mkdir()
        fsync_dir(directory.parent)


def created_durably(fd: int, path: Path) -> None:
    """Make a newly created file durable: its content and size (fsync) and its name (its directory)."""
    os.fsync(fd)
    fsync_dir(path.parent)


def remove_durably(path: Path) -> None:
    """Delete ``path`` (if there) so that it stays deleted after a power cut."""
    path.unlink(missing_ok=True)
    fsync_dir(path.parent)


T = TypeVar("T")


def read_with_backup(path: Path, parse: Callable[[bytes], T]) -> T | None:
    """``parse`` of ``path``'s bytes, else of its ``.bak`` (the previous version :func:`write_atomically`
    keeps: a file damaged by hand or by a disk is not the end of the state). None when neither exists;
    ValueError naming each file and its problem when neither parses."""
    errors: list[str] = []
    for candidate in (path, path.with_name(path.name + ".bak")):
        try:
            return parse(candidate.read_bytes())
        except FileNotFoundError:
            continue
        except (OSError, ValueError, KeyError, TypeError) as exc:
            errors.append(f"{candidate}: {exc}")
    if errors:
        raise ValueError("; ".join(errors))
    return None


def write_atomically(path: Path, data: bytes, keep_backup: bool = False) -> None:
    """Replace ``path`` so that a crash leaves either the old or the new content, never a mix.
    With ``keep_backup`` the previous content stays in ``path.bak`` (RocketMQ's ConfigManager habit).
    The steps are write a temporary file, fsync it, rename it over ``path``, fsync the directory:
    without the first fsync a power cut can leave the new name with no content, without the last
    the old content."""
    make_dirs(path.parent)
    if keep_backup and path.exists():
        backup = path.with_name(path.name + ".bak")
        _write_and_rename(backup, path.read_bytes())
    _write_and_rename(path, data)


def _write_and_rename(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        written = 0
        while written < len(data):  # a nearly full disk may take a write only in part
            written += os.write(fd, data[written:])
        os.fsync(fd)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a full disk: leave no partial .tmp behind
        raise
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)
