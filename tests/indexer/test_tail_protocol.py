"""The reput loop's rules for a Tail chunk (which skips it takes) and how it reports a stall."""

from __future__ import annotations

import logging

import pytest

from services.indexer.reput import ResyncWatch
from services.indexer.tail_protocol import ChunkMismatch, ChunkStep, check_chunk

FILE = 1024 * 1024


@pytest.mark.parametrize(("start", "size", "records", "next_offset", "step"), [
    (100, 50, 2, 150, ChunkStep(150)),  # records back to back
    (150, 0, 0, 150, ChunkStep(150)),  # a heartbeat at the end of the log
    (100, 50, 2, FILE, ChunkStep(FILE, 150)),  # records up to a BLANK end of file
    (900_000, 0, 0, FILE, ChunkStep(FILE, 900_000)),  # a caught-up reader standing on the BLANK
    (FILE, 0, 0, 2 * FILE, ChunkStep(2 * FILE, FILE)),  # a file BLANK from its first byte
])
def test_steps_the_log_allows(start: int, size: int, records: int, next_offset: int, step: ChunkStep) -> None:
    assert check_chunk(start, size, records, next_offset, start, FILE) == step


@pytest.mark.parametrize(("start", "size", "records", "next_offset", "reput", "why"), [
    (FILE, 50, 1, FILE + 50, 900_000, "chunk starts at 1048576, reput offset is 900000"),
    (100, 50, 2, 2 * FILE, 100, "a BLANK end of file can only skip to the next file's start, 1048576"),
    (900_000, 0, 0, 950_000, 900_000, "skips from 900000 to 950000"),  # not a file start
    (FILE, 0, 0, 3 * FILE, FILE, "skips from 1048576 to 3145728"),  # over a whole file
    (100, 50, 2, 120, 100, "skips from 150 to 120"),  # backwards
    (100, 50, 0, 150, 100, "0 records in 50 bytes"),
])
def test_other_steps_are_refused(start: int, size: int, records: int, next_offset: int, reput: int,
                                 why: str) -> None:
    with pytest.raises(ChunkMismatch, match=why):
        check_chunk(start, size, records, next_offset, reput, FILE)


def test_a_skip_needs_the_file_size() -> None:
    with pytest.raises(ChunkMismatch, match="no file size"):
        check_chunk(100, 0, 0, FILE, 100, 0)


def test_resyncs_repeating_at_one_offset_become_warnings(caplog: pytest.LogCaptureFixture) -> None:
    watch = ResyncWatch(stall_after=3)
    caplog.set_level(logging.INFO, logger="services.indexer.reput")

    def levels() -> list[str]:
        found = [r.levelname for r in caplog.records]
        caplog.clear()
        return found

    for _ in range(4):
        watch.resynced(1_041_117, "chunk starts at 1048576, reput offset is 1041117")
    assert "reput stalled at reput offset 1041117: resynchronised 4 times in a row" in caplog.text
    assert "chunk starts at 1048576" in caplog.text
    assert levels() == ["INFO", "INFO", "WARNING", "WARNING"]

    watch.resynced(2_000_000, "moved on")  # another offset: a new count
    assert levels() == ["INFO"]
    watch.resynced(2_000_000, "x")
    watch.progressed()  # a chunk was accepted in between: not a stall
    watch.resynced(2_000_000, "x")
    watch.resynced(2_000_000, "x")
    assert levels() == ["INFO", "INFO", "INFO"]
