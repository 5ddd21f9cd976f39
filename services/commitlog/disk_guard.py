"""The commitlog's disk-full watermark: refuse writes before the disk runs out, accept them again after.

RocketMQ 4.9.8 marks its store "disk full" (``CleanCommitLogService.isSpaceFull`` ->
``runningFlags.getAndMakeDiskFull``) when the commitlog's disk is more than
``diskSpaceWarningLevelRatio`` (0.90) used, refuses puts while the mark is set, and clears it when a
later check finds the disk below. It checks every 10 s, and a commitlog file takes its space only
when it is created, so a burst between two checks can still run the disk out and fail a file
creation (ENOSPC). Here:

* the state is cached: the put path reads one field;
* it is refreshed every second (the clean-commitlog thread) and right before a commitlog file is created;
* space is reserved only if it fits: in the free space, and without taking the disk past the
  ratio. Commitlog files are sparse, and their blocks are reserved (fallocate) a step
  (reserveAheadCommitLog) ahead of the write position, a new file's first step when it is created:
  reserving is the only way the commitlog takes new space, its appends then only fill it, so the
  store's own writes never meet ENOSPC. A background
  pre-allocation that does not fit is skipped; a roll that needs a file that does not fit is refused
  and marks the disk full until a refresh finds room for the file.

Writes racing in from elsewhere (another tenant of the disk) are caught where the file is created
(``MappedFileQueue``) and refused the same way.

What the commitlog acknowledges, the indexer must still write (ConsumeQueue units, index entries,
checkpoints), so the disk must keep room for that too: the *headroom* (``indexer_headroom.py``),
measured at every refresh. Writes are refused while the free space is below it, commitlog space is
reserved only if it fits next to it, and between refreshes every ConsumeQueue page a put starts is
charged against it (checked before the put when the room left is tight): the indexer is never the
first to meet ENOSPC.

A *hold* refuses writes below that ratio too: with ``protectUnconsumedData`` the cleaner
(``clean_commitlog.py``) holds the disk when it would have to delete a file consumer groups have not
consumed. A hold lasts until it is released (the cleaner could delete the file after all) or a
refresh finds the disk at or below the ratio it was set for (space was freed).
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from services.commitlog.indexer_headroom import NO_HEADROOM, Headroom, IndexerHeadroom
from services.store.disk_space import MIB, DiskUsage, disk_usage, mount_point
from services.store.errors import DiskFullError

log = logging.getLogger(__name__)


class DiskGuard:
    def __init__(self, path: Path, warning_ratio: float, file_size: int,
                 headroom: IndexerHeadroom | None = None) -> None:
        """``path``: the commitlog directory (it must exist before the first refresh). ``file_size``:
        what the commitlog takes at once, a new file's first reservation or the next one ahead of the
        writer (reserveAheadCommitLog). ``headroom`` measures the room the indexer needs (None: none
        is kept)."""
        self.path = path
        self.warning_ratio = warning_ratio
        self.file_size = file_size
        self._headroom_source = headroom
        self.headroom = NO_HEADROOM
        # ConsumeQueue page bytes the puts since the last measure started (the indexer may not have
        # written them yet, so the disk's usage does not show them).
        self._charged = 0
        self._mount: Path | None = None
        self.usage: DiskUsage | None = None
        # The clean-commitlog thread, the allocator thread and a rolling put may update the state at once.
        self._lock = threading.Lock()
        # A roll waits for a file that did not fit: full until a refresh finds room for it.
        self._file_needed = False
        # A hold: (why, the used ratio it lasts above), or None.
        self._hold: tuple[str, float] | None = None
        # The refusal while the disk is full, None while writes are accepted. Replaced whole, never
        # mutated, so the put path reads it without a lock.
        self._refusal: str | None = None

    @property
    def full(self) -> bool:
        return self._refusal is not None

    def check_writable(self) -> None:
        """The put path's check: the cached state only."""
        refusal = self._refusal
        if refusal is not None:
            raise DiskFullError(refusal)

    def check_new_file(self, needed: bool) -> None:
        """Before a commitlog file is created or reserves space ahead of the writer: refresh, and raise
        DiskFullError if the reservation does not fit. ``needed``: a put waits for it (a roll, a
        reservation), rather than a background pre-allocation."""
        usage = self._read_usage()
        if usage is None:
            return  # cannot tell: let the creation try (ENOSPC is caught there)
        headroom = self._measure()
        with self._lock:
            self._set_headroom(headroom)
            reason = self._ratio_reason(usage) or self._file_reason(usage)
            if reason is None:
                self._file_needed = False
            elif needed:
                self._file_needed = True
            self._update(usage)
        if reason is not None:
            raise DiskFullError(_refusal(reason, usage))

    def hold(self, why: str, while_above: float, usage: DiskUsage) -> None:
        """Refuse writes for ``why`` (it names what holds the space and how to free it) while the
        disk stays more than ``while_above`` used, or until :meth:`release`."""
        with self._lock:
            self._hold = why, while_above
            self._update(usage)

    def release(self) -> None:
        """End a hold (nothing if there is none)."""
        with self._lock:
            if self._hold is None:
                return
            self._hold = None
            if self.usage is not None:
                self._update(self.usage)

    @property
    def held(self) -> bool:
        return self._hold is not None

    def refresh(self) -> DiskUsage | None:
        """Read the disk's usage and update the state; None (state kept) if it cannot be read."""
        usage = self._read_usage()
        if usage is not None:
            headroom = self._measure()
            with self._lock:
                self._set_headroom(headroom)
                self._update(usage)
        return usage

    # -- the indexer's headroom ------------------------------------------------------------------
    def _measure(self) -> Headroom:
        if self._headroom_source is None:
            return NO_HEADROOM
        try:
            return self._headroom_source.measure()
        except OSError as exc:
            log.warning("cannot measure the room the indexer needs (%s): keeping the last measure", exc)
            return self.headroom

    def _set_headroom(self, headroom: Headroom) -> None:
        """Under the lock: a new measure, which sees every ConsumeQueue page charged before it."""
        self.headroom, self._charged = headroom, 0

    def queue_pages_tight(self, messages: int) -> bool:
        """Whether ``messages`` messages could start more ConsumeQueue pages than the disk has room for
        (then :meth:`check_queue_pages` must count them before they are written)."""
        usage, cost = self.usage, self.headroom.queue_page_size
        return bool(cost) and usage is not None and \
            self.headroom.total + self._charged + messages * cost > usage.available

    def check_queue_pages(self, count: int) -> None:
        """Before a put that starts ``count`` ConsumeQueue pages: DiskFullError if they do not fit."""
        usage, cost = self.usage, count * self.headroom.queue_page_size
        if cost and usage is not None and self.headroom.total + self._charged + cost > usage.available:
            raise DiskFullError(_refusal(
                f"{usage.describe()}: the {count} new ConsumeQueue pages of these messages "
                f"({cost / 1024:.0f} KiB) do not fit next to {self.headroom.describe()}", usage, SHRINK_HEADROOM))

    def charge_queue_pages(self, count: int) -> None:
        """After a put that started ``count`` ConsumeQueue pages: their room is taken until the next
        measure sees them; the next puts are refused once the headroom is no longer there."""
        cost = count * self.headroom.queue_page_size
        if cost:
            with self._lock:
                self._charged += cost
                if self.usage is not None:
                    self._update(self.usage)

    def _read_usage(self) -> DiskUsage | None:
        try:
            if self._mount is None:
                self._mount = mount_point(self.path)
            return disk_usage(self.path, self._mount)
        except OSError as exc:
            log.warning("cannot read the usage of the disk of %s: %s", self.path, exc)
            return None

    def _update(self, usage: DiskUsage) -> None:
        """Under the lock: the refusal for ``usage`` (and the file the last roll needed, if any, and
        the hold, if any)."""
        if self._hold is not None and usage.ratio <= self._hold[1]:
            log.info("the hold on writes ends: %s, not above %.2f any more", usage.describe(), self._hold[1])
            self._hold = None
        reason, setting = self._ratio_reason(usage), RAISE_RATIO
        if reason is None:
            reason, setting = self._headroom_reason(usage), SHRINK_HEADROOM
        if reason is None and self._file_needed:
            reason, setting = self._file_reason(usage), RAISE_RATIO
            if reason is None:
                self._file_needed = False
        if self._hold is not None:
            why, ratio = self._hold
            reason = f"{reason or _held_reason(ratio, usage)}; {why}"
        refusal = None if reason is None else _refusal(reason, usage, UNPROTECT if self._hold is not None else setting)
        if (refusal is None) != (self._refusal is None):
            if refusal is not None:
                log.error("refusing writes: %s", reason)
            else:
                log.warning("accepting writes again: %s", usage.describe())
        self.usage, self._refusal = usage, refusal

    def _ratio_reason(self, usage: DiskUsage) -> str | None:
        if usage.ratio > self.warning_ratio:
            return f"{usage.describe()}, above diskSpaceWarningLevelRatio {self.warning_ratio:.2f}"
        return None

    def _headroom_reason(self, usage: DiskUsage) -> str | None:
        """Why the free space is too little for what the indexer must still write, None if it is not."""
        needed = self.headroom.total + self._charged
        if not needed or usage.available >= needed:
            return None
        started = f" and the {self._charged / MIB:.1f} MiB of ConsumeQueue pages the last writes started" \
            if self._charged else ""
        return f"{usage.describe()}, less than {self.headroom.describe()}{started}"

    def _file_reason(self, usage: DiskUsage) -> str | None:
        """Why the next commitlog file cannot be created now, None if it can."""
        file_mib = self.file_size / MIB
        kept = self.headroom.total + self._charged
        if usage.available < self.file_size + kept:
            beside = f" next to {self.headroom.describe()}" if kept else ""
            return f"{usage.describe()}: the next {file_mib:.1f} MiB commitlog file reservation does not fit{beside}"
        if usage.total and (usage.used + self.file_size) / usage.total > self.warning_ratio:
            return (f"{usage.describe()}: the next {file_mib:.1f} MiB commitlog file reservation would take it past "
                    f"diskSpaceWarningLevelRatio {self.warning_ratio:.2f}")
        return None


def _held_reason(ratio: float, usage: DiskUsage) -> str:
    return f"{usage.describe()}, above diskSpaceCleanForciblyRatio {ratio:.2f}"


#: What else ends a refusal, besides freeing space, by what caused it.
RAISE_RATIO = "raise diskSpaceWarningLevelRatio"
SHRINK_HEADROOM = "lower mappedFileSizeConsumeQueue or maxIndexNum, or give the indexer's files a disk of their own"
UNPROTECT = "turn protectUnconsumedData off"


def _refusal(reason: str, usage: DiskUsage, setting: str = RAISE_RATIO) -> str:
    return (f"disk full: {reason}; nothing was written. Free space on {usage.mount_point} (or {setting}); "
            "writes resume by themselves once there is room")
