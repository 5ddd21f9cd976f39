"""The consumer offsets file, ``consumerOffset.json``: its format and where a store keeps it.

The query service owns the table (``services/query/consumer_offsets.py``: each write appends the
commits since the last to ``consumerOffset.json.journal``, services/store/formats/table_journal.py,
and the journal is folded into the file, atomically, with a ``.bak``); the commitlog service only reads
it (both, with :func:`read_offset_table`), to tell which consumer groups have not yet
consumed a commitlog file it is about to delete early. The shape is RocketMQ's
ConsumerOffsetManager, ``{"offsetTable": {"topic@group": {"0": 12}}}``: per queue, the offset of the
next message the group will consume (every queue offset below it is consumed).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from services.store.formats.table_journal import read_entries
from services.store.store_root import read_with_backup

FILE_NAME = "consumerOffset.json"
TOPIC_GROUP_SEPARATOR = "@"
#: The query service's root inside an mqstore store (``mqstore up``: ``<root>/query``).
QUERY_DIR = "query"

#: mqstore's key in the file (RocketMQ's fastjson skips it): on a replicated shard, the metadata topic's
#: queue offset below which every record is in the table (services/query/offset_log.py).
METADATA_OFFSET_KEY = "mqstoreMetadataQueueOffset"

#: "topic@group" -> {queue id: committed offset}
OffsetTable = dict[str, dict[int, int]]


def applied_metadata_offset(data: bytes) -> int | None:
    """The file's METADATA_OFFSET_KEY (None when it has none)."""
    value = json.loads(data).get(METADATA_OFFSET_KEY)
    if value is not None and (not isinstance(value, int) or value < 0):
        raise ValueError(f"{METADATA_OFFSET_KEY} {value!r} is not a queue offset")
    return value


def offset_entry(key: str, queue_id: int, offset: int) -> dict[str, object]:
    """A journal entry: the offset a "topic@group" committed on a queue."""
    return {"key": key, "queue": queue_id, "offset": offset}


def applied_entry(applied_metadata: int) -> dict[str, object]:
    """A journal entry: how far the metadata topic's records are in the table."""
    return {"applied": applied_metadata}


def apply_offset_entries(table: OffsetTable, entries: Iterable[Mapping[str, Any]]) -> int | None:
    """Replay journal entries over ``table`` (in place); the last metadata offset among them, if any."""
    applied = None
    for entry in entries:
        if "applied" in entry:
            applied = int(entry["applied"])
        else:
            table.setdefault(str(entry["key"]), {})[int(entry["queue"])] = int(entry["offset"])
    return applied


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
    """The table in ``path`` (else in its ``.bak``, the writer's previous version) with the journal's
    commits replayed over it. FileNotFoundError when there is none of them; ValueError naming both
    files when neither can be read."""
    table = read_with_backup(path, parse_offset_table)
    entries = read_entries(path)[0]
    if table is None and not entries:
        raise FileNotFoundError(f"no {path} (nor its .bak or journal)")
    table = table if table is not None else {}
    apply_offset_entries(table, entries)
    return table
