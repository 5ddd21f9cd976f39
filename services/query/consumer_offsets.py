"""Consumer offsets: RocketMQ's ConsumerOffsetManager, kept in ``config/consumerOffset.json``.

The table lives in memory and is written whole, atomically (temp file, fsync, rename; the previous
file kept as ``.bak``), every persist interval when it changed and at a clean stop. A kill -9 loses
at most the commits of the last interval (5 s by default, RocketMQ's flushConsumerOffsetInterval).
The file has RocketMQ's shape, ``{"offsetTable": {"topic@group": {"0": 12}}}``, with the queue ids
quoted (RocketMQ's fastjson writes them bare, which is not JSON); its format is in
``services/store/consumer_offsets_file.py``, which the commitlog service reads it with.
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path

from mqstore.services.store.consumer_offsets_file import (
    FILE_NAME,
    TOPIC_GROUP_SEPARATOR,
    OffsetTable,
    parse_offset_table,
)
from mqstore.services.store.errors import ResourceExhaustedError
from mqstore.services.store.store_root import write_atomically

log = logging.getLogger(__name__)

MAX_ENTRIES = 100_000


class OffsetFileError(RuntimeError):
    """Neither the offsets file nor its backup can be read: starting empty would rewind every group."""


class ConsumerOffsetTable:
    def __init__(self, config_dir: Path, max_entries: int = MAX_ENTRIES) -> None:
        self.path = config_dir / FILE_NAME
        self._max_entries = max_entries
        self._table: OffsetTable = {}
        self._entries = 0
        self._version = 0
        self._persisted_version = 0
        # The periodic writer may still be in its thread when the stop path writes: one write at a time.
        self._write_lock = threading.Lock()

    @property
    def entries(self) -> int:
        return self._entries

    @property
    def dirty(self) -> bool:
        return self._version != self._persisted_version

    def load(self) -> None:
        """The file, else its ``.bak`` (a crash during the backup's own rename), else nothing yet."""
        backup = self.path.with_name(self.path.name + ".bak")
        for candidate in (self.path, backup):
            if not candidate.exists():
                continue
            try:
                self._table = parse_offset_table(candidate.read_bytes())
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
        self._version += 1

    def query(self, group: str, topic: str, queue_id: int) -> int | None:
        queues = self._table.get(f"{topic}{TOPIC_GROUP_SEPARATOR}{group}")
        return None if queues is None else queues.get(queue_id)

    def snapshot(self) -> tuple[int, OffsetTable]:
        """(version, copy of the table): a copy is cheap on the event loop, encoding it is not."""
        return self._version, {key: dict(queues) for key, queues in self._table.items()}

    def write(self, snapshot: tuple[int, OffsetTable]) -> None:
        """Encode and write a snapshot (blocking: fsyncs); meant for a worker thread."""
        version, table = snapshot
        document = {"offsetTable": {key: {str(q): o for q, o in sorted(queues.items())}
                                    for key, queues in sorted(table.items())}}
        data = json.dumps(document, indent=1).encode()
        with self._write_lock:
            write_atomically(self.path, data, keep_backup=True)
            self._persisted_version = max(self._persisted_version, version)

    def persist(self) -> None:
        """Write the table now if it changed (the stop path: no loop, no thread)."""
        if self.dirty:
            self.write(self.snapshot())


    def groups(self) -> list[str]:
        """Every group with a committed offset."""
        return sorted({key.rpartition(TOPIC_GROUP_SEPARATOR)[2] for key in self._table})

    def offsets_of(self, group: str) -> dict[tuple[str, int], int]:
        """(topic, queue id) -> committed offset, for every queue the group committed."""
        suffix = TOPIC_GROUP_SEPARATOR + group
        return {(key[:-len(suffix)], q): offset for key, queues in self._table.items() if key.endswith(suffix)
                for q, offset in queues.items()}
