"""``mqstore inspect commitlog`` on a damaged log (issue 15, defect 7): the corrupt region goes to
stderr in one line. Intact records after a bad one (a recovery would drop them): exit 1, or 0 with
``--allow-corrupt``. A torn last record (what a crash leaves, nothing valid after it): a warning, exit 0.
"""

from __future__ import annotations

from pathlib import Path

from tests.commitlog.commitlog_process import run_mqstore
from tests.commitlog.test_recovery_corruption import FILE_SIZE, flip, write_store
from tests.conftest import StoreFactory


def inspect(root: Path, *args: str) -> tuple[int, str, str]:
    done = run_mqstore("inspect", "commitlog", root / "commitlog", *args)
    return done.returncode, done.stdout.decode(), done.stderr.decode()


def test_a_damaged_record_with_intact_records_after_it_exits_1(tmp_path: Path) -> None:
    ends = write_store(tmp_path, 400)
    victim = 150
    cut = ends[victim - 1]
    flip(tmp_path, cut + 84 + 4 + 3)  # a byte of its body
    code, out, err = inspect(tmp_path)
    assert code == 1
    assert out.splitlines()[-1].startswith(f"# {victim} records, {cut // FILE_SIZE} blanks; data ends at "
                                           f"offset {cut}: body CRC mismatch")
    [line] = err.splitlines()
    assert line.startswith("mqstore inspect commitlog: error: damaged record at offset "
                           f"{cut} (body CRC mismatch")
    assert f"with {len(ends) - victim - 1} intact records after it" in line
    assert f"up to offset {ends[-1]}" in line and "--allow-corrupt" in line
    code, out, err = inspect(tmp_path, "--json", "--allow-corrupt")
    assert code == 0 and len(out.splitlines()) == victim + cut // FILE_SIZE  # the records and BLANKs before it
    assert err.startswith(f"mqstore inspect commitlog: warning: damaged record at offset {cut}")


def test_a_torn_tail_is_a_warning_and_exits_0(pristine_store: StoreFactory) -> None:
    code, out, err = inspect(pristine_store("torn-raw"))
    assert code == 0 and out.splitlines()[-1].endswith("total size says 277)")
    [line] = err.splitlines()
    assert line.startswith("mqstore inspect commitlog: warning: torn record at offset 2033918 (torn or garbled")
    assert "277 bytes, no valid record after it" in line


def test_a_clean_log_says_nothing_on_stderr(pristine_store: StoreFactory) -> None:
    for store in ("crash-raw", "normal-raw"):
        code, _, err = inspect(pristine_store(store))
        assert (code, err) == (0, "")
