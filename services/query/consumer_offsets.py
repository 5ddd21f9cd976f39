"""Consumer offsets: RocketMQ's ConsumerOffsetManager, kept in ``config/consumerOffset.json``.

The table lives in memory and is written whole, atomically (temp file, fsync, rename; the previous
file kept as ``.bak``), every persist interval when it changed and at a clean stop. A kill -9 or a
power cut loses at most the commits of the last interval (5 s by default, RocketMQ's
flushConsumerOffsetInterval), unless commits wait for ``durable()`` (syncConsumerOffsetCommit, on
under SYNC_FLUSH): then an answered commit is on disk.
The file has RocketMQ's shape, ``{"offsetTable": {"topic@group": {"0": 12}}}``, with the queue ids
quoted (RocketMQ's fastjson writes them bare, which is not JSON); its format is in
``services/store/formats/consumer_offsets_file.py``, which the commitlog service reads it with.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from services.query.state_file import StateFile
from services.store.errors import ResourceExhaustedError
from services.store.formats.consumer_offsets_file import (
    FILE_NAME,
    TOPIC_GROUP_SEPARATOR,
    OffsetTable,
    parse_offset_table,
)

log = logging.getLogger(__name__)

MAX_ENTRIES = 100_000


class OffsetFileError(RuntimeError):
    """Neither the offsets file nor its backup can be read: starting empty would rewind every group."""


#: mqstore's key in the file (RocketMQ's fastjson skips it): on a replicated shard, the metadata topic's
#: queue offset below which every record is in the table (services/query/offset_log.py).
METADATA_OFFSET_KEY = "mqstoreMetadataQueueOffset"


class _Snapshot(dict[str, dict[int, int]]):
    """A copy of the table with the metadata queue offset it covers, taken together on the loop."""

    applied_metadata: int | None = None


class ConsumerOffsetTable(StateFile[OffsetTable]):
    def __init__(self, config_dir: Path, max_entries: int = MAX_ENTRIES) -> None:
        super().__init__(config_dir / FILE_NAME)
        self._max_entries = max_entries
        self._table: OffsetTable = {}
        self._entries = 0
        #: Set by the offset log as it applies records; written with the table (METADATA_OFFSET_KEY).
        self.applied_metadata: int | None = None

    @property
    def entries(self) -> int:
        return self._entries

    def load(self) -> None:
        """The file, else its ``.bak`` (a crash during the backup's own rename), else nothing yet."""
        backup = self.path.with_name(self.path.name + ".bak")
        for candidate in (self.path, backup):
            if not candidate.exists():
                continue
            try:
                data = candidate.read_bytes()
                self._table = parse_offset_table(data)
                self.applied_metadata = _applied_metadata(data)
            except (OSError, ValueError) as exc:
                log.error("cannot read %s (%s)", candidate, exc)
                continue
            self._entries = sum(len(queues) for queues in self._table.values())
            log.info("loaded %d consumer offsets from %s", self._entries, candidate)
            return
        if self.path.exists() or backup.exists():
            raise OffsetFileError(f"{self.path} and its .bak are unreadable: repair or remove them (starting "
                                  "without them would send every consumer group back to its first offset)")

    def commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """Arguments are checked by the caller (names without '@', offset >= 0)."""
        queues = self._table.get(f"{topic}{TOPIC_GROUP_SEPARATOR}{group}")
        if queues is None or queue_id not in queues:
            if self._entries >= self._max_entries:
                raise ResourceExhaustedError(f"the consumer offset table holds {self._entries} offsets, its limit: "
                                             "no new (group, topic, queue) can be added")
            queues = self._table.setdefault(f"{topic}{TOPIC_GROUP_SEPARATOR}{group}", {})
            self._entries += 1
        queues[queue_id] = offset
        self.changed()

    def query(self, group: str, topic: str, queue_id: int) -> int | None:
        queues = self._table.get(f"{topic}{TOPIC_GROUP_SEPARATOR}{group}")
        return None if queues is None else queues.get(queue_id)

    def _copy(self) -> OffsetTable:
        copy = _Snapshot((key, dict(queues)) for key, queues in self._table.items())
        copy.applied_metadata = self.applied_metadata
        return copy

    def _encode(self, snapshot: OffsetTable) -> bytes:
        document: dict[str, object] = {"offsetTable": {key: {str(q): o for q, o in sorted(queues.items())}
                                                       for key, queues in sorted(snapshot.items())}}
        applied = getattr(snapshot, "applied_metadata", None)
        if applied is not None:
            document[METADATA_OFFSET_KEY] = applied
        return json.dumps(document, indent=1).encode()

    def groups(self) -> list[str]:
        """Every group with a committed offset."""
        return sorted({key.rpartition(TOPIC_GROUP_SEPARATOR)[2] for key in self._table})

    def offsets_of(self, group: str) -> dict[tuple[str, int], int]:
        """(topic, queue id) -> committed offset, for every queue the group committed."""
        suffix = TOPIC_GROUP_SEPARATOR + group
        return {(key[:-len(suffix)], q): offset for key, queues in self._table.items() if key.endswith(suffix)
                for q, offset in queues.items()}


def _applied_metadata(data: bytes) -> int | None:
    value = json.loads(data).get(METADATA_OFFSET_KEY)
    if value is not None and (not isinstance(value, int) or value < 0):
        raise ValueError(f"{METADATA_OFFSET_KEY} {value!r} is not a queue offset")
    return value
