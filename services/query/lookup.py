"""A message by id, and messages by key: RocketMQ's viewMessage and queryMessage.

An index hit is only a hash match on ``topic#key``, so every hit is read back and kept only if the
record really carries the key (RocketMQ 4.9.8's store returns hash collisions: issue #3613, key ``Aa``
for ``BB``; its client drops them). A key query walks the key's hash chains a page of hits at a time
until it has ``max_num`` real matches, so collisions cannot crowd them out of a page.

Index hits carry no size: a record is read with a guessed size clipped to its file, the log's end and
the start of the next quarantined range (:func:`_read_limit`, the one rule of every read here), hits
in one ReadBatch; the rare record longer than the guess costs a second one. A hit whose record lies
in a quarantined range is skipped, logged and counted: the other hits are still answered.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from services.query import metrics
from services.query.backends import CommitLogClient, IndexerClient, StoreInfo
from services.query.errors import DataLossError, FailedPreconditionError
from services.query.store_view import StoreView
from services.query.stored_message import StoredMessage, record_size_at, stored_message
from services.store.errors import InvalidArgumentError, NotFoundError, OutOfRangeError
from services.store.formats.message import KEY_SEPARATOR
from services.store.formats.message_id import (
    MessageIdError,
    MessageIdKind,
    OffsetMessageId,
    check_message_id,
    parse_message_id,
)
from services.store.rules.key_query import MAX_HITS_WALKED, MAX_NUM, check_key_query
from services.store.rules.names import check_topic_name

log = logging.getLogger(__name__)

# Hits asked of the index at a time: maxMsgsNumBatch, all the index answers to one query.
INDEX_PAGE_HITS = MAX_NUM
# Bytes read per index hit before its size is known (a 1 KiB message is about 1.2 KB stored).
GUESSED_RECORD_BYTES = 4096
# TOTALSIZE and MAGICCODE: all a record's size needs.
RECORD_HEAD_BYTES = 8
MAX_TOPICS_SEARCHED = 1024
TOPIC_SEARCH_CONCURRENCY = 16
MAX_READ_RANGES = 1024
INT64_MAX = 2**63 - 1


@dataclass(slots=True, frozen=True)
class KeyQueryResult:
    messages: list[StoredMessage]
    index_last_update_timestamp: int
    index_last_update_phy_offset: int
    #: index entries walked (hash collisions and a record's repeated key included)
    index_hits: int


@dataclass(slots=True, frozen=True)
class _ReadHits:
    """The records at index hits, and why the hits in quarantined ranges could not be read."""

    messages: list[StoredMessage]
    lost: list[DataLossError]


def has_key(message: StoredMessage, key: str) -> bool:
    """The record's KEYS (space separated) or UNIQ_KEY really is ``key``."""
    keys = message.keys
    return message.uniq_key == key or (keys is not None and key in keys.split(KEY_SEPARATOR))


class MessageLookup:
    def __init__(self, indexer: IndexerClient, commitlog: CommitLogClient, store: StoreView) -> None:
        self._indexer = indexer
        self._commitlog = commitlog
        self._store = store

    # -- ViewMessage ---------------------------------------------------------------------------
    async def view(self, msg_id: str, topic: str, kind: MessageIdKind) -> tuple[StoredMessage, MessageIdKind]:
        """Both id kinds have 32 or 56 digits, so without a kind the id is tried as an offset msg id
        first (one Read; kept only if the record there spells the same id), then as a UNIQ_KEY."""
        check_message_id(msg_id, kind)
        if topic:
            check_topic_name(topic)
        misses: list[str] = []
        lost: DataLossError | None = None
        if kind is not MessageIdKind.UNIQ_KEY:
            try:
                offset_id = parse_message_id(msg_id)
            except MessageIdError as exc:
                if kind is MessageIdKind.OFFSET:
                    raise InvalidArgumentError(str(exc)) from None
                # Not an offset msg id (most UNIQ_KEYs are not): the UNIQ_KEY miss alone is the answer; why
                # its bytes make no offset id (a port field out of range...) would only mislead.
            else:
                try:
                    found = await self._by_offset_id(offset_id, topic)
                except DataLossError as exc:  # the offset lies in a quarantined commitlog range
                    if kind is MessageIdKind.OFFSET:
                        raise
                    lost = exc
                    found = f"the commitlog lost the record there ({exc})"
                if isinstance(found, StoredMessage):
                    return found, MessageIdKind.OFFSET
                misses.append(f"no message at commitlog offset {offset_id.commitlog_offset} of store host "
                              f"{offset_id.store_host} (offset msg id {offset_id}): {found}")
        if kind is not MessageIdKind.OFFSET:
            by_key, key_lost = await self._by_uniq_key(msg_id, topic)
            if by_key is not None:
                return by_key, MessageIdKind.UNIQ_KEY
            where = f"in topic {topic!r}" if topic else "in any topic"
            if key_lost:  # the message may be one of the records lost
                lost = key_lost[0]
                misses.append(f"no readable message has UNIQ_KEY {msg_id} {where}: {len(key_lost)} of its index "
                              f"hits could not be read ({key_lost[0]})")
            else:
                misses.append(f"no message has UNIQ_KEY {msg_id} {where}")
        if lost is not None:
            raise DataLossError("; ".join(misses))
        raise NotFoundError("; ".join(misses))

    async def _by_offset_id(self, offset_id: OffsetMessageId, topic: str) -> StoredMessage | str:
        """The record at the id's offset if it carries the id's store host (the host that wrote it, which
        need not be this store's host now: see message_id.py); else why not."""
        offset = offset_id.commitlog_offset
        data = await self._read_record(offset)
        if isinstance(data, str):
            return data
        try:
            message = stored_message(data, offset)
        except DataLossError:
            return "no record starts there"  # the id was made up, or names a record since truncated
        if message.msg_id != str(offset_id):
            return f"the record there was stored by {message.store_host}"
        if topic and message.topic != topic:
            return f"the record there is of topic {message.topic!r}, not {topic!r}"
        return message

    async def _read_record(self, offset: int) -> bytes | str:
        """The whole record at ``offset`` (:meth:`_read_at`), or why there is none."""
        info = await self._store.covering(offset)
        if not info.min_offset <= offset < info.max_offset:
            return (f"it is outside the commitlog of this store ({self._store.store_host} now), which holds offsets "
                    f"[{info.min_offset}, {info.max_offset})")
        try:
            data = await self._read_at(offset, info)
        except OutOfRangeError:
            return "the commitlog no longer holds that offset"
        size = record_size_at(data)
        if size is None or size > len(data):
            return "no record starts there"
        return data[:size]

    async def _read_at(self, offset: int, info: StoreInfo) -> bytes:
        """The bytes at ``offset`` read alone: the guess within :func:`_read_limit`, then the record's
        exact size when it is longer. A guess that still meets a quarantined range (one the view does
        not know yet) is retried as the record's head alone. DataLossError when the record itself lies
        in a quarantined range."""
        limit = _read_limit(offset, info)
        try:
            data = await self._commitlog.read(offset, min(GUESSED_RECORD_BYTES, limit))
        except DataLossError:
            data = await self._commitlog.read(offset, RECORD_HEAD_BYTES)
        size = record_size_at(data)
        if size is not None and len(data) < size <= limit:
            data = await self._commitlog.read(offset, size)
        return data

    async def _by_uniq_key(self, uniq_key: str, topic: str) -> tuple[StoredMessage | None, list[DataLossError]]:
        """The first stored record with this UNIQ_KEY, and the errors of hits that could not be read."""
        topics = [topic] if topic else await self._indexer.topics()
        if len(topics) > MAX_TOPICS_SEARCHED:
            raise FailedPreconditionError(f"the store has {len(topics)} topics, more than the {MAX_TOPICS_SEARCHED} "
                                          "a UNIQ_KEY lookup searches: give the topic")
        if len(topics) == 1:
            # One topic (the request names it): no semaphore and no task per topic (gather's, ~16 us).
            hits = await self._indexer.query_by_key(topics[0], uniq_key, INDEX_PAGE_HITS, 0, 0)
            per_topic = [hits.commitlog_offsets]
        else:
            gate = asyncio.Semaphore(TOPIC_SEARCH_CONCURRENCY)

            async def hits_in(name: str) -> list[int]:
                async with gate:
                    return (await self._indexer.query_by_key(name, uniq_key, INDEX_PAGE_HITS, 0, 0)).commitlog_offsets

            per_topic = await asyncio.gather(*(hits_in(name) for name in topics))
        offsets = sorted({o for hits in per_topic for o in hits})[:MAX_READ_RANGES]
        read = await self._read_hits(offsets)
        # The first stored copy (a producer retry stores the same UNIQ_KEY again).
        for message in sorted(read.messages, key=lambda m: m.commitlog_offset):
            if message.uniq_key == uniq_key and (not topic or message.topic == topic):
                return message, read.lost
        return None, read.lost

    # -- QueryMessage --------------------------------------------------------------------------
    async def query(self, topic: str, key: str, begin_ms: int, end_ms: int, max_num: int) -> KeyQueryResult:
        """Messages of ``topic`` carrying ``key`` stored in [begin_ms, end_ms] (end 0 = no bound): the
        newest ``max_num``, in store order, each once (a KEYS that repeats the key indexes its record
        twice). The window is RocketMQ 4.9.8's where it is stricter: selectPhyOffset keeps a hit whose
        index time (its file's beginTimestamp + whole seconds) is in [begin, end] and stops the walk
        at an older one, so a record stored in the window's first second can fall before it; the end
        is the record's exact store time. Hits are walked a page at a time (collisions, repeats and
        hits of lost records skipped) until ``max_num`` match, within MAX_HITS_WALKED hits."""
        end, max_num = check_key_query(topic, key, begin_ms, end_ms, max_num)
        index_end = 0 if end == INT64_MAX else end
        matching: list[StoredMessage] = []
        seen: set[int] = set()
        walked = 0
        last_update = (0, 0)
        while len(matching) < max_num and walked < MAX_HITS_WALKED:
            asked = min(INDEX_PAGE_HITS, MAX_HITS_WALKED - walked)
            page = await self._indexer.query_by_key(topic, key, asked, begin_ms, index_end, walked)
            if walked == 0:
                last_update = (page.index_last_update_timestamp, page.index_last_update_phy_offset)
            walked += len(page.commitlog_offsets)
            fresh = [o for o in dict.fromkeys(page.commitlog_offsets) if o not in seen]  # hits come newest first
            seen.update(fresh)
            read = await self._read_hits(fresh)
            by_offset = {m.commitlog_offset: m for m in read.messages}
            matching += [m for o in fresh if (m := by_offset.get(o)) is not None
                         and m.topic == topic and has_key(m, key) and begin_ms <= m.store_timestamp <= end]
            if len(page.commitlog_offsets) < asked:  # the chains end here
                break
        newest = matching[:max_num]
        newest.sort(key=lambda m: m.commitlog_offset)
        return KeyQueryResult(newest, *last_update, walked)

    # -- shared ----------------------------------------------------------------------------------
    async def _read_hits(self, offsets: Sequence[int]) -> _ReadHits:
        """The records at index hits. Hits the log no longer (or not yet) holds are dropped: the index
        outlives expired commitlog files."""
        if not offsets:
            return _ReadHits([], [])
        info = await self._store.covering(max(offsets))
        try:
            return await self._read_held(offsets, info)
        except OutOfRangeError:
            return await self._read_held(offsets, await self._store.refresh())

    async def _read_held(self, offsets: Sequence[int], info: StoreInfo) -> _ReadHits:
        wanted = [o for o in offsets if info.min_offset <= o < info.max_offset]
        clear = [o for o in wanted if not _in_quarantine(o, info)]
        try:
            data = dict(zip(clear, await self._read_guessed(clear, info), strict=True))
            alone = [o for o in wanted if o not in data]  # in a quarantined range: the commitlog says which
        except DataLossError:  # a quarantined range the view does not know yet
            data, alone = {}, wanted
        lost: list[DataLossError] = []
        for offset in alone:
            try:
                data[offset] = await self._read_at(offset, info)
            except DataLossError as exc:
                lost.append(exc)
            except OutOfRangeError:
                continue
        if lost:
            metrics.LOST_INDEX_HITS.inc(len(lost))
            log.warning("%d index hits skipped, their records lie in quarantined commitlog ranges: %s",
                        len(lost), lost[0])
        messages = []
        for offset in wanted:
            raw = data.get(offset)
            size = record_size_at(raw) if raw is not None else None
            if raw is None or size is None or size > len(raw):
                continue
            try:
                messages.append(stored_message(raw[:size], offset))
            except DataLossError as exc:  # the index outlived the record it names (or the record is damaged)
                log.warning("index hit skipped: %s", exc)
        return _ReadHits(messages, lost)

    async def _read_guessed(self, offsets: Sequence[int], info: StoreInfo) -> list[bytes]:
        """Each record in one ReadBatch of guesses, a second for those longer than their guess."""
        if not offsets:
            return []
        data = await self._commitlog.read_batch([(o, min(GUESSED_RECORD_BYTES, _read_limit(o, info)))
                                                 for o in offsets])
        longer = [(i, size) for i, raw in enumerate(data)
                  if (size := record_size_at(raw)) is not None and len(raw) < size <= _read_limit(offsets[i], info)]
        if longer:
            rest = await self._commitlog.read_batch([(offsets[i], size) for i, size in longer])
            for (i, _), raw in zip(longer, rest, strict=True):
                data[i] = raw
        return data


def _read_limit(offset: int, info: StoreInfo) -> int:
    """Bytes readable from ``offset`` without crossing its file's end, the log's end or the start of a
    quarantined range after it: a record that ends where such a range starts is whole, and a read
    that reached into the range would fail."""
    file_size = info.mapped_file_size
    end = min((offset // file_size + 1) * file_size if file_size > 0 else info.max_offset, info.max_offset)
    for start, _ in info.quarantined:
        if offset < start < end:
            end = start
    return max(end - offset, 0)


def _in_quarantine(offset: int, info: StoreInfo) -> bool:
    return any(start <= offset < stop for start, stop in info.quarantined)

