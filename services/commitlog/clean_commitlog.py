"""RocketMQ's CleanCommitLogService: when commitlog files are deleted, and what deleting one early costs.

RocketMQ 4.9.8 (``DefaultMessageStore.CleanCommitLogService``, every ``cleanResourceInterval``):

* it is time to delete at a ``deleteWhen`` hour ("04"), or whenever the disk is more than
  ``diskMaxUsedSpaceRatio`` (75%) used (``isSpaceToDelete``);
* then files last modified more than ``fileReservedTime`` (72 h) ago go, oldest first, at most 10 a
  round, never the last one (``deleteExpiredFileByTime``);
* above ``diskSpaceCleanForciblyRatio`` (0.85, a system property there, fixed here) or
  ``diskSpaceWarningLevelRatio`` it cleans immediately (``cleanImmediately``): the oldest files go
  whether their reserved time is over or not, consumed or not. Round after round this empties the log
  down to its last file, which is how a full disk loses acknowledged messages nobody has read yet.

Here ``protectUnconsumedData`` is on by default: a file that some group has not
consumed (or of which that cannot be told) is not deleted early. The cleaner holds the disk instead
(``DiskGuard.hold``): writes are refused with RESOURCE_EXHAUSTED naming the disk, its use and the
groups, and a WARNING says the same, until the groups commit past the file's messages (the next round
deletes it) or space is freed some other way. Files past their reserved time are deleted as always:
``fileReservedTime`` is the retention the store promises.

``protectUnconsumedData: false`` restores RocketMQ's forced cleaning, never silently: each file deleted
early is a WARNING naming it, its commitlog offsets and the consumer groups whose unconsumed messages
it held (``unconsumed.py`` reads the query service's committed offsets and the indexer's
ConsumeQueue), and is counted (``mqstore_commitlog_early_deleted_files``/``_bytes``).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from services.commitlog import metrics
from services.commitlog.disk_guard import DiskGuard
from services.store.config import MessageStoreConfig
from services.store.disk_space import MIB
from services.store.formats.mapped_file import MappedFile
from services.store.formats.mapped_file_queue import MappedFileQueue
from services.store.rules.unconsumed import Holders, UnconsumedReader
from services.store.service_thread import ServiceThread

log = logging.getLogger(__name__)

#: RocketMQ's ``rocketmq.broker.diskSpaceCleanForciblyRatio`` default: above it files go before
#: their reserved time.
DISK_SPACE_CLEAN_FORCIBLY_RATIO = 0.85
#: RocketMQ's MappedFileQueue.DELETE_FILES_BATCH_MAX: files deleted per round at most.
DELETE_FILES_BATCH_MAX = 10


class CommitLogCleaner:
    """Decides and carries out one cleaning round at a time (``CleanCommitLogService``'s)."""

    def __init__(self, config: MessageStoreConfig, mfq: MappedFileQueue, disk: DiskGuard, store_root: Path) -> None:
        self.config = config
        self.mfq = mfq
        self.disk = disk
        self.reader = UnconsumedReader(store_root)
        self.clean_at_once_ratio = min(DISK_SPACE_CLEAN_FORCIBLY_RATIO, config.disk_space_warning_level_ratio)
        self._hours = {int(h) for h in config.delete_when.split(";") if h.strip().isdigit()}
        self._hold_text = ""  # what the current hold says, so a repeated round does not log it again
        self._told_no_offsets = False

    def run(self, disk_used_ratio: float) -> list[MappedFile]:
        """One round at ``disk_used_ratio`` (0..1). Returns the files deleted."""
        cfg = self.config
        due = time.localtime().tm_hour in self._hours or disk_used_ratio * 100 > cfg.disk_max_used_space_ratio
        clean_at_once = disk_used_ratio > self.clean_at_once_ratio
        if not clean_at_once:
            self._release()
        if not (due or clean_at_once):
            return []
        holders: dict[int, Holders] = {}
        kept: list[tuple[MappedFile, Holders]] = []
        asked: dict[int, Holders] = {}

        def may_delete(mapped: MappedFile, expired: bool) -> bool:
            if expired:
                return True
            found = asked.get(mapped.file_from_offset)
            if found is None:
                found = self._ask(mapped, asked)
            if cfg.protect_unconsumed_data and found.holds:
                kept.append((mapped, found))
                return False
            holders[mapped.file_from_offset] = found
            return True

        expired_before = time.time() - cfg.file_reserved_time * 3600
        deleted = self.mfq.delete_expired_files(expired_before, clean_at_once, DELETE_FILES_BATCH_MAX, may_delete)
        for mapped in deleted:
            early = holders.get(mapped.file_from_offset)
            if early is None:
                log.info("deleted expired commitlog file %s (commitlog offsets [%d, %d))", mapped.path.name,
                         mapped.file_from_offset, mapped.file_tail_offset)
            else:
                self._tell_early(mapped, early, disk_used_ratio)
        if kept:
            self._hold(*kept[0], disk_used_ratio)
        elif clean_at_once and not deleted and len(self.mfq.files) > 1:
            log.warning("the disk is %.1f%% used, above %.2f, but no commitlog file could be deleted "
                        "(the oldest is not flushed yet)", disk_used_ratio * 100, self.clean_at_once_ratio)
        if not kept:
            self._release()
        return deleted

    def _ask(self, mapped: MappedFile, asked: dict[int, Holders]) -> Holders:
        """Who holds ``mapped``, asked together with the files after it this round may delete too (one
        pass over the ConsumeQueues for all of them); the answers go into ``asked``."""
        later = [m for m in self.mfq.files[:-1] if m.file_from_offset > mapped.file_from_offset]
        ranges = [(m.file_from_offset, m.file_tail_offset) for m in [mapped, *later[:DELETE_FILES_BATCH_MAX - 1]]]
        for found in self.reader.holders_of(ranges):
            asked[found.start] = found
        return asked[mapped.file_from_offset]

    def _tell_early(self, mapped: MappedFile, found: Holders, disk_used_ratio: float) -> None:
        """The WARNING and the count of one file deleted before its reserved time."""
        metrics.observe_early_deletion(mapped.file_size)
        if found.offsets_file is None and not found.unknown and not self._told_no_offsets:
            self._told_no_offsets = True
            log.warning("no consumer offsets file at %s: early deletions cannot name the consumer groups "
                        "that lose messages", " or ".join(map(str, found.looked_at)))
        log.warning(
            "deleted commitlog file %s (commitlog offsets [%d, %d), %.1f MiB) before its fileReservedTime of "
            "%d h: %s. Consumer groups whose unconsumed messages it held: %s",
            mapped.path.name, mapped.file_from_offset, mapped.file_tail_offset, mapped.file_size / MIB,
            self.config.file_reserved_time, self._disk_state(disk_used_ratio), found.describe(),
            extra={"file": mapped.path.name, "from_offset": mapped.file_from_offset,
                   "to_offset": mapped.file_tail_offset, "groups": found.groups,
                   "unconsumed_messages": sum(h.unconsumed for h in found.holdings),
                   "groups_unknown": found.unknown or None})

    def _hold(self, mapped: MappedFile, found: Holders, disk_used_ratio: float) -> None:
        """protectUnconsumedData: keep ``mapped`` and refuse writes, naming who holds the space."""
        if found.unknown:
            whose = f"of which it cannot be told whether consumer groups have consumed it: {found.describe()}"
        else:
            whose = (f"which consumer groups have not consumed: {found.describe()}. It is deleted once they "
                     "commit offsets past those messages")
        why = (f"protectUnconsumedData keeps commitlog file {mapped.path.name} (commitlog offsets "
               f"[{mapped.file_from_offset}, {mapped.file_tail_offset})), {whose}")
        usage = self.disk.usage
        if usage is None:
            return  # the disk cannot be read: the watermark decides alone
        self.disk.hold(why, self.clean_at_once_ratio, usage)
        if why != self._hold_text and self.disk.held:
            self._hold_text = why
            log.warning("refusing writes instead of deleting unconsumed data: %s, above %.2f; %s",
                        self._disk_state(disk_used_ratio), self.clean_at_once_ratio, why,
                        extra={"file": mapped.path.name, "groups": found.groups,
                               "groups_unknown": found.unknown or None})

    def _release(self) -> None:
        if self.disk.held:
            self.disk.release()
        self._hold_text = ""

    def _disk_state(self, disk_used_ratio: float) -> str:
        usage = self.disk.usage
        state = usage.describe() if usage is not None else f"the disk is {disk_used_ratio * 100:.1f}% used"
        return f"{state}, above diskSpaceCleanForciblyRatio {self.clean_at_once_ratio:.2f}"


class CleanCommitLogService(ServiceThread):
    """The cleaner on its own schedule: every ``disk_check_interval_s`` refresh the disk-full state
    (writes are refused above the watermark within that interval), every ``clean_interval_s``
    (``cleanResourceInterval``) a cleaning round at the disk use just read."""

    name = "clean-commitlog"

    def __init__(self, cleaner: CommitLogCleaner, disk: DiskGuard, disk_check_interval_s: float,
                 clean_interval_s: float) -> None:
        super().__init__()
        self._cleaner = cleaner
        self._disk = disk
        self._interval_s = disk_check_interval_s
        self._clean_interval_s = clean_interval_s
        self._last_clean = time.monotonic()

    def run_once(self) -> None:
        self._stopped.wait(self._interval_s)
        if self.stopped:
            return
        usage = self._disk.refresh()
        if time.monotonic() - self._last_clean >= self._clean_interval_s and usage is not None:
            self._last_clean = time.monotonic()
            self._cleaner.run(usage.ratio)
