"""A table kept as a snapshot file plus a journal of the changes made since: one durable append per change.

RocketMQ's ConfigManager rewrites its whole JSON file on every change, so a change costs the size of
the table: with 100,000 topics a CreateTopic wrote and fsynced megabytes. Here a change is one line
appended to ``<snapshot>.journal`` and fdatasync'd; the snapshot (the same JSON file as before, which
readers and tools still understand) is rewritten only when the journal holds as many entries as the
snapshot had rows (at least ``compact_min``), so the cost per change stays flat as the table grows.

A line is ``<crc32 of the JSON, 8 hex digits> <JSON object>\\n``. Replaying is idempotent (each entry
says what a row is now, not how it changed), so a compaction that crashed between writing the new
snapshot and emptying the journal replays entries the snapshot already holds, harmlessly. A last line
without its newline or whose checksum fails was being appended when the process or the machine
stopped: it was never acknowledged, and is cut off. A bad line before the last is damage, and
reading refuses with an error naming the file and line rather than dropping acknowledged changes.
"""

from __future__ import annotations

import contextlib
import json
import os
import zlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from services.store.errors import StoreError
from services.store.store_root import created_durably, make_dirs, write_atomically

JOURNAL_SUFFIX = ".journal"


class JournalDamagedError(StoreError):
    """A journal line other than the last is unreadable: acknowledged changes would be lost."""


def journal_path(snapshot: Path) -> Path:
    return snapshot.with_name(snapshot.name + JOURNAL_SUFFIX)


def encode_entry(entry: dict[str, Any]) -> bytes:
    body = json.dumps(entry, separators=(",", ":"), ensure_ascii=False).encode()
    return b"%08x %s\n" % (zlib.crc32(body), body)


def read_entries(snapshot: Path) -> tuple[list[dict[str, Any]], int]:
    """The journal's entries in order and the length of its good prefix (bytes); ([], 0) without one."""
    path = journal_path(snapshot)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return [], 0
    entries: list[dict[str, Any]] = []
    good = 0
    lines = data.split(b"\n")
    complete = lines[:-1]  # the part after the last newline is a line being written when it stopped
    for number, line in enumerate(complete, 1):
        entry = _decode(line)
        if entry is None:
            if number == len(complete) and not lines[-1]:
                break  # the last line, torn: never acknowledged
            raise JournalDamagedError(
                f"{path}: line {number} of {len(complete)} is damaged (checksum or JSON): the changes it and "
                f"later lines hold would be lost; restore the file from a backup, or move it away to start from "
                f"{snapshot.name} alone")
        entries.append(entry)
        good += len(line) + 1
    return entries, good


def _decode(line: bytes) -> dict[str, Any] | None:
    crc, _, body = line.partition(b" ")
    try:
        if len(crc) != 8 or int(crc, 16) != zlib.crc32(body):
            return None
        entry = json.loads(body)
    except ValueError:
        return None
    return entry if isinstance(entry, dict) else None


class TableJournal:
    """The appending side: ``append`` makes entries durable, ``compact`` folds them into a new snapshot.

    Not thread-safe: the table that owns it serialises changes (its lock) and calls these under it."""

    def __init__(self, snapshot: Path, compact_min: int = 1024) -> None:
        self.snapshot = snapshot
        self.path = journal_path(snapshot)
        self.compact_min = compact_min
        self.entries = 0
        self._fd: int | None = None

    def open(self) -> list[dict[str, Any]]:
        """The entries to replay over the snapshot; cuts a torn last line off so appends follow good ones."""
        entries, good = read_entries(self.snapshot)
        self.entries = len(entries)
        if self.path.exists() and self.path.stat().st_size != good:
            with open(self.path, "r+b") as file:
                file.truncate(good)
                os.fsync(file.fileno())
        return entries

    def append(self, entries: Iterable[dict[str, Any]], durable: bool = True) -> None:
        data = b"".join(encode_entry(e) for e in entries)
        if not data:
            return
        fd = self._open_fd()
        size = os.lseek(fd, 0, os.SEEK_END)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if durable:
                os.fdatasync(fd)
        except OSError:
            # A short write (a full disk) must not stay as a torn line that later entries would follow.
            with contextlib.suppress(OSError):
                os.ftruncate(fd, size)
            raise
        self.entries += data.count(b"\n")

    def due(self, rows: int) -> bool:
        """Whether the journal holds as many entries as the snapshot had rows (``rows`` minus the
        entries, for a table that only grew): time to fold it in. The snapshot is rewritten after the
        table doubles, so a change costs O(1) amortised and a fold is rare (log n of them in n creates)."""
        return self.entries >= max(self.compact_min, rows - self.entries)

    def compact(self, snapshot_data: bytes, keep_backup: bool = False) -> None:
        """Replace the snapshot with ``snapshot_data`` (which holds every entry), then empty the journal."""
        write_atomically(self.snapshot, snapshot_data, keep_backup=keep_backup)
        self.close()
        if self.path.exists():
            write_atomically(self.path, b"")
        self.entries = 0

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _open_fd(self) -> int:
        if self._fd is None:
            make_dirs(self.path.parent)
            existed = self.path.exists()
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            if not existed:
                created_durably(self._fd, self.path)  # the new name survives a power cut
        return self._fd
