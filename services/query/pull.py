"""Pull by queue offset: RocketMQ's DefaultMessageStore.getMessage, then the broker's long polling.

One pull is one GetQueueEntries (the indexer) and at most one ReadBatch (the commitlog): the units
are filtered by tags code and cut to the batch limits before any record is read, so only records
that will be returned (or that collide on the tags code) are fetched. Statuses and next begin
offsets are those of a 4.9.8 master (``nextOffsetCorrection`` always takes the corrected offset).

A raw pull (RocketMQ's zero-copy pull) answers with the record bytes as read, joined once: each record
is checked against its unit as cheaply as its fixed header allows (:func:`checked_raw`), and only a
record that is not the common layout, or fails a check, is decoded - by the same code as a decoded
pull, so a bad record ends both kinds of pull alike.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from services.query.arrivals import ArrivalWatcher, QueueKey
from services.query.backends import CommitLogClient, IndexerClient, QueueEntries, QueueUnit
from services.query.errors import DataLossError
from services.query.store_view import StoreView
from services.query.stored_message import StoredMessage, checked_raw, checked_run, stored_message, unit_table
from services.store.errors import OutOfRangeError, StoreError, UnavailableError
from services.store.formats.consume_queue import JAVA_INT_MAX as FILLER_UNIT_SIZE
from services.store.formats.consume_queue import roll_next_file
from services.store.rules.cold_read import is_cold
from services.store.rules.pull_request import PullQuery
from services.store.rules.subscription import Subscription

#: The fewest records per run worth a run read (fewer: records are read and checked one by one).
_MIN_RUN = 8


class GetMessageStatus(enum.Enum):
    FOUND = 1
    NO_MATCHED_MESSAGE = 2
    MESSAGE_WAS_REMOVING = 3
    OFFSET_FOUND_NULL = 4
    OFFSET_OVERFLOW_BADLY = 5
    OFFSET_OVERFLOW_ONE = 6
    OFFSET_TOO_SMALL = 7
    NO_MESSAGE_IN_QUEUE = 8


@dataclass(slots=True)
class PullResult:
    status: GetMessageStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    messages: list[StoredMessage] = field(default_factory=list)
    #: A raw pull's answer instead of ``messages``: the records as stored, concatenated in queue order.
    records: bytes = b""
    record_count: int = 0
    #: The pull read far behind the log's end: the next one should go to a follower (RocketMQ's
    #: suggestPullingFromSlave; services/store/rules/cold_read.py).
    cold: bool = False

    @property
    def count(self) -> int:
        """Messages returned, in either form."""
        return len(self.messages) or self.record_count


@dataclass(slots=True)
class Selection:
    """The units a pull will read, and how many units of the window it went through (filtered ones
    count: the next pull starts after them)."""

    units: list[QueueUnit]
    walked: int
    removed: int


def offset_status(offset: int, min_offset: int, max_offset: int) -> tuple[GetMessageStatus, int] | None:
    """The status and next begin offset of an offset outside [min, max), or None inside it."""
    if max_offset == 0:
        return GetMessageStatus.NO_MESSAGE_IN_QUEUE, 0
    if offset < min_offset:
        return GetMessageStatus.OFFSET_TOO_SMALL, min_offset
    if offset == max_offset:
        return GetMessageStatus.OFFSET_OVERFLOW_ONE, offset
    if offset > max_offset:
        # 4.9.8 sends a consumer that overshot an untrimmed queue back to 0, otherwise to the end.
        return GetMessageStatus.OFFSET_OVERFLOW_BADLY, 0 if min_offset == 0 else max_offset
    return None


def select_units(units: Sequence[QueueUnit], subscription: Subscription, max_messages: int, max_bytes: int,
                 commitlog_min_offset: int) -> Selection:
    """getMessage's loop over the ConsumeQueue buffer: skip units whose records were deleted, stop when
    the batch is full (the first unit always fits), drop units whose tags code does not match."""
    chosen: list[QueueUnit] = []
    total_bytes = walked = removed = 0
    for unit in units:
        if unit.commitlog_offset < commitlog_min_offset or unit.size == FILLER_UNIT_SIZE:
            # Deleted, or a filler unit (fillPreBlank's, or a record lost in a quarantined range): skipped
            # as RocketMQ's getMessage skips a unit whose record it cannot select.
            walked += 1
            removed += 1
            continue
        if chosen and (len(chosen) >= max_messages or total_bytes + unit.size > max_bytes):
            break
        walked += 1
        if subscription.matches_code(unit.tags_code):
            chosen.append(unit)
            total_bytes += unit.size
    return Selection(chosen, walked, removed)


def waits_for_arrival(result: PullResult, offset: int) -> bool:
    """Nothing to return and nothing more to scan: the broker would suspend this pull (PULL_NOT_FOUND)."""
    if result.messages or result.record_count:
        return False
    status = result.status
    return (status is GetMessageStatus.OFFSET_OVERFLOW_ONE
            or (status is GetMessageStatus.NO_MESSAGE_IN_QUEUE and offset == 0)
            or (status is GetMessageStatus.NO_MATCHED_MESSAGE and result.next_begin_offset == result.max_offset))


class Puller:
    def __init__(self, indexer: IndexerClient, commitlog: CommitLogClient, store: StoreView,
                 arrivals: ArrivalWatcher, mapped_file_size_consume_queue: int,
                 cold_read_threshold: int | None = None) -> None:
        self._indexer = indexer
        self._commitlog = commitlog
        self._store = store
        self._arrivals = arrivals
        self._cq_file_size = mapped_file_size_consume_queue
        #: Bytes behind the log's end past which a pull is cold; None: never said (no slaveReadEnable).
        self._cold_read_threshold = cold_read_threshold

    async def pull(self, query: PullQuery, deadline_s: float | None = None, raw: bool = False) -> PullResult:
        """Pull once; when there is nothing to return, wait (at most ``long_poll_ms`` and until
        ``deadline_s``, a monotonic time) for an arrival in the queue and pull again. ``raw``: answer
        with the stored record bytes (``records``) instead of decoded messages."""
        key: QueueKey = (query.topic, query.queue_id)
        wait_until = time.monotonic() + query.long_poll_ms / 1000
        if deadline_s is not None:
            wait_until = min(wait_until, deadline_s)
        offset = query.queue_offset
        while True:
            token = self._arrivals.token(key)
            result = await self.pull_once(query, offset, raw)
            remaining = wait_until - time.monotonic()
            if remaining <= 0 or not waits_for_arrival(result, offset) or self._arrivals.stopping:
                break
            offset = result.next_begin_offset
            await self._arrivals.wait(key, offset, token, remaining)
        if result.status is GetMessageStatus.OFFSET_OVERFLOW_ONE and offset != query.queue_offset:
            # An earlier round filtered units out: report the progress it made, not the last round alone.
            result.status = GetMessageStatus.NO_MATCHED_MESSAGE
        return result

    async def pull_once(self, query: PullQuery, offset: int, raw: bool = False) -> PullResult:
        entries = await self._indexer.queue_entries(query.topic, query.queue_id, offset, query.scan_units)
        outside = offset_status(offset, entries.min_offset, entries.max_offset)
        if outside is not None:
            status, next_offset = outside
            return PullResult(status, next_offset, entries.min_offset, entries.max_offset)
        if not entries.units:
            return PullResult(GetMessageStatus.OFFSET_FOUND_NULL, roll_next_file(offset, self._cq_file_size),
                              entries.min_offset, entries.max_offset)
        return await self._read_selection(query, offset, entries, raw)

    async def _read_selection(self, query: PullQuery, offset: int, entries: QueueEntries, raw: bool) -> PullResult:
        info = self._store.cached or await self._store.info()
        selection = select_units(entries.units, query.subscription, query.max_messages, query.max_bytes,
                                 info.min_offset)
        cold = (self._cold_read_threshold is not None and selection.walked > 0
                and is_cold(info.max_offset, entries.units[selection.walked - 1].commitlog_offset,
                            self._cold_read_threshold))
        if raw and query.subscription.takes_all:
            run = await self._read_run(query, selection.units)
            if run is not None:
                return PullResult(GetMessageStatus.FOUND, offset + selection.walked, entries.min_offset,
                                  entries.max_offset, records=run, record_count=len(selection.units), cold=cold)
        try:
            data = await self._read(selection.units)
        except OutOfRangeError:
            # The view is stale: files were deleted below it, or the indexer is ahead of a truncated log.
            info = await self._store.refresh()
            selection = select_units(entries.units, query.subscription, query.max_messages, query.max_bytes,
                                     info.min_offset)
            if any(u.commitlog_offset + u.size > info.max_offset for u in selection.units):
                raise UnavailableError(f"the indexer's units of {query.topic}/{query.queue_id} point past the "
                                       f"commitlog's end {info.max_offset} (it is catching up with a truncation); "
                                       "retry") from None
            data = await self._read(selection.units)
        if raw:
            records, next_offset = _collect_raw(query, selection, data, offset)
            result = PullResult(GetMessageStatus.FOUND, next_offset, entries.min_offset, entries.max_offset,
                                records=b"".join(records), record_count=len(records))
        else:
            messages, next_offset = _collect(query, selection, data, offset)
            result = PullResult(GetMessageStatus.FOUND, next_offset, entries.min_offset, entries.max_offset, messages)
        result.cold = cold
        if not result.count:
            if selection.removed and selection.removed == selection.walked:
                result.status = GetMessageStatus.MESSAGE_WAS_REMOVING
            else:
                result.status = GetMessageStatus.NO_MATCHED_MESSAGE
        return result

    async def _read_run(self, query: PullQuery, units: Sequence[QueueUnit]) -> bytes | None:
        """A raw pull's answer when its records lie back to back in the log in a few runs (a queue written
        in batches, or the only busy queue; a run ends at a file's end or at another queue's records):
        one read per run - one slice of the mapped file - checked at once by :func:`checked_run`, the runs
        joined. None when the records are scattered, a read fails or a record fails the check: the
        pull then reads and checks record by record, which returns what comes before a bad record and
        fails as a decoded pull does."""
        if len(units) < _MIN_RUN:
            return None
        table = unit_table(units)
        ends = np.flatnonzero(table[1:, 1] != table[:-1, 1] + table[:-1, 2]) + 1
        if len(ends) * _MIN_RUN >= len(units):
            return None
        topic = query.topic.encode()
        parts: list[bytes] = []
        for start, end in zip([0, *ends.tolist()], [*ends.tolist(), len(units)], strict=True):
            first, last = units[start], units[end - 1]
            try:
                run = await self._commitlog.read(first.commitlog_offset,
                                                 last.commitlog_offset + last.size - first.commitlog_offset)
            except StoreError:
                return None
            if not checked_run(run, table[start:end], topic, query.queue_id):
                return None
            parts.append(run)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def _read(self, units: Sequence[QueueUnit]) -> list[bytes | DataLossError]:
        if not units:
            return []
        try:
            return list(await self._commitlog.read_batch([(u.commitlog_offset, u.size) for u in units]))
        except DataLossError:
            # A unit points into a range the commitlog quarantined (DATA_LOSS): read one by one, so the
            # records before it are still returned and the pull stops at it, as at a damaged record.
            data: list[bytes | DataLossError] = []
            for unit in units:
                try:
                    data.append(await self._commitlog.read(unit.commitlog_offset, unit.size))
                except DataLossError as exc:
                    data.append(exc)
                    break
            return data


def _collect(query: PullQuery, selection: Selection, data: Sequence[bytes | DataLossError],
             offset: int) -> tuple[list[StoredMessage], int]:
    """Check each record against its unit and keep those whose real TAGS match. A bad record ends the
    batch before it (its queue offset is the next begin offset); as the first one it is an error."""
    messages: list[StoredMessage] = []
    matches_tags = query.subscription.matches_tags
    for unit, raw in zip(selection.units, data, strict=False):  # ``data`` stops at a quarantined unit
        try:
            if isinstance(raw, DataLossError):
                raise raw
            message = stored_message(raw, unit.commitlog_offset)
            _check_unit(query, unit, message)
        except DataLossError as exc:
            if messages:
                return messages, unit.queue_offset
            raise DataLossError(f"{query.topic}/{query.queue_id} queue offset {unit.queue_offset}: {exc}") from None
        if matches_tags(message.tags):
            messages.append(message)
    return messages, offset + selection.walked


def _collect_raw(query: PullQuery, selection: Selection, data: Sequence[bytes | DataLossError],
                 offset: int) -> tuple[list[bytes], int]:
    """:func:`_collect` for a raw pull: the records themselves, not messages. A record the cheap check
    does not pass is decoded as :func:`_collect` decodes it, which raises the same error at the same
    place (or accepts a record in a rarer layout: IPv6 hosts, v2 magic)."""
    records: list[bytes] = []
    matches_tags = query.subscription.matches_tags
    with_tags = not query.subscription.takes_all
    topic, queue_id = query.topic.encode(), query.queue_id
    for unit, raw in zip(selection.units, data, strict=False):  # ``data`` stops at a quarantined unit
        try:
            if isinstance(raw, DataLossError):
                raise raw
            tags = checked_raw(raw, unit.commitlog_offset, topic, queue_id, unit.queue_offset, with_tags) \
                if len(raw) == unit.size else None
            if tags is None:
                message = stored_message(raw, unit.commitlog_offset)
                _check_unit(query, unit, message)
                tags = message.tags
        except DataLossError as exc:
            if records:
                return records, unit.queue_offset
            raise DataLossError(f"{query.topic}/{query.queue_id} queue offset {unit.queue_offset}: {exc}") from None
        if not with_tags or matches_tags(tags):
            records.append(raw)
    return records, offset + selection.walked


def _check_unit(query: PullQuery, unit: QueueUnit, message: StoredMessage) -> None:
    if (message.topic, message.queue_id, message.queue_offset, message.store_size) != \
            (query.topic, query.queue_id, unit.queue_offset, unit.size):
        raise DataLossError(f"the record is {message.topic}/{message.queue_id} queue offset {message.queue_offset}, "
                            f"{message.store_size} bytes; the unit says {unit.size} bytes")
