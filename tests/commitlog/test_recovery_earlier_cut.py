"""Quarantine never revives records that an earlier recovery cut off.

RocketMQ's recovery cuts the log at a damaged record and leaves the bytes after it on disk; a broker
that then stops cleanly leaves a store whose damaged record has intact (dropped) records after it.
Those are not live data: ``quarantine`` (the default) must end the log where RocketMQ did, like
``cut``. The same goes for records left past an earlier cut that later writes overwrote in part.
Damage inside the log that was live (bit rot) is still quarantined (test_recovery_quarantine.py).
The stores are copies of RocketMQ 4.9.8's own (tests/fixtures/rocketmq-store).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from services.store.errors import StoreError
from services.store.formats.message import Message
from tests.commitlog.test_recovery_corruption import recovery_warnings
from tests.commitlog.test_recovery_quarantine import BODY
from tests.conftest import StoreFactory
from tests.test_recovery import FIXTURE_FILE_SIZE, fixture_config, opened

Rows = Callable[..., list[dict[str, Any]]]
CRASH_END = 2034195


def cut_by_rocketmq(store: Path, rows: list[dict[str, Any]]) -> tuple[int, dict[str, Any]]:
    """Flip a body byte of the first record past 1,200,000 of a store RocketMQ recovered and stopped
    cleanly: the picture its recovery leaves when it cut the log at that CRC failure (the commitlog's
    bytes after the cut stay; its ConsumeQueue and index changes are not read by the commitlog)."""
    index, victim = next((i, r) for i, r in enumerate(rows) if r["commitLogOffset"] > 1_200_000 and r["bodyLen"] > 10)
    path = store / "commitlog" / f"{FIXTURE_FILE_SIZE:020d}"
    with open(path, "r+b") as f:
        f.seek(victim["commitLogOffset"] - FIXTURE_FILE_SIZE + BODY)
        byte = f.read(1)[0]
        f.seek(victim["commitLogOffset"] - FIXTURE_FILE_SIZE + BODY)
        f.write(bytes([byte ^ 0xFF]))
    return index, victim


@pytest.mark.parametrize("name", ["crash-recovered", "torn-recovered", "normal-raw"])
def test_records_after_a_crc_failure_in_a_cleanly_stopped_rocketmq_store_are_not_revived(
        fixture_store: StoreFactory, dump_rows: Rows, caplog: pytest.LogCaptureFixture, name: str) -> None:
    store = fixture_store(name)
    rows = dump_rows("normal" if name == "normal-raw" else name.partition("-")[0], "msg")
    index, victim = cut_by_rocketmq(store, rows)
    dropped = len(rows) - index
    assert dropped > 500
    caplog.set_level(logging.INFO)
    with opened(store, fixture_config()) as log:
        assert log.quarantine.ranges == ()
        assert log.max_offset == victim["commitLogOffset"]
        damage = log.recovery.damage
        assert damage is not None and damage.intact_records == dropped - 1
        with pytest.raises(StoreError):
            log.read(rows[index + 1]["commitLogOffset"], rows[index + 1]["storeSize"])
        assert log.put_message(Message("TopicA", 0, b"next")).commitlog_offset == victim["commitLogOffset"]
    assert any("no record of the log having been live past it" in w for w in recovery_warnings(caplog))
    assert not (store / "config" / "quarantine.json").exists()


def test_records_left_past_an_earlier_cut_that_later_writes_overwrote_in_part_are_not_revived(
        fixture_store: StoreFactory, dump_rows: Rows, caplog: pytest.LogCaptureFixture) -> None:
    """The broker wrote after its cut and was killed: its new records end inside the old ones, whose
    store times are older than the new records'. A crash recovery ends at the new records' end."""
    store = fixture_store("crash-recovered")
    rows = dump_rows("crash", "msg")
    _, victim = cut_by_rocketmq(store, rows)
    path = store / "commitlog" / f"{FIXTURE_FILE_SIZE:020d}"
    old = path.read_bytes()
    with opened(store, fixture_config(recover_corruption_mode="cut")) as log:  # cuts there (and zeroes)
        for i in range(3):
            log.put_message(Message("TopicA", 0, b"after the cut %d" % i))
        new_end = log.max_offset
    assert new_end not in {r["commitLogOffset"] for r in rows}  # the old bytes there are no record start
    with open(path, "r+b") as f:  # as RocketMQ leaves them: the old bytes past the new end
        f.seek(new_end - FIXTURE_FILE_SIZE)
        f.write(old[new_end - FIXTURE_FILE_SIZE:CRASH_END - FIXTURE_FILE_SIZE])
    (store / "abort").touch()
    caplog.set_level(logging.INFO)
    with opened(store, fixture_config()) as log:
        assert log.quarantine.ranges == ()
        assert log.max_offset == new_end
        later = next(r for r in rows if r["commitLogOffset"] > new_end)
        with pytest.raises(StoreError):
            log.read(later["commitLogOffset"], later["storeSize"])
    assert any("older than the record before" in w for w in recovery_warnings(caplog))


def test_damage_inside_a_rocketmq_log_that_was_live_is_still_quarantined(
        fixture_store: StoreFactory, dump_rows: Rows) -> None:
    """The crashed store RocketMQ has not recovered yet (abort present): its records after the damage
    were being written when it died, in store-time order: live, so quarantined."""
    store = fixture_store("crash-raw")
    rows = dump_rows("crash", "msg")
    _, victim = cut_by_rocketmq(store, rows)
    with opened(store, fixture_config()) as log:
        assert log.max_offset == CRASH_END
        assert [(r.start, r.end) for r in log.quarantine.ranges] == \
            [(victim["commitLogOffset"], victim["commitLogOffset"] + victim["storeSize"])]
