"""The dispatch checkpoint (``config/dispatch_checkpoint.json``): where dispatch may resume after a crash.

It names a reput offset and the state the index had when every record below that offset, and none
at or past it, had been dispatched: the last index file's name and header. It is written only after
that file's msync, so the header's entries are durable; the ConsumeQueues' end at that moment is kept
to tell, on restart, whether they lost units since (they are not msync'd with it).

After a crash the indexer rewinds the index to this state (``IndexService.rewind``) and re-dispatches
from its reput offset: recovery re-reads what was dispatched since the last checkpoint, not the log.
RocketMQ keeps only indexMsgTimestamp, and drops every index file newer than it.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from services.store.formats.index_file import IndexHeader
from services.store.formats.index_service import IndexState
from services.store.store_root import write_atomically

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
_HEADER_FIELDS = ("beginTimestamp", "endTimestamp", "beginPhyOffset", "endPhyOffset", "hashSlotCount",
                  "indexCount")


@dataclass(frozen=True, slots=True)
class DispatchCheckpoint:
    """``reput_offset``: every record below it is in the ConsumeQueues and the index, none at or past it
    in the index. ``consume_queue_end``: the ConsumeQueues' max commitlog offset + size then (-1: none).
    ``index``: the index state then (None when the index is disabled)."""

    reput_offset: int
    consume_queue_end: int
    index: IndexState | None

    def encode(self) -> bytes:
        body: dict[str, Any] = {"version": FORMAT_VERSION, "reputOffset": self.reput_offset,
                                "consumeQueueEnd": self.consume_queue_end}
        if self.index is not None:
            header = self.index.header
            body["indexFile"] = self.index.file_name
            body["indexHeader"] = None if header is None else dict(zip(_HEADER_FIELDS, (
                header.begin_timestamp, header.end_timestamp, header.begin_phy_offset, header.end_phy_offset,
                header.hash_slot_count, header.index_count), strict=True))
        return json.dumps(body, sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes) -> DispatchCheckpoint:
        """Raises ValueError naming what is wrong."""
        try:
            body = json.loads(data)
            if body.get("version") != FORMAT_VERSION:
                raise ValueError(f"format version {body.get('version')!r}, expected {FORMAT_VERSION}")
            reput_offset, cq_end = _int(body["reputOffset"]), _int(body["consumeQueueEnd"])
            index: IndexState | None = None
            if "indexFile" in body:
                name, fields = body["indexFile"], body["indexHeader"]
                if (name is None) != (fields is None) or not (name is None or isinstance(name, str)):
                    raise ValueError("indexFile and indexHeader must both be set or both be null")
                header = None if fields is None else IndexHeader(*(_int(fields[k]) for k in _HEADER_FIELDS))
                index = IndexState(name, header)
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"missing or mistyped field {exc}") from None
        if reput_offset < 0:
            raise ValueError(f"negative reputOffset {reput_offset}")
        return cls(reput_offset, cq_end, index)


def _int(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{value!r} is not an integer")
    return value


class DispatchCheckpointFile:
    """The checkpoint's file, replaced atomically (write, fsync, rename): a crash leaves the old one or
    the new one."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> DispatchCheckpoint | None:
        """None when there is none, or (with a warning) when it cannot be used: the caller then
        recovers as RocketMQ does."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.warning("cannot read the dispatch checkpoint %s (%s): recovering without it", self.path, exc)
            return None
        try:
            return DispatchCheckpoint.decode(data)
        except ValueError as exc:
            log.warning("ignoring the dispatch checkpoint %s: %s", self.path, exc)
            return None

    def save(self, checkpoint: DispatchCheckpoint) -> None:
        write_atomically(self.path, checkpoint.encode())
