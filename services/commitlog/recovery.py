"""CommitLog recovery: find the end of the valid log after a clean or a crashed stop.

Clean stop (no abort file): walk from the third-last file; everything before it was flushed.
Crash (abort file present): walk back to the newest file whose first record is no newer than the
checkpoint, then forward. Both walks check every record as RocketMQ's checkMessageAndReturnSize does
(body CRC when checkCRCOnRecover) and that it sits at the offset it claims; they end at the first
record that is not valid. Files past that point are deleted and the tail of the last file is zeroed.

The walk is :func:`services.store.formats.record_scan.scan_file` (about 1 s of CPU per GiB of ~650-byte
records). An end that is not zero bytes is looked past (:func:`services.store.formats.record_scan.survey`):
a torn last record, or a damaged one with intact records after it, is logged as a WARNING with its
offset, the reason and the bytes the cut drops, and returned in the RecoveryResult.

What happens at a damaged record with intact records after it depends on ``recoverCorruptionMode``:
``cut`` ends the log there (RocketMQ's rule: every later record is lost and new sends overwrite them);
``quarantine`` (the default) resynchronises on the next valid record (MAGICCODE, PHYSICALOFFSET equal to
its own offset, and check_record's checks), returns the range [bad record, next valid record) in
``RecoveryResult.quarantined`` and walks on from there. A torn tail (nothing valid after the bad
record) is cut in both modes, so stores whose last write was cut short by a crash end where they did.

Quarantine applies only to damage inside the log that was live. An earlier recovery that cut the log
(RocketMQ's keeps the bytes after its cut; mqstore's zeroes them) leaves records past the cut that
no one may read again, and a damaged record with intact records after it is then the cut itself
(nothing was written since) or the end of what was written since (the old records after it are
older). So the log is cut there, in both modes, when the records after it are older than the record
before it, or when the store stopped cleanly and mqstore's recorded end of the log (the queue-offset
snapshot, written at the write position by a clean stop) does not lie past the damage: a clean stop
leaves no damage inside a log it recorded, and a store without that record (RocketMQ's) cannot show
that the records after the damage were live.
"""

from __future__ import annotations

import json
import logging
import os
import struct
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from services.store.formats.checkpoint import RECOVERY_SAFETY_MARGIN_MS, StoreCheckpoint
from services.store.formats.consumer_offsets_file import OffsetTable, split_key
from services.store.formats.mapped_file import MappedFile
from services.store.formats.mapped_file_queue import MappedFileQueue
from services.store.formats.quarantine import QuarantinedRange
from services.store.formats.record import (
    MESSAGE_MAGIC_CODE,
    MESSAGE_MAGIC_CODE_V2,
    SYSFLAG_POS,
    store_timestamp_pos,
)
from services.store.formats.record_scan import Damage, FileView, diagnose, next_record, scan_file, survey

log = logging.getLogger(__name__)
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")


@dataclass(frozen=True, slots=True)
class RecoveryResult:
    """Where the valid log ends, what the walk covered, the damage it stopped at (None: a clean end),
    and the damaged ranges it stepped over (quarantine mode)."""

    end: int
    start: int
    records: int
    damage: Damage | None = None
    quarantined: tuple[QuarantinedRange, ...] = ()
    #: STORETIMESTAMP of the last valid record the walk found (0: none)
    last_timestamp: int = 0
    #: commitlog offset of the last valid record the walk found (-1: none)
    last_record_offset: int = -1

    @property
    def scanned_bytes(self) -> int:
        """Commitlog bytes the walk covered (the BLANK padding of full files included)."""
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class LiveLog:
    """What the store shows of the log that was live when it stopped: whether the stop was clean,
    and the end of the log mqstore recorded then (the queue-offset snapshot's offset; None: no record,
    a store mqstore never ran on). A damaged record outside it is never quarantined."""

    clean_stop: bool
    recorded_end: int | None = None

    def excludes(self, offset: int) -> str | None:
        """Why the log was not live at ``offset`` (None: it may have been)."""
        if not self.clean_stop or (self.recorded_end is not None and offset < self.recorded_end):
            return None
        recorded = "none" if self.recorded_end is None else str(self.recorded_end)
        return (f"the last stop was clean and there is no record of the log having been live past it "
                f"(mqstore's recorded end of the log: {recorded}); an earlier recovery ended the log "
                "there (RocketMQ's keeps the bytes after its cut)")


def recover_normally(mfq: MappedFileQueue, check_crc: bool, delay_levels_ms: Sequence[int],
                     quarantine: bool = False, recorded_end: int | None = None) -> RecoveryResult:
    files = mfq.files
    if not files:
        return RecoveryResult(0, 0, 0)
    return _walk(files, max(0, len(files) - 3), check_crc, delay_levels_ms, quarantine,
                 LiveLog(True, recorded_end))


def recover_abnormally(mfq: MappedFileQueue, checkpoint: StoreCheckpoint, check_crc: bool,
                       include_index: bool, delay_levels_ms: Sequence[int],
                       quarantine: bool = False, recorded_end: int | None = None) -> RecoveryResult:
    files = mfq.files
    if not files:
        return RecoveryResult(0, 0, 0)
    min_timestamp = checkpoint.min_timestamp(include_index)
    start = 0
    for index in range(len(files) - 1, -1, -1):
        if _matches_checkpoint(files[index], min_timestamp):
            start = index
            break
    log.info("abnormal recovery starts at %s (checkpoint minimum %d)", files[start].path.name, min_timestamp)
    return _walk(files, start, check_crc, delay_levels_ms, quarantine, LiveLog(False, recorded_end))


def _matches_checkpoint(mapped: MappedFile, min_timestamp: int) -> bool:
    buf = mapped.buffer
    if _U32.unpack_from(buf, 4)[0] not in (MESSAGE_MAGIC_CODE, MESSAGE_MAGIC_CODE_V2):
        return False
    sys_flag = _I32.unpack_from(buf, SYSFLAG_POS)[0]
    store_timestamp: int = _I64.unpack_from(buf, store_timestamp_pos(sys_flag))[0]
    return store_timestamp != 0 and store_timestamp <= min_timestamp


def _store_timestamp(mapped: MappedFile, pos: int) -> int:
    """STORETIMESTAMP of the (valid) record at ``pos`` of ``mapped``."""
    sys_flag = _I32.unpack_from(mapped.buffer, pos + SYSFLAG_POS)[0]
    stamp: int = _I64.unpack_from(mapped.buffer, pos + store_timestamp_pos(sys_flag))[0]
    return stamp


def _older_than_before(before: tuple[MappedFile, int] | None, after: tuple[MappedFile, int]) -> str | None:
    """Why the first intact record after a damaged one is a leftover of an earlier cut (None: it may be
    live): it was stored before the last valid record in front of the damage, so the log was written
    over up to the damage after it had been cut below it. Store times grow along a live log."""
    if before is None:
        return None
    stamp_before, stamp_after = _store_timestamp(*before), _store_timestamp(*after)
    if stamp_after >= stamp_before:
        return None
    return (f"the intact record after it (offset {after[0].file_from_offset + after[1]}, stored at {stamp_after}) "
            f"is older than the record before the damage (offset {before[0].file_from_offset + before[1]}, "
            f"stored at {stamp_before}): left over from before an earlier recovery's cut")


def _walk(files: Sequence[MappedFile], index: int, check_crc: bool, delay_levels_ms: Sequence[int],
          quarantine: bool, live: LiveLog) -> RecoveryResult:
    """Walk the valid records starting at ``files[index]``; a BLANK record moves on to the next file.
    With ``quarantine``, a damaged record with intact records after it is stepped over if the log was
    live there (``live``, :func:`_older_than_before`)."""
    start = files[index].file_from_offset
    records = 0
    pos = 0
    quarantined: list[QuarantinedRange] = []
    last_record: tuple[MappedFile, int] | None = None
    while True:
        mapped = files[index]
        scan = scan_file(mapped.buffer, pos, mapped.file_from_offset, check_crc, delay_levels_ms)
        records += scan.records
        if scan.records:
            last_record = (mapped, scan.starts[-1])
        if scan.blank:
            if index + 1 >= len(files):
                damage = None
                break
            index, pos = index + 1, 0
            continue
        stop = diagnose(mapped.buffer, scan.end, mapped.file_from_offset, check_crc, delay_levels_ms)
        damage = survey(stop, _buffers(files, index), check_crc, delay_levels_ms)
        if damage is None or damage.torn_tail or not quarantine:
            break
        resume = _resynchronise(files, index, scan.end + 1, check_crc, delay_levels_ms)
        if resume is None:  # survey saw intact records the search cannot reach: cut, as RocketMQ
            break
        not_live = live.excludes(damage.offset) or _older_than_before(last_record, (files[resume[0]], resume[1]))
        if not_live is not None:
            log.warning("recovery does not quarantine the damaged record at offset %d: %s", damage.offset, not_live)
            break
        index, pos = resume
        bad = QuarantinedRange(damage.offset, files[index].file_from_offset + pos, damage.reason)
        quarantined.append(bad)
        log.warning("recovery QUARANTINED offsets %s: a damaged record with %d intact records after it; the "
                    "walk goes on at offset %d (reads of the range answer DATA_LOSS; "
                    "recoverCorruptionMode: cut would have dropped everything from offset %d)",
                    bad.describe(), damage.intact_records, bad.end, bad.start)
    end = mapped.file_from_offset + scan.end
    if damage is None:
        log.info("recovery walked %d records from offset %d; the log ends at %d", records, start, end)
    elif damage.torn_tail:
        log.warning("recovery cut the log at offset %d: torn last record (%s); %d bytes dropped, no valid "
                    "record after it (%d records walked from offset %d)",
                    end, damage.reason, damage.dropped_bytes, records, start)
    else:
        log.warning("recovery cut the log at offset %d: CORRUPT record (%s); %d bytes dropped up to offset %d, "
                    "%d intact records after it lost (%d records walked from offset %d)",
                    end, damage.reason, damage.dropped_bytes, end + damage.dropped_bytes,
                    damage.intact_records, records, start)
    last_timestamp = _store_timestamp(*last_record) if last_record is not None else 0
    last_offset = last_record[0].file_from_offset + last_record[1] if last_record is not None else -1
    return RecoveryResult(end, start, records, damage, tuple(quarantined), last_timestamp, last_offset)


def _resynchronise(files: Sequence[MappedFile], index: int, pos: int, check_crc: bool,
                   delay_levels_ms: Sequence[int]) -> tuple[int, int] | None:
    """(file index, position) of the first valid record at or after ``pos`` of ``files[index]``,
    searching on in later files (from their first byte) if the file has none."""
    for view in _buffers(files, index):
        found = next_record(view, pos, check_crc, delay_levels_ms)
        if found is not None:
            return index, found
        index, pos = index + 1, 0
    return None


def _buffers(files: Sequence[MappedFile], index: int) -> Iterator[FileView]:
    """``files[index:]`` for survey, each with a descriptor of its own (to skip holes)."""
    for mapped in files[index:]:
        fd = os.open(mapped.path, os.O_RDONLY)
        try:
            yield FileView(mapped.file_from_offset, mapped.buffer, fd)
        finally:
            os.close(fd)


class MissingLogError(RuntimeError):
    """Recovery found less log than the store's records say existed, and refuseStartOnMissingLog is on."""


@dataclass(frozen=True, slots=True)
class MissingLog:
    """Evidence that the log reached further than recovery found it: data that existed is gone (a
    file whose name or content a power cut took, files deleted by hand, a restore from an old copy).

    ``durable_evidence`` lists records written only once the log they describe was durable (the
    checkpoint's physicMsgTimestamp, the queue-offset snapshot): their loss is never the flush
    policy's. ``dispatched_evidence`` lists the indexer's dispatch checkpoint, which may cover records
    readable before their flush: past the end by up to the flush window under ASYNC_FLUSH."""

    end: int
    durable_end: int
    dispatched_end: int
    missing_ms: int
    durable_evidence: tuple[str, ...]
    dispatched_evidence: tuple[str, ...]

    @property
    def durable_missing_bytes(self) -> int:
        return max(0, self.durable_end - self.end)

    @property
    def dispatched_missing_bytes(self) -> int:
        return max(0, self.dispatched_end - self.end)

    def describe(self, evidence: tuple[str, ...]) -> str:
        return f"the log ends at offset {self.end}, but " + "; ".join(evidence)


def find_missing_log(result: RecoveryResult, checkpoint_timestamp: int, recorded_end: int | None,
                     dispatched_end: int | None) -> MissingLog | None:
    """What the store's own records say existed past the end recovery found (None: nothing).

    ``recorded_end``: the queue-offset snapshot's offset (saved only once the log is flushed that far);
    ``checkpoint_timestamp``: the checkpoint's physicMsgTimestamp (the store time of the newest flushed
    record; RecoveryResult.last_timestamp is compared with it, less RocketMQ's 3 s recovery margin for a
    clock stepped back); ``dispatched_end``: the indexer's dispatch checkpoint (its reputOffset). An end
    recovery itself cut at a damaged record (and logged) counts up to the data it found after it, and
    the checkpoint's time is not compared then (the records after the cut are newer)."""
    explained = result.end + (result.damage.dropped_bytes if result.damage is not None else 0)
    durable: list[str] = []
    durable_end = result.end
    if recorded_end is not None and recorded_end > explained:
        durable_end = recorded_end
        durable.append(f"the queue-offset snapshot (config/queue_offsets.json) was saved once the log was durable "
                       f"up to offset {recorded_end}: offsets [{result.end}, {recorded_end}) are missing")
    missing_ms = 0
    if result.damage is None and checkpoint_timestamp > result.last_timestamp + RECOVERY_SAFETY_MARGIN_MS:
        missing_ms = checkpoint_timestamp - result.last_timestamp
        found = f"the newest record found was stored at {result.last_timestamp}: {missing_ms} ms of records are " \
            "missing" if result.last_timestamp else "no record was found"
        durable.append(f"the checkpoint says records stored up to {checkpoint_timestamp} (ms) were durable and "
                       f"{found}")
    dispatched: list[str] = []
    if dispatched_end is not None and dispatched_end > explained:
        dispatched.append(f"the indexer dispatched records up to offset {dispatched_end} (indexer/config/"
                          f"dispatch_checkpoint.json): offsets [{result.end}, {dispatched_end}) are missing")
    if not durable and not dispatched:
        return None
    return MissingLog(result.end, durable_end, dispatched_end or result.end, missing_ms, tuple(durable),
                      tuple(dispatched))


def read_dispatched_end(path: Path) -> int | None:
    """The ``reputOffset`` of the indexer's dispatch checkpoint at ``path`` (the indexer's
    services/indexer/dispatch_checkpoint.py writes it), read as plain JSON: None when there is none
    or it cannot be read (the indexer reports that itself)."""
    witness = read_dispatch_witness(path)
    return None if witness is None else witness[0]


def read_dispatch_witness(path: Path) -> tuple[int, int] | None:
    """(reputOffset, the store time of the newest record indexed: indexHeader.endTimestamp, 0 when
    absent) of the indexer's dispatch checkpoint at ``path``; None when there is none or it cannot be read."""
    try:
        body = json.loads(path.read_bytes())
        offset = body.get("reputOffset")
        indexed = (body.get("indexHeader") or {}).get("endTimestamp", 0)
    except (OSError, ValueError, AttributeError):
        return None
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (offset, indexed)):
        return None
    return offset, indexed


#: A consumer group's committed offset past the end of a queue: (topic, group, queue id, committed
#: offset, the queue's next offset after recovery). Every queue offset below a commit was consumed.
ConsumedBeyond = tuple[str, str, int, int, int]


def consumed_beyond(offsets: OffsetTable, queue_ends: Mapping[tuple[str, int], int]) -> tuple[ConsumedBeyond, ...]:
    """The commits of ``offsets`` (the query service's consumer offsets) past their queue's end."""
    found = []
    for key, queues in sorted(offsets.items()):
        topic, group = split_key(key)
        for queue_id, committed in sorted(queues.items()):
            end = queue_ends.get((topic, queue_id), 0)
            if committed > end:
                found.append((topic, group, queue_id, committed, end))
    return tuple(found)


@dataclass(frozen=True, slots=True)
class FlushLoss:
    """What the durable witnesses show an unclean stop under ASYNC_FLUSH took: appends acknowledged
    from the page cache and never flushed (the loss that flush mode allows, bounded by its flush
    interval). ``lost_to`` and ``lost_until`` are the furthest offset and the newest store time a
    witness saw (the end found and the newest record found when none saw further); the real loss may
    be larger: nothing records the appends no witness saw."""

    end: int
    last_timestamp: int
    lost_to: int
    lost_until: int
    consumed: tuple[ConsumedBeyond, ...]
    witnesses: tuple[str, ...]

    @property
    def lost_bytes(self) -> int:
        return self.lost_to - self.end

    @property
    def lost_ms(self) -> int:
        return self.lost_until - self.last_timestamp

    @property
    def lost_messages(self) -> int:
        return sum(committed - end for _, _, _, committed, end in self.consumed)

    def describe(self) -> str:
        return (f"durable witnesses show at least {self.lost_bytes} bytes, {self.lost_ms} ms of store time and "
                f"{self.lost_messages} consumed messages of it: " + "; ".join(self.witnesses))


def describe_unclean_async_stop(result: RecoveryResult, flush_interval_ms: int, loss: FlushLoss | None) -> str:
    """What an unclean stop under ASYNC_FLUSH may have taken, said after every one: appends are
    acknowledged from the page cache and the flush service makes each durable within
    ``flushIntervalCommitLog`` (services/commitlog/flush.py), so the messages stored after the newest
    record found, and only those, may be gone. The stop's own time is not recorded anywhere durable,
    so the range is named by where the log ends and the store time of its newest record; ``loss`` adds
    what durable witnesses prove was there (a lower bound: most losses leave no witness)."""
    if result.last_timestamp:
        stored = datetime.fromtimestamp(result.last_timestamp / 1000, tz=UTC).isoformat(timespec="milliseconds")
        since = f"messages stored after {result.last_timestamp} ({stored}; the log ends at offset {result.end})"
    else:
        since = f"messages stored since the log's start (it holds no record; the log ends at offset {result.end})"
    text = (f"{since}, at most flushIntervalCommitLog ({flush_interval_ms} ms) before the stop, were acknowledged "
            "from the page cache and may not have been flushed: they are lost")
    return text if loss is None else f"{text}; {loss.describe()}"


def find_flush_loss(result: RecoveryResult, checkpoint_timestamp: int, dispatched: tuple[int, int] | None,
                    consumed: Sequence[ConsumedBeyond]) -> FlushLoss | None:
    """What each durable witness shows past the log recovery found (None: none shows anything).

    ``checkpoint_timestamp``: the checkpoint's physicMsgTimestamp (flushed store time; past RocketMQ's
    3 s margin it is :func:`find_missing_log`'s evidence instead); ``dispatched``: the dispatch
    checkpoint's (reputOffset, newest indexed store time); ``consumed``: consumer offsets past their
    queue's end (:func:`consumed_beyond`)."""
    lost_to, lost_until = result.end, result.last_timestamp
    witnesses: list[str] = []
    if checkpoint_timestamp > lost_until:
        lost_until = checkpoint_timestamp
        witnesses.append(f"the checkpoint says records stored up to {checkpoint_timestamp} were flushed")
    if dispatched is not None:
        reput_offset, indexed_until = dispatched
        if reput_offset > lost_to:
            lost_to = reput_offset
            witnesses.append(f"the indexer dispatched offsets [{result.end}, {reput_offset}) (indexer/config/"
                             "dispatch_checkpoint.json)")
        if indexed_until > lost_until:
            lost_until = indexed_until
            after = indexed_until - result.last_timestamp
            witnesses.append(f"the indexer indexed records stored up to {indexed_until} ({after} ms after the "
                             "newest record found)")
    witnesses += [f"{topic} queue {queue_id}: {group} consumed up to offset {committed}, the queue ends at {end}"
                  for topic, group, queue_id, committed, end in consumed]
    if not witnesses:
        return None
    return FlushLoss(result.end, result.last_timestamp, lost_to, lost_until, tuple(consumed), tuple(witnesses))
