"""A message by id, and messages by key: RocketMQ's viewMessage and queryMessage.

An index hit is only a hash match on ``topic#key``, so every hit is read back and kept only if the
record really carries the key (RocketMQ 4.9.8 returns hash collisions: issue #3613, key ``Aa`` for
``BB``). Index hits carry no size: records are read with a guessed size clipped to their file and to
the log's end, all in one ReadBatch; the rare record longer than the guess costs a second one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from mqstore.services.query.backends import CommitLogClient, IndexerClient, StoreInfo
from mqstore.services.query.errors import DataLossError, FailedPreconditionError
from mqstore.services.query.store_view import StoreView
from mqstore.services.query.stored_message import StoredMessage, record_size_at, stored_message
from mqstore.services.store.errors import InvalidArgumentError, NotFoundError, OutOfRangeError
from mqstore.services.store.key_query import check_key_query
from mqstore.services.store.message import KEY_SEPARATOR
from mqstore.services.store.message_id import (
    MessageIdError,
    MessageIdKind,
    OffsetMessageId,
    check_message_id,
    parse_message_id,
)
from mqstore.services.store.names import check_topic_name

log = logging.getLogger(__name__)

INDEX_MAX_HITS = 64
# The index stores store times in whole seconds from its file's start: widen its range by a second each
# way, then compare the records' exact store times.
INDEX_TIME_SLACK_MS = 1000
# Bytes read per index hit before its size is known (a 1 KiB message is about 1.2 KB stored).
GUESSED_RECORD_BYTES = 4096
MAX_TOPICS_SEARCHED = 1024
TOPIC_SEARCH_CONCURRENCY = 16
MAX_READ_RANGES = 1024
INT64_MAX = 2**63 - 1


@dataclass(slots=True, frozen=True)
class KeyQueryResult:
    messages: list[StoredMessage]
    index_last_update_timestamp: int
    index_last_update_phy_offset: int
    index_hits: int


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
        not_offset_id = ""  # why the id cannot be an offset msg id: said last, the UNIQ_KEY miss matters more
        lost: DataLossError | None = None
        if kind is not MessageIdKind.UNIQ_KEY:
            try:
                offset_id = parse_message_id(msg_id)
            except MessageIdError as exc:
                if kind is MessageIdKind.OFFSET:
                    raise InvalidArgumentError(str(exc)) from None
                not_offset_id = f"(nor can it be an offset msg id: {exc})"
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
            by_key = await self._by_uniq_key(msg_id, topic)
            if by_key is not None:
                return by_key, MessageIdKind.UNIQ_KEY
            misses.append(f"no message has UNIQ_KEY {msg_id} " + (f"in topic {topic!r}" if topic else "in any topic"))
        if not_offset_id:
            misses.append(not_offset_id)
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
        """The whole record at ``offset`` in one Read (two if it is longer than the guess), or why there
        is none."""
        info = await self._store.covering(offset)
        if not info.min_offset <= offset < info.max_offset:
            return (f"it is outside the commitlog of this store ({self._store.store_host} now), which holds offsets "
                    f"[{info.min_offset}, {info.max_offset})")
        limit = _read_limit(offset, info)
        try:
            try:
                data = await self._commitlog.read(offset, min(GUESSED_RECORD_BYTES, limit))
            except DataLossError:  # the guess reaches into a quarantined range: read the head alone
                data = await self._commitlog.read(offset, 8)  # DATA_LOSS again if the record is in it
            size = record_size_at(data)
            if size is None or size > limit:
                return "no record starts there"
            if size > len(data):
                data = await self._commitlog.read(offset, size)
        except OutOfRangeError:
            return "the commitlog no longer holds that offset"
        return data[:size]

    async def _by_uniq_key(self, uniq_key: str, topic: str) -> StoredMessage | None:
        topics = [topic] if topic else await self._indexer.topics()
        if len(topics) > MAX_TOPICS_SEARCHED:
            raise FailedPreconditionError(f"the store has {len(topics)} topics, more than the {MAX_TOPICS_SEARCHED} "
                                          "a UNIQ_KEY lookup searches: give the topic")
        if len(topics) == 1:
            # One topic (the request names it): no semaphore and no task per topic (gather's, ~16 us).
            hits = await self._indexer.query_by_key(topics[0], uniq_key, INDEX_MAX_HITS, 0, 0)
            per_topic = [hits.commitlog_offsets]
        else:
            gate = asyncio.Semaphore(TOPIC_SEARCH_CONCURRENCY)

            async def hits_in(name: str) -> list[int]:
                async with gate:
                    return (await self._indexer.query_by_key(name, uniq_key, INDEX_MAX_HITS, 0, 0)).commitlog_offsets

            per_topic = await asyncio.gather(*(hits_in(name) for name in topics))
        offsets = sorted({o for hits in per_topic for o in hits})[:MAX_READ_RANGES]
        messages = await self._read_hits(offsets)
        # The first stored copy (a producer retry stores the same UNIQ_KEY again).
        for message in sorted(messages, key=lambda m: m.commitlog_offset):
            if message.uniq_key == uniq_key and (not topic or message.topic == topic):
                return message
        return None

    # -- QueryMessage --------------------------------------------------------------------------
    async def query(self, topic: str, key: str, begin_ms: int, end_ms: int, max_num: int) -> KeyQueryResult:
        """Messages of ``topic`` carrying ``key``, stored in [begin_ms, end_ms] (end 0 = no bound): the
        newest ``max_num`` among the newest 64 index hits, in store order."""
        end, max_num = check_key_query(topic, key, begin_ms, end_ms, max_num)
        index_end = 0 if end >= INT64_MAX - INDEX_TIME_SLACK_MS else end + INDEX_TIME_SLACK_MS
        hits = await self._indexer.query_by_key(topic, key, INDEX_MAX_HITS,
                                                max(begin_ms - INDEX_TIME_SLACK_MS, 0), index_end)
        by_offset = {m.commitlog_offset: m for m in await self._read_hits(hits.commitlog_offsets)}
        matching = [m for o in hits.commitlog_offsets if (m := by_offset.get(o)) is not None
                    and m.topic == topic and has_key(m, key)
                    and begin_ms <= m.store_timestamp <= end]
        newest = matching[:max_num]  # hits come newest first
        newest.sort(key=lambda m: m.commitlog_offset)
        return KeyQueryResult(newest, hits.index_last_update_timestamp, hits.index_last_update_phy_offset,
                              len(hits.commitlog_offsets))

    # -- shared ----------------------------------------------------------------------------------
    async def _read_hits(self, offsets: Sequence[int]) -> list[StoredMessage]:
        """The records at index hits. Hits the log no longer (or not yet) holds are dropped: the index
        outlives expired commitlog files."""
        if not offsets:
            return []
        info = await self._store.covering(max(offsets))
        wanted = [o for o in offsets if info.min_offset <= o < info.max_offset]
        try:
            data = await self._read_guessed(wanted, info)
        except OutOfRangeError:
            info = await self._store.refresh()
            wanted = [o for o in wanted if info.min_offset <= o < info.max_offset]
            data = await self._read_guessed(wanted, info)
        longer = [(i, size) for i, raw in enumerate(data)
                  if (size := record_size_at(raw)) is not None and len(raw) < size <= _read_limit(wanted[i], info)]
        if longer:
            rest = await self._commitlog.read_batch([(wanted[i], size) for i, size in longer])
            for (i, _), raw in zip(longer, rest, strict=True):
                data[i] = raw
        messages = []
        for offset, raw in zip(wanted, data, strict=True):
            size = record_size_at(raw)
            if size is None or size > len(raw):
                continue
            try:
                messages.append(stored_message(raw[:size], offset))
            except DataLossError as exc:  # the index outlived the record it names (or the record is damaged)
                log.warning("index hit skipped: %s", exc)
        return messages

    async def _read_guessed(self, offsets: Sequence[int], info: StoreInfo) -> list[bytes]:
        if not offsets:
            return []
        return await self._commitlog.read_batch([(o, min(GUESSED_RECORD_BYTES, _read_limit(o, info)))
                                                 for o in offsets])


def _read_limit(offset: int, info: StoreInfo) -> int:
    """Bytes readable from ``offset`` without crossing its file's end or the log's end."""
    file_size = info.mapped_file_size
    file_end = (offset // file_size + 1) * file_size if file_size > 0 else info.max_offset
    return max(min(file_end, info.max_offset) - offset, 0)

