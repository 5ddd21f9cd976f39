"""Consumer offsets of a replicated shard, kept through its log (``services/store/metadata_log.py``).

A commit is appended to the shard's CommitLog as a record of the metadata topic (the commitlog
service's Append with ``metadata_flow``: a follower refuses it with FAILED_PRECONDITION naming the
leader; SYNC_MASTER answers once the in-sync followers hold it). The table then takes it from the
log only, on every replica alike: :meth:`OffsetLog.run` follows the metadata topic's queue as this
replica's indexer dispatches it and applies each commit in log order. Pop consumption's changes
(``PopChange``: hand-outs, acks, invisible times, with the offset they move) go the same way into the
pop checkpoint table (services/query/pop_checkpoints.py). A commit is answered once it
is applied here, and a query first waits until every record the indexer has dispatched is applied,
so a follower promoted to leader answers with exactly the offsets its log holds.

``consumerOffset.json`` records, with the table, the queue offset its records were applied up to
(``mqstoreMetadataQueueOffset``); a start goes on from there. Each record holds a whole offset, so
applying records again (the file's ``.bak``, a queue the indexer rebuilds, a log a failover cut and
wrote again) ends, once applied to the queue's end, in the same state as the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from services.query.backends import CommitLogClient, IndexerClient
from services.query.consumer_offsets import ConsumerOffsetTable
from services.query.pop_checkpoints import PopCheckpointTable
from services.query.pull import GetMessageStatus, Puller
from services.store.errors import ResourceExhaustedError, StoreError, UnavailableError
from services.store.formats.message import PROPERTY_TAGS
from services.store.metadata_log import (
    METADATA_QUEUE_ID,
    METADATA_TOPIC,
    OffsetChange,
    PopChange,
    parse_change,
)
from services.store.rules.pull_request import MAX_BYTES, MAX_MESSAGES, PullQuery
from services.store.rules.subscription import ALL

log = logging.getLogger(__name__)

#: How long a commit or query waits for this replica to apply what its log holds.
APPLY_TIMEOUT_S = 10.0
LONG_POLL_MS = 1000
RETRY_S = 0.2
IDLE_S = 0.05
#: A pull past the queue's end: the queue is shorter than what was applied.
_ENDS_BELOW = (GetMessageStatus.OFFSET_OVERFLOW_BADLY, GetMessageStatus.NO_MESSAGE_IN_QUEUE)


class OffsetLog:
    def __init__(self, table: ConsumerOffsetTable, commitlog: CommitLogClient, indexer: IndexerClient,
                 puller: Puller, pops: PopCheckpointTable | None = None) -> None:
        self._table = table
        self._pops = pops
        self._commitlog = commitlog
        self._indexer = indexer
        self._puller = puller
        # The metadata queue's next offset to apply: where both files are (the pop state's file may have
        # been written before the offsets' one, and its records are deltas).
        self._next = table.applied_metadata or 0
        if pops is not None and pops.applied_metadata is not None:
            self._next = min(self._next, pops.applied_metadata)
        self._progress = asyncio.Condition()

    @property
    def applied(self) -> int:
        return self._next

    async def commit(self, change: OffsetChange | PopChange) -> None:
        """Log the commit, then wait until this replica applied it (raises what the Append raised)."""
        queue_offset = await self._commitlog.append_metadata(change)
        await self._wait_applied(queue_offset + 1)

    async def caught_up(self) -> None:
        """Wait until every metadata record this replica's indexer has dispatched is applied."""
        bounds = await self._indexer.queue_offsets(METADATA_TOPIC, METADATA_QUEUE_ID)
        if bounds is not None:
            await self._wait_applied(bounds[1])

    async def _wait_applied(self, end: int) -> None:
        deadline = time.monotonic() + APPLY_TIMEOUT_S
        async with self._progress:
            while self._next < end:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise UnavailableError(f"consumer offsets: this replica applied the metadata topic up to queue "
                                           f"offset {self._next}, not yet {end}, within {APPLY_TIMEOUT_S:.0f} s (its "
                                           "indexer lags): retry")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._progress.wait(), left)

    async def run(self) -> None:
        """Apply the metadata topic's offset records as the indexer dispatches them, for ever."""
        while True:
            try:
                result = await self._puller.pull(PullQuery(METADATA_TOPIC, METADATA_QUEUE_ID, self._next, MAX_MESSAGES,
                                                           MAX_BYTES, ALL, LONG_POLL_MS))
            except StoreError as exc:
                log.debug("metadata topic not readable yet (%s): retrying", exc)
                await asyncio.sleep(RETRY_S)
                continue
            for message in result.messages:
                self._apply(message.properties.get(PROPERTY_TAGS), message.body, message.queue_offset)
            if result.status is GetMessageStatus.OFFSET_TOO_SMALL:  # expired records: the file holds them
                log.warning("metadata topic: records before queue offset %d expired before this replica applied "
                            "them; consumerOffset.json holds their offsets", result.next_begin_offset)
            if result.status in _ENDS_BELOW and result.next_begin_offset < self._next:
                log.warning("metadata topic: this replica's queue ends below queue offset %d applied (its log was "
                            "cut, or its indexer rebuilds): applying again from %d", self._next,
                            result.next_begin_offset)
                self._set_applied(result.next_begin_offset)
            elif result.next_begin_offset != self._next:
                async with self._progress:
                    self._set_applied(max(self._next, result.next_begin_offset))
                    self._progress.notify_all()
            elif result.status is not GetMessageStatus.OFFSET_OVERFLOW_ONE:  # that one waited for an arrival
                await asyncio.sleep(IDLE_S)

    def _set_applied(self, queue_offset: int) -> None:
        self._next = self._table.applied_metadata = queue_offset
        if self._pops is not None:
            self._pops.set_applied(queue_offset)

    def _apply(self, tags: str | None, body: bytes, queue_offset: int) -> None:
        try:
            change = parse_change(tags, body)
        except (ValueError, KeyError, TypeError) as exc:
            log.error("metadata record at queue offset %d is not a change (%s): skipped", queue_offset, exc)
            return
        try:
            if isinstance(change, OffsetChange):
                self._table.commit(change.group, change.topic, change.queue_id, change.offset)
            elif isinstance(change, PopChange):
                if self._pops is not None:
                    self._pops.apply(change)
                if change.committed >= 0:
                    self._table.commit(change.group, change.topic, change.queue_id, change.committed)
            # topic changes are the commitlog service's, state files the scheduler's
        except ResourceExhaustedError as exc:
            log.error("metadata record at queue offset %d: %s", queue_offset, exc)
