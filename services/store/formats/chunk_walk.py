"""The one walk that cuts a chunk of whole records out of a commitlog file.

A chunk is what a tailer dispatches in one step (RocketMQ's ReputMessageService reads its mapped
files this way): records back to back from a record boundary, within one file, up to a byte budget
(at least one record, whatever its size). The walk reads only each record's TOTALSIZE and MAGICCODE
and stops at the first of: the readable limit (a record not wholly below it is left for later), the
budget, a BLANK (the rest of the file holds no record), or a header that is no record (a size below
the smallest record). The commitlog's Tail (on its mapped file) and the indexer's own file reads
(on ``pread`` bytes) cut chunks with it, so both cut the same chunk at the same offset; what a stop
means (the end of the log, a next file, a mismatch to resynchronise on) is each caller's to decide.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from services.store.formats.record import BLANK_MAGIC_CODE, MIN_RECORD_LENGTH, SIZE_AND_MAGIC, Buffer


class ChunkStop(Enum):
    """Why a walk stopped after its records."""

    LIMIT = "limit"  # fewer than a header left, or the next record is not wholly readable
    BUDGET = "budget"  # the next record would take the chunk past its byte budget
    BLANK = "blank"  # a BLANK record follows: the file's data ends there
    NOT_A_RECORD = "not a record"  # a header whose size is below the smallest record


@dataclass(slots=True, frozen=True)
class ChunkWalk:
    """``count`` whole records in ``[start, end)``; ``stop`` says what lies at ``end``."""

    count: int
    end: int
    stop: ChunkStop


def walk_chunk(buf: Buffer, start: int, limit: int, max_bytes: int) -> ChunkWalk:
    """Whole records of ``buf`` from ``start`` (a record boundary) below ``limit``, taking at most
    ``max_bytes`` unless the first record alone is larger. The walk trusts each record's TOTALSIZE
    (no CRC, no field decode): callers that read untrusted bytes check what they need of the stop."""
    unpack = SIZE_AND_MAGIC.unpack_from
    pos = start
    count = 0
    while pos + SIZE_AND_MAGIC.size <= limit:
        size, magic = unpack(buf, pos)
        if magic == BLANK_MAGIC_CODE:
            return ChunkWalk(count, pos, ChunkStop.BLANK)
        if size < MIN_RECORD_LENGTH:
            return ChunkWalk(count, pos, ChunkStop.NOT_A_RECORD)
        if pos + size > limit:
            break
        if count and pos + size - start > max_bytes:
            return ChunkWalk(count, pos, ChunkStop.BUDGET)
        pos += size
        count += 1
    return ChunkWalk(count, pos, ChunkStop.LIMIT)
