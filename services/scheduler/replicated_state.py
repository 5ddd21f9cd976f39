"""A replicated shard's scheduler progress, kept in its log (``services/store/metadata_log.py``).

The scheduler runs on the leader's replica only and moves with the leadership, so its progress file
(``delayOffset.json``) on the new leader's replica is stale or missing: starting from it would deliver
again every unit delivered since. Each time the scheduler writes the file it also appends the file's
bytes to the log as a metadata record, which the followers hold like any record. A scheduler starting
on a replicated shard takes the newest such record in its replica's log instead of its local file (the
log is what the shard kept; a local file may count re-puts a failover cut), then counts the re-puts the
log holds past the record's scan offset as delivered (the loop's recovery). So a unit whose re-put
the new leader holds is not delivered again, and one whose re-put it lacks is delivered once.
"""

from __future__ import annotations

import json
import logging

import grpc

from services.scheduler.peers import CommitLogPeer, IndexerPeer
from services.scheduler.store_reader import ScheduleFiles
from services.store.formats.message import PROPERTY_TAGS
from services.store.metadata_log import (
    METADATA_QUEUE_ID,
    METADATA_TOPIC,
    STATE_FILE_TAG,
    StateFileChange,
    metadata_message,
)

log = logging.getLogger(__name__)


class ReplicatedStateFile:
    def __init__(self, name: str, files: ScheduleFiles, indexer: IndexerPeer, commitlog: CommitLogPeer) -> None:
        self.name = name
        self._files = files
        self._indexer = indexer
        self._commitlog = commitlog

    async def log(self, content: bytes) -> None:
        """Append the file's bytes; a failure is logged (the next write logs a newer copy, and until then
        a successor counts the re-puts past the last copy logged)."""
        try:
            await self._commitlog.append_metadata(metadata_message(StateFileChange(self.name, content)))
        except grpc.aio.AioRpcError as exc:
            log.warning("%s written but not logged for the replicas (%s: %s): a successor counts the re-puts past "
                        "the copy logged before", self.name, exc.code().name, exc.details())

    async def latest(self) -> tuple[bytes, int] | None:
        """The newest copy of the file in this replica's log (as far as its indexer dispatched) and its
        store time (ms); None when the log holds none."""
        bounds = await self._indexer.queue_offsets(METADATA_TOPIC, METADATA_QUEUE_ID)
        if bounds is None:
            return None
        low, high = bounds
        for queue_offset in range(high - 1, low - 1, -1):
            unit = self._files.unit(METADATA_QUEUE_ID, queue_offset, METADATA_TOPIC)
            record = None if unit is None else self._files.record(unit.commitlog_offset)
            if record is None or record.properties.get(PROPERTY_TAGS) != STATE_FILE_TAG:
                continue
            try:
                fields = json.loads(record.body)
            except ValueError:
                continue
            if fields.get("file") == self.name:
                return str(fields["content"]).encode(), record.store_timestamp
        return None
