"""The topicQueueTable: next queue offset per (topic, queue id), and its durable snapshot.

RocketMQ rebuilds this table from the ConsumeQueue; the commitlog service has no ConsumeQueue,
so it keeps ``config/queue_offsets.json``: the table as it stood at a commitlog offset (a record
boundary at or below the flushed offset). Start-up loads it and replays only the records written
after that offset, so it never scans the whole log and never depends on the indexer.
"""

from __future__ import annotations

import json
import logging
import struct
from dataclasses import dataclass, field
from pathlib import Path

from services.store.mapped_file_queue import MappedFileQueue
from services.store.message import TRANSACTION_COMMIT_TYPE, TRANSACTION_NOT_TYPE, transaction_type
from services.store.record import (
    BLANK_MAGIC_CODE,
    MESSAGE_MAGIC_CODE,
    MESSAGE_MAGIC_CODE_V2,
    SYSFLAG_POS,
    host_lengths,
)
from services.store.store_root import write_atomically

log = logging.getLogger(__name__)

QueueKey = tuple[str, int]
_HEAD = struct.Struct(">iIiiiq")  # TOTALSIZE MAGIC BODYCRC QUEUEID FLAG QUEUEOFFSET
_I32 = struct.Struct(">i")
_SIZE_MAGIC = struct.Struct(">iI")
_U16 = struct.Struct(">H")


def advances_queue(sys_flag: int) -> bool:
    """Prepared and rollback records take no queue offset (RocketMQ stores 0 for them)."""
    return transaction_type(sys_flag) in (TRANSACTION_NOT_TYPE, TRANSACTION_COMMIT_TYPE)


@dataclass(slots=True)
class QueueOffsetSnapshot:
    commitlog_offset: int
    next_offsets: dict[QueueKey, int] = field(default_factory=dict)

    def to_json(self) -> bytes:
        queues = [[topic, qid, nxt] for (topic, qid), nxt in sorted(self.next_offsets.items())]
        return json.dumps({"commitlogOffset": self.commitlog_offset, "queues": queues}).encode()

    @classmethod
    def from_json(cls, data: bytes) -> QueueOffsetSnapshot:
        body = json.loads(data)
        return cls(int(body["commitlogOffset"]),
                   {(str(t), int(q)): int(n) for t, q, n in body["queues"]})


class QueueOffsetStore:
    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> QueueOffsetSnapshot | None:
        for candidate in (self.path, self.path.with_name(self.path.name + ".bak")):
            if candidate.exists():
                try:
                    return QueueOffsetSnapshot.from_json(candidate.read_bytes())
                except (ValueError, KeyError, TypeError) as exc:
                    log.warning("ignoring unreadable queue offset snapshot %s: %s", candidate, exc)
        return None

    def save(self, snapshot: QueueOffsetSnapshot) -> None:
        write_atomically(self.path, snapshot.to_json(), keep_backup=True)


def replay_queue_offsets(mfq: MappedFileQueue, start: int, end: int,
                         table: dict[QueueKey, int]) -> int:
    """Advance ``table`` over the records in [start, end) (already validated by recovery).
    Returns the number of records seen. Reads only the few header fields it needs."""
    seen = 0
    offset = start
    while offset < end:
        mapped = mfq.find_by_offset(offset)
        if mapped is None:
            raise ValueError(f"no commitlog file holds offset {offset}")
        buf = mapped.buffer
        pos = offset - mapped.file_from_offset
        limit = min(mapped.file_size, end - mapped.file_from_offset)
        while pos < limit:
            size, magic = _SIZE_MAGIC.unpack_from(buf, pos)
            if magic == BLANK_MAGIC_CODE:
                pos = mapped.file_size
                break
            if magic not in (MESSAGE_MAGIC_CODE, MESSAGE_MAGIC_CODE_V2) or size <= 0:
                raise ValueError(f"no record at commitlog offset {mapped.file_from_offset + pos}")
            _, _, _, queue_id, _, queue_offset = _HEAD.unpack_from(buf, pos)
            sys_flag = _I32.unpack_from(buf, pos + SYSFLAG_POS)[0]
            if advances_queue(sys_flag):
                born, store = host_lengths(sys_flag)
                body_len_pos = pos + 48 + born + 8 + store + 12
                topic_pos = body_len_pos + 4 + _I32.unpack_from(buf, body_len_pos)[0]
                if magic == MESSAGE_MAGIC_CODE:
                    topic_len, topic_pos = buf[topic_pos], topic_pos + 1
                else:
                    topic_len, topic_pos = _U16.unpack_from(buf, topic_pos)[0], topic_pos + 2
                topic = bytes(buf[topic_pos:topic_pos + topic_len]).decode("utf-8")
                table[(topic, queue_id)] = queue_offset + 1
            seen += 1
            pos += size
        offset = mapped.file_from_offset + pos
    return seen
