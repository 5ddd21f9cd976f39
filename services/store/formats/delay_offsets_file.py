"""The delay offsets file, ``config/delayOffset.json``: RocketMQ's ScheduleMessageService progress.

Shape ``{"offsetTable": {"1": 12, "2": 0}, "scanFromOffset": 4096}``: per delay level, the
SCHEDULE_TOPIC_XXXX queue offset (queue = level - 1) of the next unit to deliver; every unit below it
was re-put to its real topic. ``scanFromOffset`` (mqstore's, absent in RocketMQ's file, which ignores
unknown fields) is a commitlog offset at or below every re-put the table does not count yet: a
restart after kill -9 looks for those re-puts from there on (services/scheduler/delivery.py).
Written whole and atomically (with a ``.bak``) so a crash leaves the old or the new table and mark
together.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

from services.store.store_root import read_with_backup, write_atomically

FILE_NAME = "delayOffset.json"
SCAN_FROM_KEY = "scanFromOffset"

#: delay level -> next queue offset of SCHEDULE_TOPIC_XXXX queue level - 1
DelayOffsetTable = dict[int, int]


class DelayProgress(NamedTuple):
    table: DelayOffsetTable
    #: where a restart looks for re-puts the table does not count; None in a file written without one
    scan_from: int | None = None


def parse_delay_progress(data: bytes) -> DelayProgress:
    """The table and mark of a file's bytes; ValueError naming the bad entry for anything else."""
    document = json.loads(data)
    raw = document.get("offsetTable") if isinstance(document, dict) else None
    if not isinstance(raw, dict):
        raise ValueError("no offsetTable object")
    table = {int(level): int(offset) for level, offset in raw.items()}
    if any(level < 1 or offset < 0 for level, offset in table.items()):
        raise ValueError("a delay level below 1 or a negative offset")
    scan_from = document.get(SCAN_FROM_KEY)
    if scan_from is not None and (not isinstance(scan_from, int) or scan_from < 0):
        raise ValueError(f"{SCAN_FROM_KEY} {scan_from!r} is not a commitlog offset")
    return DelayProgress(table, scan_from)


def parse_delay_offsets(data: bytes) -> DelayOffsetTable:
    return parse_delay_progress(data).table


def read_delay_progress(path: Path) -> DelayProgress:
    """The table and mark in ``path``, else its ``.bak``; empty when neither exists; ValueError when
    neither reads."""
    return read_with_backup(path, parse_delay_progress) or DelayProgress({})


def read_delay_offsets(path: Path) -> DelayOffsetTable:
    """The table in ``path``, else its ``.bak``; empty when neither exists; ValueError when neither reads."""
    return read_delay_progress(path).table


def write_delay_offsets(path: Path, table: DelayOffsetTable, scan_from: int | None = None) -> None:
    """Atomically, its folder created durably by write_atomically (a plain mkdir here would make that a
    no-op, and a power cut would take the folder's name and the file with it: every delay delivered again)."""
    write_atomically(path, delay_progress_bytes(table, scan_from), keep_backup=True)


def delay_progress_bytes(table: DelayOffsetTable, scan_from: int | None = None) -> bytes:
    """The file's bytes for ``table`` and ``scan_from``."""
    document: dict[str, object] = {"offsetTable": {str(level): offset for level, offset in sorted(table.items())}}
    if scan_from is not None:
        document[SCAN_FROM_KEY] = scan_from
    return json.dumps(document, indent=4).encode()
