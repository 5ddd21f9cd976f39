"""The one chunk walk (services/store/formats/chunk_walk.py): where it stops, and why, on records laid
back to back as a commitlog file holds them. Its two callers (the commitlog's Tail, the indexer's file
reads) are held against each other in tests/indexer/test_commitlog_files.py."""

from __future__ import annotations

import pytest

from services.store.formats.chunk_walk import ChunkStop, ChunkWalk, walk_chunk
from services.store.formats.record import MIN_RECORD_LENGTH, encode_blank, encode_record
from services.store.formats.socket_address import encode_address


def records(*body_sizes: int) -> list[bytes]:
    out, offset = [], 0
    for size in body_sizes:
        record = encode_record(topic=b"T", queue_id=0, body=bytes(size), flag=0, properties=b"", sys_flag=0,
                               born_timestamp=1, born_host=encode_address("10.0.0.1:1"),
                               store_host=encode_address("10.0.0.2:2"), queue_offset=0, commitlog_offset=offset,
                               store_timestamp=1)
        out.append(record)
        offset += len(record)
    return out


R = records(10, 500, 20, 1000)
DATA = b"".join(R)
ENDS = [sum(len(r) for r in R[:i + 1]) for i in range(len(R))]


def test_the_smallest_record_is_91_bytes() -> None:
    assert MIN_RECORD_LENGTH == 91 == len(records(0)[0]) - 1  # "T" is one byte of topic


@pytest.mark.parametrize(("start", "limit", "max_bytes", "walked"), [
    (0, len(DATA), 1 << 20, ChunkWalk(4, ENDS[3], ChunkStop.LIMIT)),
    (0, ENDS[2] + 50, 1 << 20, ChunkWalk(3, ENDS[2], ChunkStop.LIMIT)),  # the 4th record not wholly readable
    (0, len(DATA), ENDS[1], ChunkWalk(2, ENDS[1], ChunkStop.BUDGET)),
    (0, len(DATA), ENDS[1] - 1, ChunkWalk(1, ENDS[0], ChunkStop.BUDGET)),
    (ENDS[0], len(DATA), 1, ChunkWalk(1, ENDS[1], ChunkStop.BUDGET)),  # at least one record, whatever its size
    (ENDS[2], ENDS[2] + 7, 1 << 20, ChunkWalk(0, ENDS[2], ChunkStop.LIMIT)),  # less than a header left
])
def test_records_up_to_the_limit_and_the_budget(start: int, limit: int, max_bytes: int, walked: ChunkWalk) -> None:
    assert walk_chunk(DATA, start, limit, max_bytes) == walked


def test_a_blank_and_bytes_that_are_no_record_stop_the_walk() -> None:
    with_blank = DATA[:ENDS[1]] + encode_blank(4096) + bytes(4088)
    assert walk_chunk(with_blank, 0, len(with_blank), 1 << 20) == ChunkWalk(2, ENDS[1], ChunkStop.BLANK)
    assert walk_chunk(with_blank, ENDS[1], len(with_blank), 1) == ChunkWalk(0, ENDS[1], ChunkStop.BLANK)
    zeros = DATA[:ENDS[0]] + bytes(200)
    assert walk_chunk(zeros, 0, len(zeros), 1 << 20) == ChunkWalk(1, ENDS[0], ChunkStop.NOT_A_RECORD)
