"""A FUSE passthrough that forgets, at a power cut, everything that was not made durable.

Run as ``python -m tests.powercut.powercut_fs BACKING MOUNT WORK_DIR [--mode drop|torn] [--seed N]``, one
mount per line ``mount`` on stdin:
every call on MOUNT goes to the same path under BACKING at once (so the services read their own
writes), while a journal keeps what POSIX does not yet promise to keep (the strict rules, as on XFS
and as ALICE / CrashMonkey / LazyFS model them):

* file data: the bytes written since that file's last fsync/fdatasync (the old bytes of each 4 KiB
  page the first time it is overwritten, and the file's durable size);
* names: the entries of a directory as they were at its last fsync: a created, renamed or deleted
  name is durable only once its directory is fsynced (a deleted file is kept in WORK_DIR, not
  removed, until then).

A ``stat`` of MOUNT/.powercut-freeze is the power cut: every later change is refused with EIO. Once
MOUNT is unmounted (fusermount3 -u), the process rewrites BACKING to exactly the durable state and
exits: ``drop`` mode throws away every unsynced byte; ``torn`` mode keeps, per file, the unsynced bytes
before a random 512-byte sector boundary (a write torn where the power failed) and drops the rest.

What FUSE cannot see: dirty pages of a shared writable mmap reach this process only on writeback
(the kernel's flusher, an msync or an fsync). An fsync or msync of any range writes back and syncs the
whole file here (FUSE_FSYNC carries no range), so an msync over the wrong range looks durable here.
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import random
import shutil
import stat
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mfusepy

PAGE = 4096
SECTOR = 512
FREEZE_NAME = ".powercut-freeze"
FUSERMOUNT = "fusermount3"
log = logging.getLogger("powercut")


@dataclass
class FileJournal:
    """What of one file (one backing inode) is durable: its size and, per page overwritten since the
    last sync, the page's durable bytes."""

    durable_size: int
    undo: dict[int, bytes] = field(default_factory=dict)


class PowerCutFS(mfusepy.Operations):  # type: ignore[misc]
    use_ns = True

    def __init__(self, backing: Path, graveyard: Path) -> None:
        self.backing = backing
        self.graveyard = graveyard
        self.frozen = False
        self._lock = threading.RLock()
        self._graves = 0
        self.files: dict[int, FileJournal] = {}
        # Directory inode -> its durable entries (name -> inode); a directory never changed is as found.
        self.dirs: dict[int, dict[str, int]] = {}
        self.syncs = {"fsync": 0, "fsyncdir": 0}

    # -- journal -------------------------------------------------------------------------------
    def _real(self, path: str) -> str:
        return str(self.backing) + path

    def _changing(self) -> None:
        if self.frozen:
            raise mfusepy.FuseOSError(errno.EIO)

    def _file(self, ino: int, real: str | int) -> FileJournal:
        journal = self.files.get(ino)
        if journal is None:  # untouched since the mount: all of it is durable
            size = os.fstat(real).st_size if isinstance(real, int) else os.lstat(real).st_size
            journal = self.files[ino] = FileJournal(size)
        return journal

    def _dir_before_change(self, real_dir: str) -> None:
        ino = os.lstat(real_dir).st_ino
        if ino not in self.dirs:
            self.dirs[ino] = _listing(real_dir)

    def _save_pages(self, fd: int, journal: FileJournal, start: int, end: int) -> None:
        """Keep the durable bytes of the pages [start, end) touches, the first time each is changed."""
        end = min(end, journal.durable_size)
        for page in range(start // PAGE, -(-end // PAGE)):
            if page not in journal.undo:
                journal.undo[page] = os.pread(fd, PAGE, page * PAGE)

    def _bury(self, real: str) -> None:
        """Move a removed or replaced file aside: its name may still be durable in some directory."""
        self._graves += 1
        os.rename(real, self.graveyard / f"{self._graves}")

    # -- names ---------------------------------------------------------------------------------
    def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
        if path == "/" + FREEZE_NAME:
            self.frozen = True
            log.info("power cut: every later change is refused")
            raise mfusepy.FuseOSError(errno.ENOENT)
        st = os.fstat(fh) if fh is not None else os.lstat(self._real(path))
        return {key: getattr(st, key) for key in (
            "st_mode", "st_nlink", "st_uid", "st_gid", "st_size", "st_atime_ns", "st_mtime_ns", "st_ctime_ns",
            "st_ino", "st_blocks")} | {"st_atime": st.st_atime_ns, "st_mtime": st.st_mtime_ns,
                                       "st_ctime": st.st_ctime_ns}

    def readdir(self, path: str, fh: int) -> list[str]:
        return [".", "..", *os.listdir(self._real(path))]

    def access(self, path: str, amode: int) -> int:
        if not os.access(self._real(path), amode):
            raise mfusepy.FuseOSError(errno.EACCES)
        return 0

    def statfs(self, path: str) -> dict[str, int]:
        st = os.statvfs(self._real(path))
        return {key: getattr(st, key) for key in (
            "f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree", "f_files", "f_flag",
            "f_frsize", "f_namemax")}

    def mkdir(self, path: str, mode: int) -> int:
        with self._lock:
            self._changing()
            real = self._real(path)
            self._dir_before_change(os.path.dirname(real))
            os.mkdir(real, mode)
            self.dirs[os.lstat(real).st_ino] = {}
        return 0

    def rmdir(self, path: str) -> int:
        with self._lock:
            self._changing()
            real = self._real(path)
            if os.listdir(real):
                raise mfusepy.FuseOSError(errno.ENOTEMPTY)
            self._dir_before_change(os.path.dirname(real))
            self._bury(real)
        return 0

    def unlink(self, path: str) -> int:
        with self._lock:
            self._changing()
            real = self._real(path)
            self._dir_before_change(os.path.dirname(real))
            self._file(os.lstat(real).st_ino, real)
            self._bury(real)
        return 0

    def rename(self, old: str, new: str) -> int:
        with self._lock:
            self._changing()
            real_old, real_new = self._real(old), self._real(new)
            self._dir_before_change(os.path.dirname(real_old))
            self._dir_before_change(os.path.dirname(real_new))
            if os.path.lexists(real_new):
                target = os.lstat(real_new)
                if stat.S_ISDIR(target.st_mode) and os.listdir(real_new):
                    raise mfusepy.FuseOSError(errno.ENOTEMPTY)
                if not stat.S_ISDIR(target.st_mode):
                    self._file(target.st_ino, real_new)
                self._bury(real_new)
            os.rename(real_old, real_new)
        return 0

    def fsyncdir(self, path: str, datasync: int, fh: int) -> int:
        with self._lock:
            self._changing()
            real = self._real(path)
            self.dirs[os.lstat(real).st_ino] = _listing(real)
            self.syncs["fsyncdir"] += 1
        return 0

    def chmod(self, path: str, mode: int) -> int:
        os.chmod(self._real(path), mode)
        return 0

    def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
        os.utime(self._real(path), ns=times)
        return 0

    # -- data ----------------------------------------------------------------------------------
    def create(self, path: str, mode: int, fi: Any = None) -> int:
        with self._lock:
            self._changing()
            real = self._real(path)
            self._dir_before_change(os.path.dirname(real))
            existed = os.path.lexists(real)
            fd = os.open(real, os.O_RDWR | os.O_CREAT, mode)
            if not existed:
                self.files[os.fstat(fd).st_ino] = FileJournal(0)
        return fd

    def open(self, path: str, flags: int) -> int:
        with self._lock:
            real = self._real(path)
            # Read access too: the journal reads the old bytes of a page before a write changes it. The
            # kernel passes appends as writes at the end, so O_APPEND is not needed here.
            access = os.O_RDONLY if flags & os.O_ACCMODE == os.O_RDONLY else os.O_RDWR
            fd = os.open(real, access | (flags & ~(os.O_ACCMODE | os.O_TRUNC | os.O_CREAT | os.O_EXCL | os.O_APPEND)))
            if flags & os.O_TRUNC:
                self._changing()
                self._truncate(fd, 0)
        return fd

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        return os.pread(fh, size, offset)

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        with self._lock:
            self._changing()
            journal = self._file(os.fstat(fh).st_ino, fh)
            self._save_pages(fh, journal, offset, offset + len(data))
            return os.pwrite(fh, data, offset)

    def truncate(self, path: str, length: int, fh: int | None = None) -> int:
        with self._lock:
            self._changing()
            fd = fh if fh is not None else os.open(self._real(path), os.O_RDWR)
            try:
                self._truncate(fd, length)
            finally:
                if fh is None:
                    os.close(fd)
        return 0

    def _truncate(self, fd: int, length: int) -> None:
        journal = self._file(os.fstat(fd).st_ino, fd)
        self._save_pages(fd, journal, length, journal.durable_size)
        os.ftruncate(fd, length)

    def fallocate(self, path: str, mode: int, offset: int, size: int, fh: int) -> int:
        if mode != 0:  # hole punching: the caller writes zeros instead
            raise mfusepy.FuseOSError(errno.EOPNOTSUPP)
        with self._lock:
            self._changing()
            self._file(os.fstat(fh).st_ino, fh)
            os.posix_fallocate(fh, offset, size)
        return 0

    def fsync(self, path: str, datasync: int, fh: int) -> int:
        with self._lock:
            self._changing()
            journal = self._file(os.fstat(fh).st_ino, fh)
            journal.undo.clear()
            journal.durable_size = os.fstat(fh).st_size
            self.syncs["fsync"] += 1
        return 0

    def flush(self, path: str, fh: int) -> int:
        return 0

    def release(self, path: str, fh: int) -> int:
        os.close(fh)
        return 0

    def flock(self, path: str, fh: int, op: int) -> int:
        return 0  # one process per store at a time here: the store's own lock has nothing to guard


def _listing(real_dir: str) -> dict[str, int]:
    return {entry.name: entry.inode() for entry in os.scandir(real_dir)}


# -- the cut ------------------------------------------------------------------------------------
def apply_cut(fs: PowerCutFS, mode: str, rng: random.Random, work: Path) -> dict[str, int]:
    """Rewrite ``fs.backing`` to the durable state. Returns counts of what was thrown away."""
    locations = _locations(fs.backing, fs.graveyard)
    plan: list[tuple[str, int, bool]] = []  # (relative path, inode, is a directory), parents first
    _plan(fs, fs.backing, os.lstat(fs.backing).st_ino, "", locations, plan)
    lost = {"files": 0, "bytes": 0, "names": 0}
    for ino, journal in fs.files.items():
        real = locations.get(ino)
        if real is not None and not os.path.isdir(real):
            lost["bytes"] += _roll_back(real, journal, mode, rng)
    fresh = work / "durable"
    shutil.rmtree(fresh, ignore_errors=True)
    fresh.mkdir()
    placed: set[int] = set()
    for rel, ino, is_dir in plan:
        target = fresh / rel
        if is_dir:
            target.mkdir()
        elif ino in placed:
            os.link(fresh / _first_path(plan, ino), target)
        else:
            os.rename(locations[ino], target)
            placed.add(ino)
    dropped = sorted(os.path.relpath(real, fs.backing) for ino, real in locations.items()
                     if not os.path.isdir(real) and ino not in placed and os.path.lexists(real)
                     and not real.startswith(str(fs.graveyard)))
    lost["names"] = len(dropped)
    if dropped:
        log.info("names dropped (never made durable in their directory): %s", ", ".join(dropped[:20]))
    old = work / "before-cut"
    shutil.rmtree(old, ignore_errors=True)
    os.rename(fs.backing, old)
    os.rename(fresh, fs.backing)
    shutil.rmtree(old)
    shutil.rmtree(fs.graveyard)
    return lost


def _first_path(plan: list[tuple[str, int, bool]], ino: int) -> str:
    return next(rel for rel, i, is_dir in plan if i == ino and not is_dir)


def _locations(backing: Path, graveyard: Path) -> dict[int, str]:
    found: dict[int, str] = {}
    for top in (backing, graveyard):
        for root, dirs, files in os.walk(top):
            for name in dirs + files:
                real = os.path.join(root, name)
                found.setdefault(os.lstat(real).st_ino, real)
    return found


def _plan(fs: PowerCutFS, real_dir: str | Path, ino: int, rel: str, locations: dict[int, str],
          plan: list[tuple[str, int, bool]]) -> None:
    entries = fs.dirs.get(ino)
    if entries is None:
        entries = _listing(str(real_dir))
    for name, child in sorted(entries.items()):
        real = locations.get(child)
        if real is None:
            log.warning("durable name %s/%s has no inode left", rel, name)
            continue
        child_rel = f"{rel}/{name}" if rel else name
        is_dir = os.path.isdir(real)
        plan.append((child_rel, child, is_dir))
        if is_dir:
            _plan(fs, real, child, child_rel, locations, plan)


def _roll_back(real: str, journal: FileJournal, mode: str, rng: random.Random) -> int:
    """Put the file's durable bytes back; ``torn`` keeps the unsynced bytes before a random sector."""
    size = os.lstat(real).st_size
    dirty = [page * PAGE for page in journal.undo]
    if size > journal.durable_size:
        dirty.append(journal.durable_size)
    if not dirty:
        return 0
    keep_before = 0
    if mode == "torn":
        low, high = min(dirty), max(size, journal.durable_size)
        keep_before = rng.randrange(low // SECTOR, high // SECTOR + 1) * SECTOR
    lost = 0
    fd = os.open(real, os.O_RDWR)
    try:
        for page, old in journal.undo.items():
            start = max(page * PAGE, keep_before)
            end = page * PAGE + len(old)
            if start < end:
                os.pwrite(fd, old[start - page * PAGE:], start)
                lost += end - start
        new_size = max(journal.durable_size, min(size, keep_before))
        lost += max(0, size - new_size)
        os.ftruncate(fd, new_size)
    finally:
        os.close(fd)
    return lost


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("backing", type=Path)
    parser.add_argument("mount", type=Path)
    parser.add_argument("work", type=Path, help="a folder on BACKING's file system for the journal's files")
    parser.add_argument("--mode", choices=("drop", "torn"), default="drop")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="powercut-fs %(message)s", stream=sys.stderr)
    rng = random.Random(args.seed)
    # One mount per line on stdin ("mount"), so a campaign pays for this process's start once; each
    # ends with one line on stdout saying what the unmount (or cut) did. End of input: exit.
    for command in sys.stdin:
        if command.strip() != "mount":
            continue
        print(mount_once(args.backing.resolve(), args.mount, args.work, args.mode, rng), flush=True)
    return 0


def mount_once(backing: Path, mount: Path, work: Path, mode: str, rng: random.Random) -> str:
    """Mount until unmounted; then, if the power was cut, rewrite BACKING to its durable state."""
    graveyard = work / "graveyard"
    shutil.rmtree(graveyard, ignore_errors=True)
    graveyard.mkdir(parents=True)
    fs = PowerCutFS(backing, graveyard)
    try:
        mfusepy.FUSE(fs, str(mount), foreground=True, nothreads=False, attr_timeout=0, entry_timeout=0,
                     negative_timeout=0)
    except RuntimeError as exc:
        if not fs.frozen:
            raise
        # Now and then the kernel ends a frozen mount's connection as aborted ("reading device: Software
        # caused connection abort") instead of as unmounted. The freeze came first, so the journal
        # holds every change the mount took: the cut goes on; the dead mount is taken away first.
        log.warning("the connection ended with error %s after the freeze: cutting all the same", exc)
        subprocess.run([FUSERMOUNT, "-uz", str(mount)], capture_output=True, check=False)
    if not fs.frozen:
        shutil.rmtree(graveyard)
        return "unmounted: no cut"
    lost = apply_cut(fs, mode, rng, work)
    return (f"cut ({mode}): {lost['bytes']} unsynced bytes and {lost['names']} undurable names dropped; "
            f"{fs.syncs['fsync']} fsyncs, {fs.syncs['fsyncdir']} directory fsyncs")


if __name__ == "__main__":
    sys.exit(main())
