"""MappedFile details not covered through the CommitLog: prefaulting, name rules, sparse files."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from services.commitlog.message_store import MessageStore
from services.store.config import ConfigError, load_config
from services.store.formats.mapped_file import PREFAULT_AHEAD, PREFAULT_STEP, MappedFile, file_name, parse_file_name
from services.store.formats.mapped_file_queue import MappedFileQueue
from services.store.formats.message import Message


def test_prefault_keeps_content_and_stops_on_request(tmp_path: Path) -> None:
    mapped = MappedFile(tmp_path / file_name(0), 2 * PREFAULT_STEP)
    try:
        mapped.append(b"before")
        assert mapped.prefault(3)
        assert mapped.read(0, 6) == b"before"  # populating never changes bytes
        assert not mapped.prefault(0, should_stop=lambda: True)
        mapped.append(b"after")
        assert mapped.read(0, 11) == b"beforeafter"
    finally:
        mapped.destroy()


def test_the_writer_keeps_a_window_of_page_cache_prefaulted_ahead_not_the_whole_file(tmp_path: Path) -> None:
    """A whole 1 GiB file's page cache took every replica of a shard 1-10 s of a core at a start (and a
    GiB of memory per file): only PREFAULT_AHEAD past the write position is asked for, again once the
    writer is half way there, and the next file's first window before it rolls."""
    size = 4 * PREFAULT_AHEAD  # sparse: no disk space is taken
    mfq = MappedFileQueue(tmp_path, size, reserve_step=PREFAULT_STEP, prefault=True)
    try:
        first = mfq.last_file_for_append(0)
        assert first.prefault_end == PREFAULT_AHEAD
        chunk = b"x" * (1 << 20)
        while first.wrote_position <= PREFAULT_AHEAD // 2:
            mapped = mfq.last_file_for_append()
            mapped.reserve(mapped.wrote_position + len(chunk))
            mapped.append(chunk)
        assert first.prefault_end == PREFAULT_AHEAD  # more than half a window still ahead
        mfq.last_file_for_append()
        assert first.prefault_end == first.wrote_position + PREFAULT_AHEAD  # topped up, not the whole file
        assert first.prefault_end < size
    finally:
        mfq.shutdown()


def test_file_names_are_20_digit_offsets(tmp_path: Path) -> None:
    assert file_name(1048576) == "00000000000001048576"
    assert parse_file_name(tmp_path / "00000000000001048576") == 1048576
    with pytest.raises(ValueError, match="20 digits"):
        parse_file_name(tmp_path / "1048576")


_READER = """
import mmap, sys, time
with open(sys.argv[1], "rb") as f:
    mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    print("mapped", flush=True)
    end = time.monotonic() + float(sys.argv[2])
    while time.monotonic() < end:
        for page in range(len(mm) - 4096, 4096, -65536):
            mm[page]
"""


def test_zero_from_keeps_the_file_size_for_readers_in_other_processes(tmp_path: Path) -> None:
    """Truncating the tail of a file (recovery) must not shrink it, even for an instant: a reader that
    has it mapped (the query service, the indexer) would die of SIGBUS on a page past the shrunk end."""
    size = 4 * 1024 * 1024
    mapped = MappedFile(tmp_path / file_name(0), size)
    try:
        mapped.append(b"x" * (size - 100))
        reader = subprocess.Popen([sys.executable, "-c", _READER, str(mapped.path), "3"], stdout=subprocess.PIPE)
        assert reader.stdout is not None and reader.stdout.readline() == b"mapped\n"
        for _ in range(300):
            mapped.zero_from(8192 + 3)
            assert mapped.path.stat().st_size == size
        assert reader.wait(timeout=30) == 0, "the reader died: the file shrank under its mapping"
        assert mapped.read(8193, 5) == b"xx\0\0\0"
        assert mapped.path.read_bytes()[8195:] == bytes(size - 8195)
    finally:
        mapped.destroy()


# -- sparse files: blocks reserved ahead of the writer ------------------------------------------------
MIB = 1024 * 1024


def allocated(path: Path) -> int:
    return path.stat().st_blocks * 512


def test_a_sparse_file_reserves_blocks_a_step_ahead_of_its_writes(tmp_path: Path) -> None:
    mapped = MappedFile(tmp_path / file_name(0), 64 * MIB, reserve_step=MIB)
    try:
        assert mapped.path.stat().st_size == 64 * MIB
        assert allocated(mapped.path) == MIB == mapped.reserved_position, "the first step, at creation"
        data = bytes(range(256)) * (6 * 1024)  # 1.5 MiB
        mapped.append(data)
        assert mapped.reserved_position == 2 * MIB + MIB // 2
        assert allocated(mapped.path) <= 2 * MIB + MIB // 2 + 64 * 1024
        mapped.reserve(mapped.wrote_position + MIB)  # within the reservation: nothing more
        assert mapped.reserved_position == 2 * MIB + MIB // 2
        assert mapped.read(0, len(data)) == data and mapped.buffer[len(data):3 * MIB] == bytes(3 * MIB - len(data))
    finally:
        mapped.close()
    whole = MappedFile(tmp_path / file_name(64 * MIB), 8 * MIB)
    try:
        assert allocated(whole.path) >= 8 * MIB, "reserve_step 0: allocated whole at creation"
    finally:
        whole.close()


def test_the_commitlog_reserves_ahead_in_steps_not_its_whole_file(tmp_path: Path) -> None:
    config = load_config(environ={"MQSTORE_RESERVE_AHEAD_COMMIT_LOG": str(MIB)},
                         mapped_file_size_commit_log=64 * MIB, prefault_mapped_file=False)
    log = MessageStore(config, tmp_path / "store")
    log.start()
    try:
        log.put_message(Message("Steps", 0, b"s"))
        first = tmp_path / "store" / "commitlog" / file_name(0)
        assert allocated(first) <= MIB + 64 * 1024, allocated(first)
        for _ in range(9):
            log.put_messages([Message("Steps", 0, b"s" * 50_000)] * 10)  # 0.5 MiB
        assert log.max_offset > 4 * MIB and allocated(first) <= log.max_offset + MIB + 64 * 1024, allocated(first)
    finally:
        log.shutdown()
    log = MessageStore(config, tmp_path / "store")  # a restart goes on in steps from where the log ends
    log.start()
    try:
        log.put_message(Message("Steps", 0, b"s"))
        assert allocated(first) <= log.max_offset + MIB + 64 * 1024, allocated(first)
    finally:
        log.shutdown()
    with pytest.raises(ConfigError, match="reserveAheadCommitLog"):
        load_config(environ={}, reserve_ahead_commit_log=-1).validate()
