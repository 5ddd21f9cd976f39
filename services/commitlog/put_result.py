"""RocketMQ's PutMessageStatus and the result of one put."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from services.store.errors import InvalidArgumentError, batch_position
from services.store.formats.message_id import encode_message_id


class PutMessageStatus(enum.Enum):
    PUT_OK = 1
    FLUSH_DISK_TIMEOUT = 2
    FLUSH_SLAVE_TIMEOUT = 3
    SLAVE_NOT_AVAILABLE = 4
    SERVICE_NOT_AVAILABLE = 5
    CREATE_MAPPED_FILE_FAILED = 6
    MESSAGE_ILLEGAL = 7
    PROPERTIES_SIZE_EXCEEDED = 8
    OS_PAGECACHE_BUSY = 9
    UNKNOWN_ERROR = 10


@dataclass(slots=True)
class PutMessageResult:
    status: PutMessageStatus
    commitlog_offset: int
    wrote_bytes: int
    queue_offset: int
    store_timestamp: int
    store_host: bytes
    topic: str
    queue_id: int

    @property
    def msg_id(self) -> str:
        """Offset message id; computed on demand, it is not needed on the in-process put path."""
        return encode_message_id(self.store_host, self.commitlog_offset)




class PutMessageError(InvalidArgumentError):
    """A message rejected before anything was written (MESSAGE_ILLEGAL, PROPERTIES_SIZE_EXCEEDED)."""

    def __init__(self, status: PutMessageStatus, detail: str, index: int | None = None) -> None:
        where = batch_position(index) if index is not None else ""
        super().__init__(f"{status.name}: {where}{detail}")
        self.at_position(index, f"{status.name}: {detail}")
        self.status = status
        self.index = index
