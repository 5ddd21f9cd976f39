"""``mqstore inspect commitlog`` end to end (the installed console script, as a user runs it), and the
directory checks of the offline walk."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from services.store.commitlog_files import (
    CommitLogError,
    commitlog_file_name,
    iter_commitlog,
    list_commitlog_files,
)
from services.store.inspect_commitlog import main
from tests.commitlog.commitlog_process import mqstore_command, run_mqstore
from tests.conftest import DumpRows, LinesLoader, StoreFactory

MIB = 1024 * 1024


def run_cli(*args: str | Path) -> subprocess.CompletedProcess[bytes]:
    return run_mqstore("inspect", "commitlog", *args)


def _dump_entry_lines(dump_lines: LinesLoader, run: str) -> list[str]:
    return [line for line in dump_lines(run) if line.startswith(('{"type":"msg"', '{"type":"blank"'))]


def test_json_output_is_the_dump(pristine_store: StoreFactory, dump_lines: LinesLoader,
                                 dump_rows: DumpRows) -> None:
    result = run_cli(pristine_store("normal-raw") / "commitlog", "--json")
    assert result.returncode == 0, result.stderr.decode()
    assert result.stderr == b""
    lines = result.stdout.decode("utf-8").splitlines()
    assert lines == _dump_entry_lines(dump_lines, "normal")  # byte for byte, key order included
    assert [json.loads(line) for line in lines] == dump_rows("normal", "msg", "blank")


def test_from_a_mid_boundary_prints_the_rest(pristine_store: StoreFactory, dump_lines: LinesLoader) -> None:
    expected = _dump_entry_lines(dump_lines, "crash")
    middle = len(expected) // 2
    offset = json.loads(expected[middle])["commitLogOffset"]
    result = run_cli(pristine_store("crash-recovered") / "commitlog", "--from", str(offset), "--json")
    assert result.returncode == 0, result.stderr.decode()
    assert result.stdout.decode().splitlines() == expected[middle:]


def test_from_a_blank_starts_with_it(pristine_store: StoreFactory) -> None:
    result = run_cli(pristine_store("normal-raw") / "commitlog", "--from", "2094972", "--json")
    assert result.returncode == 0
    first, second = (json.loads(line) for line in result.stdout.decode().splitlines()[:2])
    assert first == {"type": "blank", "commitLogOffset": 2094972, "size": 2180, "magic": -875286124}
    assert second["commitLogOffset"] == 2 * MIB


@pytest.mark.parametrize(("offset", "message"), [
    ("162", "not a record boundary"),      # one byte into the second record
    ("3008717", "past the end of data"),   # the write position: zeros follow
    ("-1", "outside the commitlog files"),
    ("3145728", "outside the commitlog files"),
])
def test_from_a_non_boundary_exits_2(pristine_store: StoreFactory, offset: str, message: str) -> None:
    result = run_cli(pristine_store("normal-raw") / "commitlog", "--from", offset, "--json")
    assert result.returncode == 2
    assert result.stdout == b""
    err = result.stderr.decode()
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_from_the_torn_record_prints_nothing(pristine_store: StoreFactory) -> None:
    """Its head (magic, PHYSICALOFFSET) is intact, so it is a boundary; the record itself ends the data."""
    result = run_cli(pristine_store("torn-raw") / "commitlog", "--from", "2033918", "--json")
    assert (result.returncode, result.stdout) == (0, b"")


@pytest.mark.parametrize("where", ["missing", "store-root"])
def test_a_bad_directory_exits_2(pristine_store: StoreFactory, tmp_path: Path, where: str) -> None:
    path = tmp_path / "nope" if where == "missing" else pristine_store("normal-raw")
    result = run_cli(path)
    assert result.returncode == 2 and result.stdout == b""
    assert result.stderr.decode().count("\n") == 1


def test_table_mode(pristine_store: StoreFactory) -> None:
    result = run_cli(pristine_store("normal-raw") / "commitlog")
    assert result.returncode == 0, result.stderr.decode()
    lines = result.stdout.decode("utf-8").splitlines()
    assert lines[0].split() == ["OFFSET", "SIZE", "TOPIC", "QUEUE", "QOFFSET", "STORE", "TIME", "(UTC)",
                                "TAGS", "KEYS"]
    assert len(lines) == 1 + 3000 + 2 + 1
    assert lines[1].split() == ["0", "161", "TopicA", "0", "0", "2026-11-21", "22:18:42.778", "-", "-"]
    assert any("TagC-标签" in line and "user-7" in line for line in lines)
    assert sum("BLANK" in line for line in lines) == 2
    assert lines[-1] == "# 3000 records, 2 blanks; data ends at offset 3008717: all zero bytes (end of data)"
    # Columns line up: every record row has its topic at the header's TOPIC column.
    column = lines[0].index("TOPIC")
    assert all(line[column - 2:column] == "  " and line[column] != " " for line in lines[1:50])


def test_torn_store_table_says_why_the_data_ends(pristine_store: StoreFactory) -> None:
    result = run_cli(pristine_store("torn-raw") / "commitlog", "--from", "2032957")
    last = result.stdout.decode().splitlines()[-1]
    assert result.returncode == 0
    assert last.startswith("# 3 records, 0 blanks; data ends at offset 2033918: torn or garbled record")


def test_broken_pipe_is_quiet(pristine_store: StoreFactory) -> None:
    """``mqstore inspect commitlog DIR --json | head -1``: no traceback, exit 0."""
    proc = subprocess.Popen([*mqstore_command(), "inspect", "commitlog", pristine_store("normal-raw") / "commitlog",
                             "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=60) == 0
    assert json.loads(first)["commitLogOffset"] == 0
    assert err == b""


def test_main_in_process(pristine_store: StoreFactory, capsysbinary: pytest.CaptureFixture[bytes]) -> None:
    assert main(str(pristine_store("torn-recovered") / "commitlog"), 2033580, True) == 0
    out = capsysbinary.readouterr().out.decode().splitlines()
    assert [json.loads(line)["commitLogOffset"] for line in out] == [2033580]


# --- the directory checks behind the CLI -------------------------------------------------------------

def test_stray_file_is_refused(fixture_store: StoreFactory) -> None:
    commitlog = fixture_store("normal-raw") / "commitlog"
    (commitlog / "notes.txt").write_text("x")
    with pytest.raises(CommitLogError, match="notes.txt: not a commitlog file"):
        list_commitlog_files(commitlog)
    result = run_cli(commitlog)
    assert result.returncode == 2 and b"notes.txt" in result.stderr


def test_wrong_size_and_gaps_are_refused(fixture_store: StoreFactory) -> None:
    commitlog = fixture_store("normal-raw") / "commitlog"
    os.truncate(commitlog / commitlog_file_name(2 * MIB), MIB - 1)
    with pytest.raises(CommitLogError, match="differs from the mapped file size"):
        list_commitlog_files(commitlog)
    (commitlog / commitlog_file_name(MIB)).unlink()
    (commitlog / commitlog_file_name(2 * MIB)).unlink()
    (commitlog / commitlog_file_name(3 * MIB)).write_bytes(bytes(MIB))
    with pytest.raises(CommitLogError, match="gap"):
        list_commitlog_files(commitlog)


def test_explicit_file_size_and_an_empty_directory(tmp_path: Path, pristine_store: StoreFactory) -> None:
    assert list_commitlog_files(tmp_path) == []
    assert list(iter_commitlog(tmp_path)) == []
    with pytest.raises(CommitLogError, match="differs"):
        list_commitlog_files(pristine_store("normal-raw") / "commitlog", file_size=4096)


def test_a_walk_stopped_early_unmaps_cleanly(pristine_store: StoreFactory) -> None:
    walk = iter_commitlog(pristine_store("normal-raw") / "commitlog")
    entries = [next(walk) for _ in range(3)]
    walk.close()
    assert [e.offset for e in entries] == [0, 161, 346]
    assert walk.end is None
