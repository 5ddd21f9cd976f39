"""The topic table's files: ``config/topics.json`` (a snapshot) and ``config/topics.json.journal``.

The snapshot is ``{"topics": {name: {read_queue_nums, write_queue_nums, perm, ...}}, "deleted": [...]}``
(``deleted``: names discovery at start must not bring back from old records). Each change since the
snapshot is one journal entry (services/store/formats/table_journal.py): ``{"topic": name, "config":
{...}}`` for a create or update, ``{"topic": name, "deleted": true}`` for a delete. The commitlog
service writes them (services/commitlog/topic_config.py); anything that reads a store's topics reads
them with :func:`read_topics`, never the snapshot alone.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from services.store.formats.table_journal import read_entries
from services.store.store_root import read_with_backup

FILE_NAME = "topics.json"


@dataclass
class TopicsTable:
    topics: dict[str, dict[str, Any]] = field(default_factory=dict)
    deleted: set[str] = field(default_factory=set)

    def apply(self, entries: Iterable[Mapping[str, Any]]) -> None:
        """Replay journal entries (each says what its topic is now, so replaying twice is harmless)."""
        for entry in entries:
            topic = str(entry["topic"])
            if entry.get("deleted"):
                self.topics.pop(topic, None)
                self.deleted.add(topic)
            else:
                self.topics[topic] = dict(entry["config"])
                self.deleted.discard(topic)


def put_entry(topic: str, config: Mapping[str, Any]) -> dict[str, Any]:
    return {"topic": topic, "config": dict(config)}


def delete_entry(topic: str) -> dict[str, Any]:
    return {"topic": topic, "deleted": True}


def parse_snapshot(data: bytes) -> TopicsTable:
    document = json.loads(data)
    topics = document["topics"]
    if not isinstance(topics, dict):
        raise ValueError('"topics" is not an object')
    return TopicsTable({str(name): dict(fields) for name, fields in topics.items()},
                       {str(name) for name in document.get("deleted", ())})


def encode_snapshot(topics: Mapping[str, Mapping[str, Any]], deleted: Iterable[str]) -> bytes:
    body: dict[str, object] = {"topics": {name: dict(topics[name]) for name in sorted(topics)}}
    if deleted := sorted(deleted):
        body["deleted"] = deleted
    return json.dumps(body, indent=2).encode()


def read_snapshot(path: Path) -> TopicsTable:
    """The snapshot (else its ``.bak``); an empty table when the store has neither."""
    return read_with_backup(path, parse_snapshot) or TopicsTable()


def read_topics(path: Path) -> TopicsTable:
    """What the table holds: the snapshot with the journal's changes replayed over it."""
    table = read_snapshot(path)
    table.apply(read_entries(path)[0])
    return table
