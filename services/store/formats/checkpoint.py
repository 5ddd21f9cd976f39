"""StoreCheckpoint: a 4 KiB file of three big-endian millisecond timestamps.

physicMsgTimestamp @0 (commitlog data flushed up to this store time), logicsMsgTimestamp @8
(ConsumeQueue), indexMsgTimestamp @16 (IndexFile). Abnormal recovery starts from the first file
whose first record is no newer than these, so a value is written only after the data it covers
is durable.
"""

from __future__ import annotations

import mmap
import os
import struct
from pathlib import Path

from services.store.store_root import created_durably

CHECKPOINT_FILE_SIZE = 4096
_LAYOUT = struct.Struct(">qqq")
RECOVERY_SAFETY_MARGIN_MS = 3000


def read_checkpoint(path: Path) -> tuple[int, int, int]:
    """(physicMsgTimestamp, logicsMsgTimestamp, indexMsgTimestamp) of a checkpoint file, read without
    opening it for writing: offline tools must leave a store they read untouched (StoreCheckpoint maps
    the file read-write and writes it back at close)."""
    with open(path, "rb") as file:
        data = file.read(_LAYOUT.size)
    if len(data) < _LAYOUT.size:
        raise ValueError(f"{path}: {len(data)} bytes, too short for a checkpoint ({CHECKPOINT_FILE_SIZE} expected)")
    physic, logics, index = _LAYOUT.unpack(data)
    return physic, logics, index


class StoreCheckpoint:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        if os.fstat(self._fd).st_size < CHECKPOINT_FILE_SIZE:
            os.ftruncate(self._fd, CHECKPOINT_FILE_SIZE)
            created_durably(self._fd, path)  # msync makes its content durable, never its name
        self._mm = mmap.mmap(self._fd, CHECKPOINT_FILE_SIZE)
        self.physic_msg_timestamp, self.logics_msg_timestamp, self.index_msg_timestamp = \
            _LAYOUT.unpack_from(self._mm, 0)

    def min_timestamp(self, include_index: bool = False) -> int:
        """RocketMQ's getMinTimestamp (getMinTimestampIndex with ``include_index``), minus 3 s.

        A timestamp of 0 means "not kept here" (the commitlog service has no ConsumeQueue),
        so it does not drag the minimum to the beginning of time.
        """
        values = [self.physic_msg_timestamp, self.logics_msg_timestamp]
        if include_index:
            values.append(self.index_msg_timestamp)
        kept = [v for v in values if v > 0]
        return max(0, min(kept) - RECOVERY_SAFETY_MARGIN_MS) if kept else 0

    def flush(self) -> None:
        """Write the timestamps and make them durable with fdatasync of the file, as IndexFile.flush
        does: Linux's msync(MS_SYNC) of a shared mapping is the file's fdatasync, but CPython's
        mmap.flush holds the GIL through it, and every thread of the service (a SYNC_MASTER leader's
        puts waiting for their followers' reports among them) would stall for the write-back."""
        _LAYOUT.pack_into(self._mm, 0, self.physic_msg_timestamp, self.logics_msg_timestamp,
                          self.index_msg_timestamp)
        os.fdatasync(self._fd)

    def close(self) -> None:
        self.flush()
        self._mm.close()
        os.close(self._fd)
