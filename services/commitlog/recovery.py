"""CommitLog recovery: find the end of the valid log after a clean or a crashed stop.

Clean stop (no abort file): walk from the third-last file; everything before it was flushed.
Crash (abort file present): walk back to the newest file whose first record is no newer than the
checkpoint, then forward, checking every body CRC. The walk ends at the first record that is not
valid; files past that point are deleted and the tail of the last file is zeroed.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Sequence

from services.store.checkpoint import StoreCheckpoint
from services.store.mapped_file import MappedFile
from services.store.mapped_file_queue import MappedFileQueue
from services.store.record import (
    MESSAGE_MAGIC_CODE,
    MESSAGE_MAGIC_CODE_V2,
    SYSFLAG_POS,
    check_record,
    store_timestamp_pos,
)

log = logging.getLogger(__name__)
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")


def recover_normally(mfq: MappedFileQueue, check_crc: bool, delay_levels_ms: Sequence[int]) -> int:
    files = mfq.files
    if not files:
        return 0
    return _walk(files, max(0, len(files) - 3), check_crc, delay_levels_ms)


def recover_abnormally(mfq: MappedFileQueue, checkpoint: StoreCheckpoint, check_crc: bool,
                       include_index: bool, delay_levels_ms: Sequence[int]) -> int:
    files = mfq.files
    if not files:
        return 0
    min_timestamp = checkpoint.min_timestamp(include_index)
    start = 0
    for index in range(len(files) - 1, -1, -1):
        if _matches_checkpoint(files[index], min_timestamp):
            start = index
            break
    log.info("abnormal recovery starts at %s (checkpoint minimum %d)", files[start].path.name, min_timestamp)
    return _walk(files, start, check_crc, delay_levels_ms)


def _matches_checkpoint(mapped: MappedFile, min_timestamp: int) -> bool:
    buf = mapped.buffer
    if _U32.unpack_from(buf, 4)[0] not in (MESSAGE_MAGIC_CODE, MESSAGE_MAGIC_CODE_V2):
        return False
    sys_flag = _I32.unpack_from(buf, SYSFLAG_POS)[0]
    store_timestamp: int = _I64.unpack_from(buf, store_timestamp_pos(sys_flag))[0]
    return store_timestamp != 0 and store_timestamp <= min_timestamp


def _walk(files: Sequence[MappedFile], index: int, check_crc: bool, delay_levels_ms: Sequence[int]) -> int:
    """Return the commitlog offset where the valid records starting at ``files[index]`` end."""
    mapped = files[index]
    pos = 0
    records = 0
    while True:
        request = check_record(mapped.buffer, pos, check_crc, delay_levels_ms)
        if request.success and request.msg_size > 0:
            if request.commitlog_offset != mapped.file_from_offset + pos:
                log.warning("recovery stops at %d: the record there claims offset %d (stale data)",
                            mapped.file_from_offset + pos, request.commitlog_offset)
                break
            pos += request.msg_size
            records += 1
        elif request.success:  # BLANK: this file is done
            if index + 1 >= len(files):
                break
            index += 1
            mapped = files[index]
            pos = 0
        else:
            if request.msg_size > 0:
                log.warning("recovery stops at %d: record of %d bytes is torn or corrupt",
                            mapped.file_from_offset + pos, request.msg_size)
            break
    end = mapped.file_from_offset + pos
    log.info("recovery walked %d records; the log ends at %d", records, end)
    return end
