"""A follower's writes: the leader's bytes at exactly the physical offsets the leader sent them from.

Frames may end inside a record (4.9.8 cuts at ``haTransferBatchSize`` bytes). The log takes whole
records only: the tail of a cut record waits here until the rest arrives, so the follower's log, its
Tail (and so its indexer) and its recovery never see half a record, and the offset it reports is
always a record boundary of the leader's log. Records go into the follower's own mapped files, the
same geometry and the same file names as the leader's (a file's name is its start offset); a file
ends with the leader's BLANK record, and the next record starts the next file. A range the leader
quarantined (adopted at the handshake) is copied whole, as bytes, and never parsed.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Sequence

from services.commitlog.commit_log import CommitLog
from services.commitlog.ha.ha_metrics import REPLICATED_BYTES
from services.commitlog.ha.metadata_apply import apply_replicated, create_missing_topics
from services.commitlog.metrics import COMMITLOG_QUARANTINED_BYTES
from services.commitlog.topic_queue_table import QueueKey, keep_lost_queue_offsets, replay_queue_offsets
from services.store.formats.quarantine import QuarantinedRange
from services.store.formats.record import (
    BLANK_MAGIC_CODE,
    MESSAGE_MAGIC_CODE,
    MESSAGE_MAGIC_CODE_V2,
    SIZE_AND_MAGIC,
    SYSFLAG_POS,
    store_timestamp_pos,
)

log = logging.getLogger(__name__)
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")


class ReplicationError(ValueError):
    """What the leader sent does not continue this follower's log (a gap, or bytes that are no record)."""


def whole_records(data: bytes | bytearray, file_position: int, file_size: int) -> tuple[int, int]:
    """How many bytes of ``data`` (starting at ``file_position`` of a file of ``file_size`` bytes, and
    possibly running on into the next files) are whole records, and where the last one starts (-1: none).
    A BLANK record runs to the end of its file."""
    pos, last = 0, -1
    length = len(data)
    while length - pos >= 8:
        size, magic = SIZE_AND_MAGIC.unpack_from(data, pos)
        left_in_file = file_size - file_position
        if magic == BLANK_MAGIC_CODE:
            if size != left_in_file:
                raise ReplicationError(f"a BLANK record of {size} bytes, {left_in_file} bytes before its file's end")
        elif magic not in (MESSAGE_MAGIC_CODE, MESSAGE_MAGIC_CODE_V2) or not 0 < size <= left_in_file - 8:
            raise ReplicationError(f"no record at file position {file_position} (magic code {magic:#010x}, "
                                   f"size {size}, {left_in_file} bytes left in the file)")
        if length - pos < size:
            break
        if magic != BLANK_MAGIC_CODE:
            last = pos
        pos += size
        file_position = (file_position + size) % file_size
    return pos, last


class ReplicaAppender:
    """Appends the leader's stream to a follower's CommitLog; one per follower, one thread."""

    def __init__(self, engine: CommitLog) -> None:
        self._engine = engine
        self._file_size = engine.config.mapped_file_size_commit_log
        self._pending = bytearray()  # received bytes past the log's end: the start of a cut record
        self._pending_start = 0  # the offset of its first byte

    @property
    def log_end(self) -> int:
        """The follower's max offset: whole records only."""
        return self._engine.mfq.max_wrote_offset

    @property
    def received_offset(self) -> int:
        """Where the leader's next frame must start."""
        return self._pending_start + len(self._pending) if self._pending else self.log_end

    def reset(self) -> None:
        """A new connection: the leader resends from the log's end."""
        self._pending.clear()

    def accept_start(self, offset: int) -> None:
        """The first frame of an empty follower may start anywhere on a file boundary (4.9.8: the
        leader's last file); a follower with data must be continued exactly."""
        if self._engine.mfq.last_file() is None and not self._pending:
            if offset % self._file_size:
                raise ReplicationError(f"an empty follower cannot start at offset {offset}: not a file's start")
            return
        if offset != self.received_offset:
            raise ReplicationError(f"the leader sent offset {offset}, this follower expects {self.received_offset}")

    def adopt_quarantine(self, leader_ranges: Sequence[QuarantinedRange], leader: str) -> None:
        """Before any frame: the leader's quarantined ranges become this log's too (saved), so their
        bytes are copied as they are and never read as records (``formats/quarantine.py``)."""
        quarantine = self._engine.quarantine
        for bad in quarantine.adopt(leader_ranges):
            log.warning("commitlog offsets %s are QUARANTINED on leader %s: copied as they are, reads of them "
                        "answer DATA_LOSS here too", bad.describe(), leader, extra={"leader": leader})
        COMMITLOG_QUARANTINED_BYTES.set(quarantine.total_bytes)

    def append(self, offset: int, data: bytes) -> int:
        """Take a frame's bytes; append the whole records among what is pending, and the quarantined
        ranges once whole. Returns the log's end."""
        self.accept_start(offset)
        if not self._pending:
            self._pending_start = offset
        self._pending += data
        quarantine = self._engine.quarantine
        while self._pending:
            start = self._pending_start
            bad = quarantine.overlapping(start, start + 1)
            if bad is not None:  # damaged bytes, no records: copied whole, never parsed
                length = bad.end - start
                if len(self._pending) < length:
                    break
                self._take(start, bytes(self._pending[:length]), lost=bad)
                continue
            next_bad = quarantine.next_start(start)
            upto = len(self._pending) if next_bad is None else min(len(self._pending), next_bad - start)
            window = self._pending if upto == len(self._pending) else self._pending[:upto]
            complete, last = whole_records(window, start % self._file_size, self._file_size)
            if not complete:
                break
            self._take(start, bytes(self._pending[:complete]), last=last)
        return self.log_end

    def _take(self, start: int, records: bytes, last: int = -1, lost: QuarantinedRange | None = None) -> None:
        """Append the pending bytes ``records`` at ``start``: whole records (``last``: where the last
        one starts), or the quarantined range ``lost``."""
        stamp = _store_timestamp(records, last) if last >= 0 else 0
        ordered = lost is None and apply_replicated(self._engine.topics, records)  # before the log holds them
        touched: dict[QueueKey, int] = {}
        self._engine.append_replica_data(lambda: self._write(start, records, stamp, touched, lost))
        if not ordered:
            create_missing_topics(self._engine.topics, {key[0] for key in touched})
        del self._pending[:len(records)]
        self._pending_start = start + len(records)
        REPLICATED_BYTES.inc(len(records))

    def _write(self, start: int, records: bytes, store_timestamp: int, touched: dict[QueueKey, int],
               lost: QuarantinedRange | None) -> None:
        """Under the put lock: copy into the files (rolling at their ends), then advance the queue
        table over the new records, as a leader's put does (``touched``: the queues they advanced);
        over a quarantined range, as the leader's recovery did (its record's queue offset stays used)."""
        mfq = self._engine.mfq
        offset, view = start, memoryview(records)
        while view:
            mapped = mfq.last_file_for_append(offset)
            at = mapped.file_from_offset + mapped.wrote_position
            if at != offset:
                raise ReplicationError(f"file {mapped.path.name} ends at {at}, the leader's bytes start at {offset}")
            take = min(len(view), mapped.file_size - mapped.wrote_position)
            mapped.append(view[:take])
            if store_timestamp and take == len(view):
                mapped.store_timestamp = store_timestamp
            view, offset = view[take:], offset + take
        try:
            if lost is None:
                replay_queue_offsets(mfq, start, start + len(records), touched)
            else:
                keep_lost_queue_offsets(mfq, [lost], touched)
        finally:
            self._engine.queue_table.update(touched)


def _store_timestamp(records: bytes, pos: int) -> int:
    sys_flag = _I32.unpack_from(records, pos + SYSFLAG_POS)[0]
    stamp: int = _I64.unpack_from(records, pos + store_timestamp_pos(sys_flag))[0]
    return stamp
