"""Consumer offsets: RocketMQ's ConsumerOffsetManager, kept in ``config/consumerOffset.json``.

The table lives in memory. Every persist interval when it changed, and at once for commits that wait
for ``durable()`` (syncConsumerOffsetCommit, on under SYNC_FLUSH: then an answered commit is on
disk), the offsets committed since the last write are appended to ``consumerOffset.json.journal``
and fdatasync'd (services/store/formats/table_journal.py): a write costs the commits it carries, not
the table, which may hold 100,000 offsets. The journal is folded into a new ``consumerOffset.json``
(atomically, the previous one kept as ``.bak``) when it holds as many entries as the file had
offsets, at a start and at a clean stop. A kill -9 or a power cut loses at most the commits of the
last interval (5 s by default, RocketMQ's flushConsumerOffsetInterval) unless they waited.
The file has RocketMQ's shape, ``{"offsetTable": {"topic@group": {"0": 12}}}``, with the queue ids
quoted (RocketMQ's fastjson writes them bare, which is not JSON); its format is in
``services/store/formats/consumer_offsets_file.py``, which the commitlog service reads it with.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from services.query.state_file import StateFile
from services.store.errors import ResourceExhaustedError
from services.store.formats.consumer_offsets_file import (
    FILE_NAME,
    METADATA_OFFSET_KEY,
    TOPIC_GROUP_SEPARATOR,
    OffsetTable,
    applied_entry,
    applied_metadata_offset,
    apply_offset_entries,
    offset_entry,
    parse_offset_table,
)
from services.store.formats.table_journal import TableJournal, encode_entry
from services.store.store_root import read_with_backup

log = logging.getLogger(__name__)

MAX_ENTRIES = 100_000


class OffsetFileError(RuntimeError):
    """Neither the offsets file nor its backup can be read: starting empty would rewind every group."""


@dataclass
class _Write:
    """What one write makes durable, taken on the loop in one step: the offsets committed since the
    last write (and the metadata offset they reach), or, when the journal is due for folding, the
    whole table."""

    changes: dict[tuple[str, int], int] = field(default_factory=dict)
    applied_metadata: int | None = None
    full: OffsetTable | None = None


class ConsumerOffsetTable(StateFile[_Write]):
    def __init__(self, config_dir: Path, max_entries: int = MAX_ENTRIES) -> None:
        super().__init__(config_dir / FILE_NAME)
        self._max_entries = max_entries
        self._table: OffsetTable = {}
        self._entries = 0
        #: Set by the offset log as it applies records; written with the table (METADATA_OFFSET_KEY).
        self.applied_metadata: int | None = None
        self._journal = TableJournal(self.path)
        #: ("topic@group", queue id) -> offset committed since the last write was taken.
        self._changes: dict[tuple[str, int], int] = {}
        self._changes_lock = threading.Lock()  # the loop takes them, a failed write (a thread) gives them back
        self._written_metadata: int | None = None

    @property
    def entries(self) -> int:
        return self._entries

    def load(self) -> None:
        """The file (else its ``.bak``, a crash during the backup's own rename), with the journal's
        commits replayed over it; a journal with entries is folded into a new file at once."""
        try:
            loaded = read_with_backup(self.path, _parse)
        except ValueError as exc:
            log.error("cannot read %s or its .bak (%s)", self.path, exc)
            raise OffsetFileError(f"{self.path} and its .bak are unreadable: repair or remove them (starting "
                                  "without them would send every consumer group back to its first offset)") from None
        if loaded is not None:
            self._table, self.applied_metadata = loaded
        entries = self._journal.open()
        applied = apply_offset_entries(self._table, entries)
        if applied is not None:
            self.applied_metadata = applied
        self._written_metadata = self.applied_metadata
        self._entries = sum(len(queues) for queues in self._table.values())
        if loaded is not None or entries:
            log.info("loaded %d consumer offsets from %s (%d journal entries)", self._entries, self.path,
                     len(entries))
        if entries:
            with self._write_lock:
                self._journal.compact(self._encode_table(self._table, self.applied_metadata), keep_backup=True)

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
        with self._changes_lock:
            self._changes[(f"{topic}{TOPIC_GROUP_SEPARATOR}{group}", queue_id)] = offset
        self.changed()

    def query(self, group: str, topic: str, queue_id: int) -> int | None:
        queues = self._table.get(f"{topic}{TOPIC_GROUP_SEPARATOR}{group}")
        return None if queues is None else queues.get(queue_id)

    def copy_table(self) -> OffsetTable:
        """The whole table now (on the loop), for readers that walk it (consumer lag)."""
        return {key: dict(queues) for key, queues in self._table.items()}

    def _copy(self) -> _Write:
        """The commits since the last write, taken (a failed write gives them back); the whole table
        instead when the journal is due for folding into a new file."""
        with self._changes_lock:
            changes, self._changes = self._changes, {}
        full = self.copy_table() if self._journal.due(self._entries) else None
        return _Write(changes, self.applied_metadata, full)

    def _encode(self, snapshot: _Write) -> bytes:
        """The journal lines of a write that does not fold (one that does writes the whole table)."""
        return b"".join(encode_entry(e) for e in self._entries_of(snapshot))

    def _entries_of(self, taken: _Write) -> list[dict[str, Any]]:
        entries = [offset_entry(key, queue_id, offset) for (key, queue_id), offset in taken.changes.items()]
        if taken.applied_metadata is not None and taken.applied_metadata != self._written_metadata:
            entries.append(applied_entry(taken.applied_metadata))
        return entries

    def write(self, snapshot: tuple[int, _Write]) -> None:
        """Append the write's commits to the journal and fdatasync it (or fold the journal into a new
        file): blocking, for a worker thread. On failure the commits are kept for the next write."""
        version, taken = snapshot
        with self._write_lock:
            try:
                if taken.full is not None:
                    self._journal.compact(self._encode_table(taken.full, taken.applied_metadata), keep_backup=True)
                else:
                    self._journal.append(self._entries_of(taken))
            except BaseException:
                with self._changes_lock:  # newer commits of the same queues win
                    self._changes = {**taken.changes, **self._changes}
                raise
            self._written_metadata = taken.applied_metadata
            self._persisted_version = max(self._persisted_version, version)

    def persist(self) -> None:
        """The stop path (no loop, no thread): the journal folded into a new file, so that a stopped
        store's offsets are one file, as RocketMQ's tools expect."""
        with self._write_lock:
            if self.dirty or self._journal.entries:
                with self._changes_lock:
                    self._changes = {}
                version = self._version
                self._journal.compact(self._encode_table(self.copy_table(), self.applied_metadata), keep_backup=True)
                self._persisted_version = version
            self._journal.close()

    @staticmethod
    def _encode_table(table: OffsetTable, applied_metadata: int | None) -> bytes:
        document: dict[str, object] = {"offsetTable": {key: {str(q): o for q, o in sorted(queues.items())}
                                                       for key, queues in sorted(table.items())}}
        if applied_metadata is not None:
            document[METADATA_OFFSET_KEY] = applied_metadata
        return json.dumps(document, indent=1).encode()

    def groups(self) -> list[str]:
        """Every group with a committed offset."""
        return sorted({key.rpartition(TOPIC_GROUP_SEPARATOR)[2] for key in self._table})

    def offsets_of(self, group: str) -> dict[tuple[str, int], int]:
        """(topic, queue id) -> committed offset, for every queue the group committed."""
        suffix = TOPIC_GROUP_SEPARATOR + group
        return {(key[:-len(suffix)], q): offset for key, queues in self._table.items() if key.endswith(suffix)
                for q, offset in queues.items()}


def _parse(data: bytes) -> tuple[OffsetTable, int | None]:
    return parse_offset_table(data), applied_metadata_offset(data)
