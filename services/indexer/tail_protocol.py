"""What a Tail chunk may do to the reput offset, checked before anything is dispatched.

A chunk must start at the reput offset. Its ``next_offset`` is then one of: the end of its data
(records back to back, or an empty heartbeat at the end of the log), or, when the data stops at a
BLANK end of file, the start of the next commitlog file. The BLANK case includes a chunk with no
records at all: the reader stood on the BLANK (a caught-up reader waits exactly there when the writer
rolls), or on a file that is BLANK from its first byte.

A quarantine skip: a chunk with no records that starts inside a range the commitlog quarantined at
recovery (damaged bytes it stepped over, services/store/formats/quarantine.py) and whose ``next_offset`` is
that range's end. It is taken only for a range GetStoreInfo lists (``quarantined_ranges``): the
records it skips are lost, and saying so is the commitlog's call, never the stream's.

Any other jump would skip records and leave holes in the ConsumeQueues, so it is refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


class ChunkMismatch(Exception):
    """The chunk does not continue the log from the reput offset: reconnect from the reput offset."""


@dataclass(slots=True, frozen=True)
class ChunkStep:
    """Where a checked chunk moves the reput offset. ``blank_offset`` is the offset of the BLANK the
    chunk skips (its data's end), or -1 when it skips nothing."""

    next_offset: int
    blank_offset: int = -1
    #: The quarantined range [start, end) a quarantine skip steps over, or None.
    quarantined: tuple[int, int] | None = None


def next_file_start(offset: int, file_size: int) -> int:
    """The first offset of the commitlog file after the one holding ``offset``."""
    return (offset // file_size + 1) * file_size


def check_chunk(start_offset: int, data_size: int, record_count: int, next_offset: int, reput_offset: int,
                file_size: int, quarantined: Sequence[tuple[int, int]] = ()) -> ChunkStep:
    """The step a chunk makes from ``reput_offset``; ChunkMismatch if it is not one the log allows.
    ``file_size`` is the commitlog's mappedFileSizeCommitLog and ``quarantined`` its quarantined
    ranges as [start, end) pairs (both from GetStoreInfo)."""
    if start_offset != reput_offset:
        raise ChunkMismatch(f"chunk starts at {start_offset}, reput offset is {reput_offset}")
    if (record_count > 0) != (data_size > 0):
        raise ChunkMismatch(f"chunk at {start_offset} has {record_count} records in {data_size} bytes")
    data_end = start_offset + data_size
    if next_offset == data_end:
        return ChunkStep(next_offset)
    if not data_size:
        for low, high in quarantined:
            if low <= start_offset < high and next_offset == high:
                return ChunkStep(next_offset, quarantined=(low, high))
    if file_size <= 0:
        raise ChunkMismatch(f"chunk at {start_offset} skips from {data_end} to {next_offset}, but the "
                            "commitlog reported no file size to check that against")
    expected = next_file_start(data_end, file_size)
    if next_offset != expected:
        raise ChunkMismatch(f"chunk at {start_offset} skips from {data_end} to {next_offset}: a BLANK end of "
                            f"file can only skip to the next file's start, {expected}")
    return ChunkStep(next_offset, data_end)
