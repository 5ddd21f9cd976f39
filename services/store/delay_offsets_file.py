"""The delay offsets file, ``config/delayOffset.json``: RocketMQ's ScheduleMessageService progress.

Shape ``{"offsetTable": {"1": 12, "2": 0}}``: per delay level, the SCHEDULE_TOPIC_XXXX queue offset
(queue = level - 1) of the next unit to deliver; every unit below it was re-put to its real topic.
Written whole and atomically (with a ``.bak``) so a crash leaves the old or the new table.
"""

from __future__ import annotations

import json
from pathlib import Path

from mqstore.services.store.store_root import read_with_backup, write_atomically

FILE_NAME = "delayOffset.json"

#: delay level -> next queue offset of SCHEDULE_TOPIC_XXXX queue level - 1
DelayOffsetTable = dict[int, int]


def parse_delay_offsets(data: bytes) -> DelayOffsetTable:
    """The table of a file's bytes; ValueError naming the bad entry for anything else."""
    document = json.loads(data)
    raw = document.get("offsetTable") if isinstance(document, dict) else None
    if not isinstance(raw, dict):
        raise ValueError("no offsetTable object")
    table = {int(level): int(offset) for level, offset in raw.items()}
    if any(level < 1 or offset < 0 for level, offset in table.items()):
        raise ValueError("a delay level below 1 or a negative offset")
    return table


def read_delay_offsets(path: Path) -> DelayOffsetTable:
    """The table in ``path``, else its ``.bak``; empty when neither exists; ValueError when neither reads."""
    return read_with_backup(path, parse_delay_offsets) or {}


def write_delay_offsets(path: Path, table: DelayOffsetTable) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {"offsetTable": {str(level): offset for level, offset in sorted(table.items())}}
    write_atomically(path, json.dumps(document, indent=4).encode(), keep_backup=True)
