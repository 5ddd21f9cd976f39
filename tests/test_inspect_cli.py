"""``mqstore inspect commitlog`` end to end (the installed console script, as a user runs it), and the
directory checks of the offline walk."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from services.store.formats.commitlog_walk import (
    CommitLogError,
    commitlog_file_name,
    iter_commitlog,
    list_commitlog_files,
)
from services.store.tools.inspect_commitlog import main
from tests.commitlog.commitlog_process import mqstore_command, run_mqstore
from tests.conftest import DumpRows, LinesLoader, StoreFactory
from tests.pipeline.services_store import ServicesStore, write_services_store

MIB = 1024 * 1024


def run_cli(*args: str | Path) -> subprocess.CompletedProcess[bytes]:
    """``--json`` with the field names of RocketMQ's reference dumps, which the tests compare with."""
    names = ("--json-names", "rocketmq") if "--json" in args else ()
    return run_mqstore("inspect", "commitlog", *args, *names)


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


@pytest.mark.parametrize("where", ["missing", "no-commitlog"])
def test_a_bad_directory_exits_2(tmp_path: Path, where: str) -> None:
    path = tmp_path / "nope" if where == "missing" else tmp_path
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
    assert json.loads(first)["commit_log_offset"] == 0
    assert err == b""


def test_main_in_process(pristine_store: StoreFactory, capsysbinary: pytest.CaptureFixture[bytes]) -> None:
    assert main(str(pristine_store("torn-recovered") / "commitlog"), 2033580, True) == 0
    out = capsysbinary.readouterr().out.decode().splitlines()
    assert [json.loads(line)["commit_log_offset"] for line in out] == [2033580]


def test_json_names_are_snake_case_unless_rocketmqs_are_asked_for(pristine_store: StoreFactory) -> None:
    """Like every mqstore command's --json; the reference dumps' camelCase names stay an option, and
    property names (data) keep their spelling."""
    store = pristine_store("normal-raw")
    snake = json.loads(run_mqstore("inspect", "commitlog", store / "commitlog", "--json").stdout.splitlines()[1])
    camel = json.loads(run_mqstore("inspect", "commitlog", store / "commitlog", "--json", "--json-names",
                                   "rocketmq").stdout.splitlines()[1])
    assert snake["commit_log_offset"] == camel["commitLogOffset"] and snake["body_crc"] == camel["bodyCRC"]
    assert snake["dispatch"]["uniq_key"] == camel["dispatch"]["uniqKey"]
    assert snake["properties"] == camel["properties"] and "UNIQ_KEY" in snake["properties"]
    unit = json.loads(run_mqstore("inspect", "consumequeue", store, "--json").stdout.splitlines()[0])
    assert {"queue_id", "cq_offset", "phy_offset", "tags_code"} <= set(unit)


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


# --- both store layouts, and the geometry from the store's settings ---------------------------------

@pytest.fixture(scope="module")
def services_store(tmp_path_factory: pytest.TempPathFactory) -> ServicesStore:
    """mqstore's layout, written by the real services (index files of 997 slots, 5000 entries)."""
    return write_services_store(tmp_path_factory.mktemp("services"))


def run_with_env(env: dict[str, str], *args: str | Path) -> subprocess.CompletedProcess[bytes]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MQSTORE_")}
    return subprocess.run([*mqstore_command(), *map(str, args)], capture_output=True, timeout=60,
                          env={**environ, **env, "LC_ALL": "C", "PYTHONIOENCODING": ""}, check=False)


def test_a_store_root_of_either_layout(pristine_store: StoreFactory, services_store: ServicesStore) -> None:
    rocketmq = pristine_store("normal-raw")
    assert run_cli(rocketmq, "--json").stdout == run_cli(rocketmq / "commitlog", "--json").stdout
    records = [json.loads(line) for line in run_cli(services_store.root, "--json").stdout.splitlines()]
    assert sum(row["type"] == "msg" for row in records) == services_store.messages
    assert sum(row["type"] == "blank" for row in records) > 10  # 64 KiB files, rolled behind BLANK fillers
    # ConsumeQueues: RocketMQ's under the root, mqstore's under indexer/ (inspect takes the root of either)
    ours = run_mqstore("inspect", "consumequeue", services_store.root, "--json")
    assert ours.returncode == 0, ours.stderr.decode()
    units = [json.loads(line) for line in ours.stdout.splitlines()]
    assert sorted(u["phy_offset"] for u in units) == sorted(r["commitLogOffset"] for r in records if r["type"] == "msg")
    theirs = run_mqstore("inspect", "consumequeue", rocketmq, "--json")
    assert theirs.stdout == run_mqstore("inspect", "consumequeue", rocketmq / "consumequeue", "--json").stdout != b""


def test_consumequeue_file_size_from_the_settings(services_store: ServicesStore) -> None:
    agreed = run_mqstore("inspect", "consumequeue", services_store.root, "--config", services_store.config)
    assert agreed.returncode == 0 and agreed.stdout.decode().splitlines()[-1] == \
        f"# {services_store.messages} units in 16 queues"
    wrong = run_mqstore("inspect", "consumequeue", services_store.root, "--config", services_store.config,
                        "--cq-file-size", "6000")  # the flag wins, and the files say otherwise
    err = wrong.stderr.decode()
    assert wrong.returncode == 2 and "differs from mappedFileSizeConsumeQueue 6000" in err and err.count("\n") == 1


def test_index_geometry_from_the_settings(services_store: ServicesStore, tmp_path: Path) -> None:
    """997 slots and 5000 entries make 104028-byte files, which no size-based guess can read: the
    settings (file or environment) or the flags say it; without them, one line says what to give."""
    index_dir = services_store.root / "indexer" / "index"
    first = sorted(index_dir.iterdir())[0]
    guessed = run_mqstore("inspect", "index", first)
    err = guessed.stderr.decode()
    assert guessed.returncode == 2 and guessed.stdout == b"" and err.count("\n") == 1
    assert "104028-byte index file" in err and "--hash-slot-num" in err and "maxHashSlotNum" in err
    expected = run_mqstore("inspect", "index", first, "--config", services_store.config, "--json")
    assert expected.returncode == 0, expected.stderr.decode()
    rows = [json.loads(line) for line in expected.stdout.splitlines()]
    assert rows[0]["index_count"] == 5000 and len(rows) == 5000  # full: header + 4999 entries
    env = {"MQSTORE_MAX_HASH_SLOT_NUM": "997", "MQSTORE_MAX_INDEX_NUM": "5000"}
    assert run_with_env(env, "inspect", "index", first, "--json").stdout == expected.stdout
    assert run_mqstore("inspect", "index", first, "--hash-slot-num", "997", "--json").stdout == expected.stdout
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text("maxHashSlotNum: 1000\nmaxIndexNum: 4000\n")
    flags_win = run_mqstore("inspect", "index", first, "--config", wrong, "--hash-slot-num", "997",
                            "--index-num", "5000", "--json")
    assert flags_win.stdout == expected.stdout
    mismatch = run_mqstore("inspect", "index", first, "--config", wrong)
    assert mismatch.returncode == 2 and b"maxHashSlotNum of the settings" in mismatch.stderr
