"""Power cuts, not only kill -9: what the store acknowledged under SYNC_FLUSH survives losing every
byte and every name that was not made durable (tests/powercut/powercut_fs.py).

A killed process leaves its writes in the page cache, so kill -9 cannot tell a store that fsyncs from
one that never does. Here the file system itself forgets: first its own rules are checked, then the
commitlog service is cut ``POWERCUT_CUTS`` times (50 by default) under load and restarted.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import pytest

from tests.powercut.campaign import run_campaign
from tests.powercut.mount import PowerCutMount, available

CUTS = int(os.environ.get("POWERCUT_CUTS", "50"))
UNAVAILABLE = available()
pytestmark = pytest.mark.skipif(UNAVAILABLE is not None, reason=f"no FUSE here: {UNAVAILABLE}")


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def test_the_file_system_keeps_only_what_was_made_durable(fs: PowerCutMount) -> None:
    root = fs.mount
    (root / "dir").mkdir()
    _fsync(root)
    durable = root / "dir" / "durable"
    with open(durable, "wb") as f:
        f.write(b"synced")
        f.flush()
        os.fsync(f.fileno())
    _fsync(root / "dir")
    with open(durable, "ab") as f:
        f.write(b" and not synced")
    mapped = root / "dir" / "mapped"  # a shared writable mapping: durable once msync'd / fdatasync'd
    with open(mapped, "w+b") as f:
        f.truncate(8192)
        os.fsync(f.fileno())
        _fsync(root / "dir")
        view = mmap.mmap(f.fileno(), 8192)
        view[:6] = b"msync'"
        view.flush()
        view[4096:4103] = b"dirty p"
        view.close()
    named_only = root / "dir" / "named-only"  # its data synced, its directory not
    with open(named_only, "wb") as f:
        f.write(b"x")
        f.flush()
        os.fsync(f.fileno())
    fs.cut(lambda: None)

    backing = fs.backing / "dir"
    assert sorted(p.name for p in backing.iterdir()) == ["durable", "mapped"]
    assert (backing / "durable").read_bytes() == b"synced"
    data = (backing / "mapped").read_bytes()
    assert data[:6] == b"msync'" and data[4096:4103] == bytes(7)

    fs.start()
    (root / "dir" / "durable").unlink()  # a deletion and a rename the directory never made durable
    (root / "dir" / "mapped").rename(root / "dir" / "renamed")
    fs.cut(lambda: None)
    assert sorted(p.name for p in backing.iterdir()) == ["durable", "mapped"]


@pytest.mark.timeout(900)  # about 70 s on a busy two-core machine; more when the suite runs in parallel
def test_acknowledged_appends_survive_power_cuts_under_sync_flush(tmp_path: Path) -> None:
    result = run_campaign(tmp_path / "campaign", CUTS, seed=24)
    print(f"power-cut campaign: {result.summary()}")
    assert not result.lost, f"acknowledged appends lost after a power cut: {result.summary()}: {result.lost[:10]}"
    assert result.cuts + result.cuts_starting >= CUTS and result.cuts_starting > 0
    assert result.acked > CUTS and result.rolls > 0
