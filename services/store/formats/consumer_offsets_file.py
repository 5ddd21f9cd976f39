"""The consumer offsets file, ``consumerOffset.json``: its format and where a store keeps it.

The query service owns the table (``services/query/consumer_offsets.py`` writes it whole, atomically,
with a ``.bak``); the commitlog service only reads it, to tell which consumer groups have not yet
consumed a commitlog file it is about to delete early. The shape is RocketMQ's
ConsumerOffsetManager, ``{"offsetTable": {"topic@group": {"0": 12}}}``: per queue, the offset of the
next message the group will consume (every queue offset below it is consumed).
"""

from __future__ import annotations

import json
from pathlib import Path

from services.store.store_root import read_with_backup

FILE_NAME = "consumerOffset.json"
TOPIC_GROUP_SEPARATOR = "@"
#: The query service's root inside an mqstore store (``mqstore up``: ``<root>/query``).
QUERY_DIR = "query"

#: "topic@group" -> {queue id: committed offset}
OffsetTable = dict[str, dict[int, int]]


def parse_offset_table(data: bytes) -> OffsetTable:
    """The table of a file's bytes; ValueError (naming the bad entry) for anything else."""
    document = json.loads(data)
    raw = document.get("offsetTable") if isinstance(document, dict) else None
    if not isinstance(raw, dict):
        raise ValueError("no offsetTable object")
    table: OffsetTable = {}
    for key, queues in raw.items():
        if TOPIC_GROUP_SEPARATOR not in key or not isinstance(queues, dict):
            raise ValueError(f"entry {key!r} is not topic@group: {{queue: offset}}")
        parsed = {int(q): int(o) for q, o in queues.items()}
        if any(q < 0 or o < 0 for q, o in parsed.items()):
            raise ValueError(f"entry {key!r} has a negative queue id or offset")
        table[key] = parsed
    return table


def split_key(key: str) -> tuple[str, str]:
    """(topic, group) of a "topic@group" key. Topic names cannot hold '@', group names neither."""
    topic, _, group = key.partition(TOPIC_GROUP_SEPARATOR)
    return topic, group


def offsets_file_candidates(store_root: Path) -> tuple[Path, ...]:
    """Where the consumer offsets of the store at ``store_root`` are, in the order looked at: the
    query service's root inside an mqstore store (``mqstore up``), then RocketMQ's
    ``<root>/config`` (a broker keeps them next to its commitlog)."""
    return (store_root / QUERY_DIR / "config" / FILE_NAME, store_root / "config" / FILE_NAME)


def read_offset_table(path: Path) -> OffsetTable:
    """The table in ``path``, else in its ``.bak`` (the writer's previous version). FileNotFoundError
    when neither exists; ValueError naming both when neither can be read."""
    table = read_with_backup(path, parse_offset_table)
    if table is None:
        raise FileNotFoundError(f"no {path} (nor its .bak)")
    return table
