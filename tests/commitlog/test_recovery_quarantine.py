"""One bad byte does not cost every later record (issue 17, item 9).

Under ``recoverCorruptionMode: quarantine`` (the default) recovery steps over a damaged record that has
intact records after it: the range [bad record, next valid record) is quarantined (kept in
config/quarantine.json), reads of it answer DATA_LOSS, the Tail skips it with an announced chunk, the
later records stay readable and new records go after the end of the log. ``cut`` keeps RocketMQ's
rule (tests/commitlog/test_recovery_corruption.py). Small geometry: 64 KiB commitlog files.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from services.commitlog.message_store import MessageStore
from services.indexer.tail_protocol import ChunkMismatch, ChunkStep, check_chunk
from services.store.errors import DataLossError
from services.store.formats.message import Message
from services.store.formats.quarantine import QuarantinedRange
from services.store.formats.record import decode_record
from tests.commitlog.commitlog_process import run_mqstore
from tests.commitlog.test_recovery_corruption import FILE_SIZE, crash, flip, recovery_warnings, write_store
from tests.conftest import StoreFactory
from tests.test_recovery import FIXTURE_FILE_SIZE, fixture_config, opened, small_config

BODY = 84 + 4 + 10  # a byte inside a record's body: a CRC mismatch


def tail_all(log: MessageStore, start: int = 0) -> tuple[list[int], list[tuple[int, int]]]:
    """Follow the Tail from ``start`` to the end: (record offsets, skips as (from, to))."""
    offsets: list[int] = []
    skips: list[tuple[int, int]] = []
    offset = start
    while True:
        chunk = log.tail_chunk(offset, 64 * 1024)
        if chunk.record_count:
            pos = 0
            while pos < len(chunk.data):
                offsets.append(chunk.start_offset + pos)
                pos += int.from_bytes(chunk.data[pos:pos + 4], "big")
        elif chunk.next_offset == offset:
            return offsets, skips
        if chunk.next_offset != chunk.start_offset + len(chunk.data):
            skips.append((chunk.start_offset + len(chunk.data), chunk.next_offset))
        offset = chunk.next_offset


@pytest.mark.parametrize("abnormal", [False, True])
def test_a_damaged_record_is_quarantined_and_the_records_after_it_stay(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, abnormal: bool) -> None:
    ends = write_store(tmp_path)
    written = ends[-1]
    # Normal recovery walks the last three files: put the victim there; abnormal walks from file 0.
    victim = 100 if abnormal else next(i for i, end in enumerate(ends) if end > written - 2 * FILE_SIZE + 5000)
    bad_start, bad_end = ends[victim - 1], ends[victim]
    flip(tmp_path, bad_start + BODY)
    if abnormal:
        crash(tmp_path)
    caplog.set_level(logging.INFO)
    with opened(tmp_path, small_config()) as log:
        assert log.max_offset == written  # nothing cut
        assert log.recovery.damage is None
        [bad] = log.quarantine.ranges
        assert (bad.start, bad.end) == (bad_start, bad_end) and bad.reason.startswith("body CRC mismatch")
        assert REGISTRY.get_sample_value("mqstore_commitlog_quarantined_bytes") == bad_end - bad_start
        with pytest.raises(DataLossError, match=f"QUARANTINED commitlog range \\[{bad_start}, {bad_end}\\)"):
            log.read(bad_start, bad_end - bad_start)
        with pytest.raises(DataLossError):  # any read reaching into it
            log.read(ends[victim - 2], bad_start - ends[victim - 2] + 1)
        for i in (victim - 1, victim + 1, len(ends) - 1):
            record = decode_record(log.read(ends[i - 1], ends[i] - ends[i - 1]))
            assert record.body == f"body-{i}".encode() * 20
        # The queue offsets continue after the last record of each queue.
        assert log.commit_log.queue_table == {("TopicT", q): len(range(q, len(ends), 4)) for q in range(4)}
        # The Tail announces the skip; every other record is delivered, in order.
        offsets, skips = tail_all(log, ends[victim - 5])
        assert (bad_start, bad_end) in skips
        assert bad_start not in offsets and offsets[:4] == ends[victim - 5:victim - 1]
        assert offsets[4] == bad_end and offsets[-1] == ends[-2]
        # New records go after the end of the log, not over the range.
        result = log.put_message(Message("TopicT", 0, b"after"))
        assert result.commitlog_offset == written
    warnings = recovery_warnings(caplog)
    assert any(f"QUARANTINED offsets [{bad_start}, {bad_end})" in w and
               f"{len(ends) - victim - 1} intact records after it" in w for w in warnings)
    assert not any("cut the log" in w for w in warnings)
    stored = json.loads((tmp_path / "config" / "quarantine.json").read_bytes())
    assert [(r["start"], r["end"]) for r in stored["ranges"]] == [(bad_start, bad_end)]
    # A clean restart whose walk does not reach the range (abnormal: the victim is in file 0) keeps it.
    with opened(tmp_path, small_config()) as log:
        assert log.last_exit_ok and log.max_offset > written
        assert [(r.start, r.end) for r in log.quarantine.ranges] == [(bad_start, bad_end)]
        with pytest.raises(DataLossError):
            log.read(bad_start, 8)


def test_a_damaged_last_record_of_a_file_is_quarantined_to_the_next_file(tmp_path: Path) -> None:
    ends = write_store(tmp_path, 600)
    victim = next(i for i in range(1, len(ends)) if ends[i] // FILE_SIZE > ends[i - 1] // FILE_SIZE) - 1
    bad_start = ends[victim - 1]
    assert bad_start // FILE_SIZE == 0  # the last record of file 0; a BLANK follows it
    flip(tmp_path, bad_start + BODY)
    crash(tmp_path)
    with opened(tmp_path, small_config()) as log:
        assert log.max_offset == ends[-1]
        assert log.quarantine.ranges == (QuarantinedRange(bad_start, FILE_SIZE, log.quarantine.ranges[0].reason),)
        offsets, skips = tail_all(log, ends[victim - 2])
        assert skips[0] == (bad_start, FILE_SIZE) and offsets[:2] == [ends[victim - 2], FILE_SIZE]


def test_cut_mode_drops_the_records_after_the_damage_and_forgets_nothing_else(tmp_path: Path) -> None:
    ends = write_store(tmp_path)
    victim = 100
    flip(tmp_path, ends[victim - 1] + BODY)
    crash(tmp_path)
    with opened(tmp_path, small_config(recover_corruption_mode="cut")) as log:
        assert log.max_offset == ends[victim - 1] and log.quarantine.ranges == ()
        assert log.put_message(Message("TopicT", 0, b"x")).commitlog_offset == ends[victim - 1]
    assert not (tmp_path / "config" / "quarantine.json").exists()


def test_a_torn_tail_is_cut_in_quarantine_mode(tmp_path: Path) -> None:
    ends = write_store(tmp_path, 300)
    flip(tmp_path, ends[-2] + BODY)  # the last record: nothing valid after it
    crash(tmp_path)
    with opened(tmp_path, small_config()) as log:
        assert log.max_offset == ends[-2] and log.quarantine.ranges == ()
        damage = log.recovery.damage
        assert damage is not None and damage.torn_tail


def test_an_unknown_mode_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="recoverCorruptionMode must be quarantine or cut, not 'skip'"):
        small_config(recover_corruption_mode="skip")


def test_the_tail_protocol_takes_a_quarantine_skip_only_over_a_listed_range() -> None:
    listed = [(1000, 1400)]
    assert check_chunk(1000, 0, 0, 1400, 1000, FILE_SIZE, listed) == ChunkStep(1400, quarantined=(1000, 1400))
    with pytest.raises(ChunkMismatch):  # not listed by GetStoreInfo
        check_chunk(1000, 0, 0, 1400, 1000, FILE_SIZE)
    with pytest.raises(ChunkMismatch):  # past the range's end: would hide records
        check_chunk(1000, 0, 0, 1500, 1000, FILE_SIZE, listed)
    with pytest.raises(ChunkMismatch):  # records and a skip in one chunk
        check_chunk(900, 100, 1, 1400, 900, FILE_SIZE, listed)


def test_inspect_lists_the_quarantine_and_the_records_after_it(tmp_path: Path) -> None:
    ends = write_store(tmp_path, 400)
    victim = 150
    bad_start, bad_end = ends[victim - 1], ends[victim]
    flip(tmp_path, bad_start + BODY)
    with opened(tmp_path, small_config()) as log:
        assert [(r.start, r.end) for r in log.quarantine.ranges] == [(bad_start, bad_end)]
    done = run_mqstore("inspect", "commitlog", tmp_path, "--json")
    lines = done.stderr.decode().splitlines()
    assert done.returncode == 0, lines
    assert lines[0].startswith(f"mqstore inspect commitlog: warning: QUARANTINED range [{bad_start}, {bad_end}) "
                               f"({bad_end - bad_start} bytes: body CRC mismatch")
    assert f"--from {bad_end} lists the records after it" in lines[1]
    after = run_mqstore("inspect", "commitlog", tmp_path, "--json", "--from", str(bad_end))
    assert after.returncode == 0
    rows = [json.loads(line) for line in after.stdout.decode().splitlines()]
    assert [r["commit_log_offset"] for r in rows if "commit_log_offset" in r][:2] == [bad_end, ends[victim + 1]]


def test_a_flipped_byte_in_the_crash_fixture_is_quarantined(
        fixture_store: StoreFactory, dump_rows: Callable[..., list[dict[str, Any]]]) -> None:
    """RocketMQ's own crashed store (tests/fixtures/rocketmq-store): the same damage that cut mode cuts
    at (tests/test_recovery.py) costs one record here; the torn tail still ends the log where it did."""
    store = fixture_store("crash-raw")
    rows = dump_rows("crash", "msg")
    index, victim = next((i, r) for i, r in enumerate(rows)
                         if r["commitLogOffset"] > 1_200_000 and r["bodyLen"] > 10)
    path = store / "commitlog" / f"{FIXTURE_FILE_SIZE:020d}"
    with open(path, "r+b") as f:
        f.seek(victim["commitLogOffset"] - FIXTURE_FILE_SIZE + BODY)
        byte = f.read(1)[0]
        f.seek(victim["commitLogOffset"] - FIXTURE_FILE_SIZE + BODY)
        f.write(bytes([byte ^ 0xFF]))
    with opened(store, fixture_config()) as log:
        assert log.max_offset == 2034195
        assert [(r.start, r.end) for r in log.quarantine.ranges] == \
            [(victim["commitLogOffset"], victim["commitLogOffset"] + victim["storeSize"])]
        for row in rows[index + 1:]:
            record = decode_record(log.read(row["commitLogOffset"], row["storeSize"]))
            assert (record.queue_offset, record.body_crc) == (row["queueOffset"], row["bodyCRC"])


def test_the_queue_offset_of_a_lost_last_record_of_its_queue_is_not_handed_out_again(tmp_path: Path) -> None:
    ends = write_store(tmp_path, 400)
    victim = len(ends) - 2  # the last record of its queue; the next record (another queue) is intact
    queue = victim % 4
    flip(tmp_path, ends[victim - 1] + BODY)
    crash(tmp_path)
    for snapshot in (tmp_path / "config").glob("queue_offsets.json*"):  # the table is rebuilt from the log
        snapshot.unlink()
    with opened(tmp_path, small_config()) as log:
        assert [(r.start, r.end) for r in log.quarantine.ranges] == [(ends[victim - 1], ends[victim])]
        assert log.commit_log.queue_table[("TopicT", queue)] == len(range(queue, len(ends), 4))
        assert log.put_message(Message("TopicT", queue, b"next")).queue_offset == len(range(queue, len(ends), 4))
