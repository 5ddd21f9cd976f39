"""The record codec and the commitlog walk against stores written by real RocketMQ 4.9.8.

Every row is compared whole (all fields, msgId and dispatch included) with the reference dumps, using
the same row builder the CLI prints with, so a mismatch anywhere in the codec shows up here.
"""

from __future__ import annotations

import mmap
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from services.store.formats.commitlog_walk import (
    BlankEntry,
    RecordEntry,
    commitlog_file_name,
    iter_commitlog,
    list_commitlog_files,
)
from services.store.formats.message import properties_to_string
from services.store.formats.record import (
    RecordError,
    check_record,
    decode_record,
    encode_record,
    record_length,
)
from services.store.formats.socket_address import encode_address
from services.store.tools.inspect_commitlog import entry_row, json_line
from tests.conftest import DumpRows, StoreFactory

MIB = 1024 * 1024
TORN_OFFSET = 2033918  # the hand-torn record: first 64 bytes kept, the rest zeroed

# (store tarball, dump of that run, maxPhyOffset after recovery = where the data ends)
WALKS = [
    ("normal-raw", "normal", 3008717),
    ("crash-recovered", "crash", 2034195),
    ("crash-raw", "crash", 2034195),
    ("torn-raw", "torn", TORN_OFFSET),
    ("torn-recovered", "torn", TORN_OFFSET),
]


def _entries(store: Path) -> list[RecordEntry | BlankEntry]:
    return list(iter_commitlog(store / "commitlog"))


@pytest.mark.parametrize(("store", "run", "end"), WALKS)
def test_walk_gives_exactly_the_dump_rows(pristine_store: StoreFactory, dump_rows: DumpRows,
                                          store: str, run: str, end: int) -> None:
    walk = iter_commitlog(pristine_store(store) / "commitlog")
    rows = [entry_row(e) for e in walk]
    expected = dump_rows(run, "msg", "blank")
    assert [r["commitLogOffset"] for r in rows] == [r["commitLogOffset"] for r in expected]
    for got, want in zip(rows, expected, strict=True):
        assert got == want, f"row at commitlog offset {want['commitLogOffset']}"
    assert walk.end is not None and walk.end.offset == end
    meta = dump_rows(run, "meta")[0]
    assert meta["maxPhyOffset"] == end
    (count,) = (r["messages"] for r in dump_rows(run, "end"))
    assert sum(r["type"] == "msg" for r in rows) == count


def test_json_lines_are_byte_identical_to_the_dump(pristine_store: StoreFactory,
                                                   dump_lines: Callable[[str], tuple[str, ...]]) -> None:
    lines = [json_line(e) for e in _entries(pristine_store("normal-raw"))]
    entry_types = ('{"type":"msg"', '{"type":"blank"')
    expected = [line for line in dump_lines("normal") if line.startswith(entry_types)]
    assert lines == expected


def test_blanks_sit_where_the_dump_has_them(pristine_store: StoreFactory) -> None:
    blanks = [e for e in _entries(pristine_store("normal-raw")) if isinstance(e, BlankEntry)]
    assert [(b.offset, b.size) for b in blanks] == [(1007313, 41263), (2094972, 2180)]
    for blank in blanks:  # a BLANK always fills its file to the end
        assert (blank.offset + blank.size) % MIB == 0


def test_reencoding_every_record_gives_the_stored_bytes(pristine_store: StoreFactory) -> None:
    """encode_record is byte-for-byte what RocketMQ wrote, properties order and separators included."""
    store = pristine_store("normal-raw")
    files = {f.start_offset: f.path for f in list_commitlog_files(store / "commitlog")}
    raw = {start: path.read_bytes() for start, path in files.items()}
    checked = 0
    for entry in _entries(store):
        if not isinstance(entry, RecordEntry):
            continue
        r = entry.record
        props = properties_to_string(r.properties).encode()
        encoded = encode_record(
            topic=r.topic.encode(), queue_id=r.queue_id, body=r.body, flag=r.flag, properties=props,
            sys_flag=r.sys_flag, born_timestamp=r.born_timestamp, born_host=encode_address(r.born_host),
            store_host=encode_address(r.store_host), reconsume_times=r.reconsume_times,
            prepared_transaction_offset=r.prepared_transaction_offset, queue_offset=r.queue_offset,
            commitlog_offset=r.commitlog_offset, store_timestamp=r.store_timestamp,
        )
        start = entry.offset - entry.offset % MIB
        assert encoded == raw[start][entry.offset - start:entry.offset - start + r.store_size]
        assert record_length(r.sys_flag, len(r.body), len(r.topic.encode()), len(props)) == r.store_size
        checked += 1
    assert checked == 3000


@pytest.mark.parametrize(("store", "run"), [("normal-raw", "normal"), ("crash-raw", "crash")])
def test_every_logged_put_is_at_its_offset(pristine_store: StoreFactory, putlog_rows: DumpRows,
                                           store: str, run: str) -> None:
    by_offset = {e.offset: e for e in _entries(pristine_store(store)) if isinstance(e, RecordEntry)}
    puts = putlog_rows(run)
    assert len(puts) == len(by_offset)
    for put in puts:
        entry = by_offset[put["wroteOffset"]]
        assert entry.record.store_size == put["wroteBytes"]
        assert entry.record.queue_offset == put["queueOffset"]
        assert entry.record.store_timestamp == put["storeTimestamp"]
        assert entry.record.uniq_key == put["uniqKey"]
        assert entry_row(entry)["msgId"] == put["msgId"]


@contextmanager
def _mapped_at(store: Path, offset: int) -> Iterator[tuple[memoryview, int]]:
    """The commitlog file holding ``offset``, mapped read-only, and the position of offset in it."""
    start = offset - offset % MIB
    with open(store / "commitlog" / commitlog_file_name(start), "rb") as handle, \
            mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped, memoryview(mapped) as view:
        yield view, offset - start


def test_torn_record_fails_the_check_like_rocketmq(pristine_store: StoreFactory) -> None:
    with _mapped_at(pristine_store("torn-raw"), TORN_OFFSET) as (mapped, position):
        dispatch = check_record(mapped, position)
        # RocketMQ logged: totalSize=277, readTotalCount=91, and reported the total size.
        assert not dispatch.success
        assert dispatch.msg_size == 277
        with pytest.raises(RecordError, match="91 bytes, total size says 277"):
            decode_record(mapped, position)


def test_the_same_record_is_whole_in_the_crash_store(pristine_store: StoreFactory) -> None:
    with _mapped_at(pristine_store("crash-raw"), TORN_OFFSET) as (mapped, position):
        dispatch = check_record(mapped, position)
        assert dispatch.success and dispatch.msg_size == 277
        assert dispatch.topic == "Topic-Long-Name_with.chars" and dispatch.queue_offset == 210


def test_preallocated_zero_file_ends_the_data(pristine_store: StoreFactory) -> None:
    """crash-raw keeps the all-zero third file that recovery deletes; the walk stops at the old end."""
    store = pristine_store("crash-raw")
    files = list_commitlog_files(store / "commitlog")
    assert [f.start_offset for f in files] == [0, MIB, 2 * MIB]
    with _mapped_at(store, 2 * MIB) as (mapped, position):
        assert not check_record(mapped, position).success
    walk = iter_commitlog(store / "commitlog")
    last = list(walk)[-1]
    assert isinstance(last, RecordEntry) and last.offset + last.size == 2034195
    assert walk.end is not None and "all zero" in walk.end.reason


def test_extraction_keeps_nanosecond_mtimes(pristine_store: StoreFactory,
                                            fixture_store: StoreFactory) -> None:
    """Time lookups pick CQ files by mtime, so the fixtures must come out with the recorded mtimes."""
    name = commitlog_file_name(0)
    for store in (pristine_store("normal-raw"), fixture_store("normal-raw")):
        assert (store / "commitlog" / name).stat().st_mtime_ns == 1795299523604189113
