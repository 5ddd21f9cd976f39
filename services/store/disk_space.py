"""How full a store's disk is, phrased for a refusal: which disk, how much of it is used.

Used space is counted as RocketMQ counts it (``UtilAll.getDiskPartitionSpaceUsedPercent``: total
minus the blocks that are free), free space as what an unprivileged write may still take
(``f_bavail``: the root-reserved blocks of ext4 excluded). A write that fails with ENOSPC or EDQUOT
becomes a :class:`DiskFullError` carrying the same description, so every "disk full" a caller sees
reads alike, whichever check caught it.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from pathlib import Path

from services.store.errors import DiskFullError

MIB = 1024 * 1024
_DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


@dataclass(slots=True, frozen=True)
class DiskUsage:
    path: Path
    mount_point: Path
    total: int
    used: int
    available: int

    @property
    def ratio(self) -> float:
        """Used share of the disk, 0..1 (RocketMQ's physic ratio)."""
        return self.used / self.total if self.total else 0.0

    def describe(self) -> str:
        return (f"the disk of {self.path} (mounted at {self.mount_point}) is {self.ratio * 100:.1f}% used "
                f"({self.used / MIB:.1f} of {self.total / MIB:.1f} MiB, {self.available / MIB:.1f} MiB free)")


def mount_point(path: Path) -> Path:
    """The mount point of the filesystem holding ``path`` (which must exist)."""
    current = path.resolve()
    while not os.path.ismount(current):
        current = current.parent
    return current


def disk_usage(path: Path, mount: Path | None = None) -> DiskUsage:
    """One statvfs of ``path``: a few microseconds, cheap enough to repeat every second."""
    st = os.statvfs(path)
    total = st.f_blocks * st.f_frsize
    return DiskUsage(path, mount or mount_point(path), total, total - st.f_bfree * st.f_frsize,
                     st.f_bavail * st.f_frsize)


def allocated_bytes(path: Path) -> int:
    """Bytes of ``path`` that have disk blocks (a sparse file's holes have none)."""
    return os.stat(path).st_blocks * 512


def unallocated_bytes(path: Path, size: int) -> int:
    """Bytes of the ``size``-byte file ``path`` that have no disk blocks yet (a sparse file's holes):
    what writing all of it may still take."""
    return max(0, size - os.stat(path).st_blocks * 512)


def is_disk_full(exc: OSError) -> bool:
    return exc.errno in _DISK_FULL_ERRNOS


def disk_full_error(path: Path, what: str, exc: OSError | None = None) -> DiskFullError:
    """The refusal of ``what`` (e.g. "creating commitlog file 000...") because the disk of ``path``
    is full; says how full, and that nothing of the write remains."""
    try:
        usage = disk_usage(path).describe()
    except OSError:
        usage = f"the disk of {path} cannot be inspected"
    cause = f" ({os.strerror(exc.errno)})" if exc is not None and exc.errno else ""
    return DiskFullError(f"disk full: {what} failed{cause}: {usage}; nothing was written. Free space on that "
                         "disk; writes resume by themselves")
