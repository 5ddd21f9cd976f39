"""Crash-safe truncation of a replica's divergent suffix, then its queue offsets rebuilt from what is left.

A returning old leader may hold records past the point its log shares with the new leader
(``epoch_file.consistent_point``); none of them was acknowledged, and they must go before it follows.
The order makes a kill -9 at any point safe:

1. ``ha/truncation.json`` records the cut (durably) before anything changes;
2. the file holding the cut is zeroed from the cut forward and fdatasync'd, then the later files are
   deleted durably (``MappedFileQueue.truncate_dirty_files``): from here a recovery's walk ends at the
   cut, whatever bookkeeping says;
3. only then the bookkeeping shrinks: the quarantined ranges past the cut (their offsets hold new
   records next; a recovery forgets ranges past the log's end the same way), the queue table rebuilt
   by replaying the truncated log (so the next queue offset of each queue is the one after its last
   record left: none is handed out twice, none skipped), its snapshot, the checkpoint's store time, a
   new incarnation (the indexer drops its units past the cut), the epoch file's epochs past the cut;
4. the record of the cut is removed.

A start that finds the record (a kill during 2 or 3) repeats 2 on the files before the engine
recovers, drops the queue snapshots (the engine rebuilds the table from the log) and the checkpoint's
store time (:func:`finish_interrupted_truncation`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from pathlib import Path

from services.commitlog.commit_log import CommitLog
from services.commitlog.ha.epoch_file import EpochFile
from services.commitlog.ha.ha_metrics import ASYNC_LOST_RANGE, TRUNCATED_BYTES, replica_labels
from services.commitlog.topic_queue_table import QueueKey, keep_lost_queue_offsets, replay_queue_offsets
from services.store.config import SYNC_MASTER, MessageStoreConfig
from services.store.formats.checkpoint import StoreCheckpoint
from services.store.formats.mapped_file_queue import MappedFileQueue
from services.store.formats.quarantine import QuarantinedRange
from services.store.store_root import StoreLock, read_with_backup, remove_durably, write_atomically

log = logging.getLogger(__name__)

TRUNCATION_FILE = Path("ha") / "truncation.json"
QUEUE_OFFSETS_FILE = Path("config") / "queue_offsets.json"
#: Called between the steps with the step's name (tests stop the process there).
StepHook = Callable[[str], None]


def _parse(data: bytes) -> int:
    return int(json.loads(data)["cut"])


def truncate_log(engine: CommitLog, epochs: EpochFile, cut: int, step: StepHook = lambda name: None) -> int:
    """Cut ``engine``'s log at ``cut`` (a record boundary) while it runs; the number of bytes cut."""
    cut_bytes = 0

    def under_put_lock() -> None:
        nonlocal cut_bytes
        end = engine.mfq.max_wrote_offset
        if cut >= end:
            return
        cut_bytes = end - cut
        record = engine.root / TRUNCATION_FILE
        write_atomically(record, json.dumps({"cut": cut, "end": end}).encode())
        step("recorded")
        engine.mfq.truncate_dirty_files(cut)
        step("invalidated")
        engine.quarantine.forget_from(cut)
        engine.after_truncation(cut, rebuild_queue_table(engine.mfq, cut, engine.quarantine.ranges))
        step("rebuilt")
        epochs.truncate_from(cut)
        remove_durably(record)

    engine.append_replica_data(under_put_lock)
    if cut_bytes:
        TRUNCATED_BYTES.labels(*replica_labels(engine.config)).inc(cut_bytes)
        _report_cut(engine.config, cut, cut_bytes)
    return cut_bytes


def _report_cut(config: MessageStoreConfig, cut: int, cut_bytes: int) -> None:
    """A SYNC_MASTER replica never acknowledged what it cuts; an ASYNC_MASTER one acknowledged its puts
    before any follower held them, so its cut suffix may hold acknowledged messages: a loss bounded
    by the replication lag at the failover, reported with its range, never silent."""
    if config.broker_role == SYNC_MASTER:
        log.warning("commitlog TRUNCATED to offset %d: %d bytes past the point this replica's log shares with "
                    "its leader were never acknowledged and are gone", cut, cut_bytes, extra={"offset": cut})
        return
    labels = replica_labels(config)
    ASYNC_LOST_RANGE.labels(*labels, "start").set(cut)
    ASYNC_LOST_RANGE.labels(*labels, "end").set(cut + cut_bytes)
    log.warning("commitlog TRUNCATED to offset %d: ASYNC_MASTER messages in [%d, %d) (%d bytes) may have been "
                "acknowledged before any follower held them and are LOST (the replication lag at the failover; "
                "SYNC_MASTER never acknowledges a put a follower lacks)", cut, cut, cut + cut_bytes, cut_bytes,
                extra={"offset": cut, "lost_end": cut + cut_bytes})


def rebuild_queue_table(mfq: MappedFileQueue, end: int,
                        quarantined: Sequence[QuarantinedRange] = ()) -> dict[QueueKey, int]:
    """Each queue's next queue offset, from the records in [min offset, ``end``), stepping over the
    ``quarantined`` ranges as recovery does."""
    table: dict[QueueKey, int] = {}
    if mfq.last_file() is not None:  # a cut below the first file leaves none
        replay_queue_offsets(mfq, mfq.min_offset, end, table, [(r.start, r.end) for r in quarantined])
        keep_lost_queue_offsets(mfq, quarantined, table)
    return table


def finish_interrupted_truncation(store_root: Path, config: MessageStoreConfig) -> int | None:
    """Before the engine starts: complete a truncation a kill interrupted (the cut, or None)."""
    record = store_root / TRUNCATION_FILE
    try:
        cut = read_with_backup(record, _parse)
    except ValueError as exc:  # written atomically: only a hand could damage it
        raise ValueError(f"{record} cannot be read ({exc}): it records an interrupted truncation") from None
    if cut is None:
        return None
    lock = StoreLock(store_root)
    lock.acquire()
    try:
        mfq = MappedFileQueue(store_root / "commitlog", config.mapped_file_size_commit_log, preallocate=False)
        mfq.load()
        mfq.truncate_dirty_files(cut)
        mfq.shutdown()
        for snapshot in (QUEUE_OFFSETS_FILE, QUEUE_OFFSETS_FILE.with_name(QUEUE_OFFSETS_FILE.name + ".bak")):
            remove_durably(store_root / snapshot)  # the engine rebuilds the table from the log
        checkpoint = StoreCheckpoint(store_root / "checkpoint")
        checkpoint.physic_msg_timestamp = 0  # the store time of the cut records claimed nothing more
        checkpoint.close()
        EpochFile(store_root).truncate_from(cut)
        remove_durably(record)
    finally:
        lock.release()
    log.warning("a truncation of the commitlog to offset %d was interrupted: completed before starting", cut,
                extra={"offset": cut})
    return cut
