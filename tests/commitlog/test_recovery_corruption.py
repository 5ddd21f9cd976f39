"""A damaged commitlog is never cut silently (issue 15, defect 7).

These run under ``recoverCorruptionMode: cut`` (RocketMQ's rule) where the damage has intact records
after it; quarantine mode (the default) is tested in test_recovery_quarantine.py.

Recovery that stops at a bad record logs a WARNING with the offset, the reason and the bytes the cut
drops (intact records after it included, in later files too), and says so in its result and metrics;
a clean end of the log (zeros after the last record) stays INFO. ``mqstore inspect commitlog``
reports it too (tests/commitlog/test_inspect_corruption.py).
Small geometry: 64 KiB commitlog files, so the damage sits files before the end.
"""

from __future__ import annotations

import logging
import struct
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from services.commitlog.message_store import MessageStore
from services.store.formats.checkpoint import StoreCheckpoint
from tests.conftest import StoreFactory
from tests.test_recovery import fixture_config, opened, put_many, small_config

FILE_SIZE = 64 * 1024
RECOVERY_LOGGER = "services.commitlog.recovery"


def write_store(root: Path, count: int = 1200) -> list[int]:
    """``count`` records over several files, stopped cleanly. Returns each record's end offset."""
    with opened(root, small_config()) as log:
        return put_many(log, count)


def patch(root: Path, offset: int, data: bytes) -> None:
    """Overwrite commitlog bytes at ``offset`` (in whichever file holds it)."""
    with open(root / "commitlog" / f"{offset - offset % FILE_SIZE:020d}", "r+b") as f:
        f.seek(offset % FILE_SIZE)
        f.write(data)


def flip(root: Path, offset: int) -> None:
    with open(root / "commitlog" / f"{offset - offset % FILE_SIZE:020d}", "r+b") as f:
        f.seek(offset % FILE_SIZE)
        byte = f.read(1)[0]
        f.seek(offset % FILE_SIZE)
        f.write(bytes([byte ^ 0x5A]))


def crash(root: Path) -> None:
    """As after kill -9: the abort file is there, and a stale checkpoint makes the walk start at the first file."""
    (root / "abort").touch()
    checkpoint = StoreCheckpoint(root / "checkpoint")
    checkpoint.physic_msg_timestamp = 0
    checkpoint.close()


def recovery_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == RECOVERY_LOGGER and r.levelno >= logging.WARNING]


def gauge(name: str) -> float | None:
    return REGISTRY.get_sample_value(f"mqstore_commitlog_recovery_{name}")


def test_a_crc_failure_in_normal_recovery_warns_with_offset_reason_and_dropped_bytes(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    ends = write_store(tmp_path)
    written = ends[-1]
    assert written > 4 * FILE_SIZE  # so normal recovery does not walk the first file
    # A record in the second-last file but one: inside what normal recovery walks (the last three files).
    victim = next(i for i, end in enumerate(ends) if end > written - 2 * FILE_SIZE + 5000)
    cut = ends[victim - 1]
    flip(tmp_path, cut + 84 + 4 + 10)  # a byte of its body
    caplog.set_level(logging.INFO)
    with opened(tmp_path, small_config(recover_corruption_mode="cut")) as log:
        assert log.last_exit_ok and log.max_offset == cut
        damage = log.recovery.damage
        assert damage is not None and not damage.torn_tail
        assert damage.offset == cut and damage.reason.startswith("body CRC mismatch")
        assert damage.dropped_bytes == written - cut
        assert damage.intact_records == len(ends) - victim - 1
        assert gauge("dropped_bytes") == written - cut
        assert gauge("dropped_records") == len(ends) - victim - 1
    [warning] = recovery_warnings(caplog)
    assert f"at offset {cut}" in warning and "CORRUPT record (body CRC mismatch" in warning
    assert f"{written - cut} bytes dropped up to offset {written}" in warning
    assert f"{len(ends) - victim - 1} intact records after it lost" in warning


@pytest.mark.parametrize(("field", "value", "reason"), [
    (4, struct.pack(">I", 0x12345678), "bad magic code 0x12345678"),
    (0, struct.pack(">i", 50_000_000), "bad TOTALSIZE 50000000"),
    (28, struct.pack(">q", 12), "PHYSICALOFFSET mismatch: the record claims offset 12"),
    (84, struct.pack(">i", 3), "torn or garbled record"),  # BODYLENGTH: the fields no longer add up
])
def test_abnormal_recovery_names_the_damage(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                            field: int, value: bytes, reason: str) -> None:
    ends = write_store(tmp_path)
    victim = 100  # in the first file
    cut = ends[victim - 1]
    patch(tmp_path, cut + field, value)
    crash(tmp_path)
    caplog.set_level(logging.INFO)
    with opened(tmp_path, small_config(recover_corruption_mode="cut")) as log:
        assert not log.last_exit_ok and log.max_offset == cut
        assert len(log.commit_log.mfq.files) == 1  # the later files went with the cut
        damage = log.recovery.damage
        assert damage is not None and damage.reason.startswith(reason)
        assert (damage.dropped_bytes, damage.intact_records) == (ends[-1] - cut, len(ends) - victim - 1)
    [warning] = recovery_warnings(caplog)
    assert f"at offset {cut}: CORRUPT record ({reason}" in warning
    assert f"{ends[-1] - cut} bytes dropped" in warning


def test_a_torn_last_record_is_reported_as_a_torn_tail(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    ends = write_store(tmp_path, 300)
    torn_at = ends[-2]
    patch(tmp_path, torn_at + 40, bytes(ends[-1] - torn_at - 40))
    crash(tmp_path)
    caplog.set_level(logging.INFO)
    with opened(tmp_path, small_config()) as log:
        assert log.max_offset == torn_at
        damage = log.recovery.damage
        assert damage is not None and damage.torn_tail
        assert (damage.offset, damage.dropped_bytes) == (torn_at, ends[-1] - torn_at)
        assert gauge("dropped_records") == 0 and gauge("dropped_bytes") == ends[-1] - torn_at
    [warning] = recovery_warnings(caplog)
    assert f"at offset {torn_at}: torn last record" in warning
    assert f"{ends[-1] - torn_at} bytes dropped, no valid record after it" in warning


@pytest.mark.parametrize("abnormal", [False, True])
def test_a_clean_end_of_the_log_stays_info(tmp_path: Path, caplog: pytest.LogCaptureFixture, abnormal: bool) -> None:
    ends = write_store(tmp_path, 600)
    if abnormal:
        crash(tmp_path)
    caplog.set_level(logging.INFO)
    with opened(tmp_path, small_config()) as log:
        assert log.max_offset == ends[-1]
        assert log.recovery.damage is None and log.recovery.records > 0
        assert gauge("dropped_bytes") == 0
    assert recovery_warnings(caplog) == []
    assert any(r.name == RECOVERY_LOGGER and f"the log ends at {ends[-1]}" in r.getMessage()
               for r in caplog.records)


def test_the_torn_fixture_store_warns(fixture_store: StoreFactory, caplog: pytest.LogCaptureFixture) -> None:
    """RocketMQ's own store with its last record cut to 64 bytes (tests/fixtures/README.md)."""
    caplog.set_level(logging.INFO)
    log = MessageStore(fixture_config(), fixture_store("torn-raw"))
    log.start()
    try:
        assert log.max_offset == 2033918
    finally:
        log.shutdown()
    [warning] = recovery_warnings(caplog)
    assert "at offset 2033918: torn last record (torn or garbled record" in warning
    assert "277 bytes dropped" in warning
