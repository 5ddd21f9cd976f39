"""IndexFile and IndexService against real RocketMQ 4.9.8 index files, dumps and recovery, plus the
chain rules as properties and the fast Java hash against the plain one."""

from __future__ import annotations

import dataclasses
import json
import shutil
import struct
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.store.formats.checkpoint import StoreCheckpoint
from services.store.formats.commitlog_walk import RecordEntry, iter_commitlog
from services.store.formats.index_file import (
    IndexFile,
    IndexFileError,
    IndexHeader,
    index_file_name,
    index_file_size,
    next_index_file_name,
)
from services.store.formats.index_service import IndexService, IndexState, IndexStateMismatch
from services.store.formats.java_hash import (
    MASK32,
    abs_java_int,
    index_key_hash,
    index_key_hash_fast,
    java_hash_u32,
    java_string_hash,
)
from services.store.formats.message import (
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
)
from services.store.formats.record import DispatchRequest
from services.store.tools.inspect_index import infer_geometry
from tests.commitlog.commitlog_process import run_mqstore
from tests.conftest import DumpRows, StoreFactory
from tests.geometry import GeometryPreset

SLOTS, ENTRIES = 100, 400  # the fixtures' maxHashSlotNum / maxIndexNum
LONG_MAX = 2**63 - 1
HEADER_FIELDS = ("beginTimestamp", "endTimestamp", "beginPhyOffset", "endPhyOffset", "hashSlotCount",
                 "indexCount")


# -- helpers ---------------------------------------------------------------------------------------
def dispatches(commitlog: Path, from_offset: int | None = None) -> list[DispatchRequest]:
    return [e.dispatch for e in iter_commitlog(commitlog, from_offset) if isinstance(e, RecordEntry)]


def header_dict(f: IndexFile) -> dict[str, int]:
    return dict(zip(HEADER_FIELDS, (f.begin_timestamp, f.end_timestamp, f.begin_phy_offset,
                                    f.end_phy_offset, f.hash_slot_count, f.index_count), strict=True))


def fixture_files(index_dir: Path) -> list[IndexFile]:
    return [IndexFile(p, SLOTS, ENTRIES, read_only=True) for p in sorted(index_dir.iterdir())]


def loaded_copy(store: Path, tmp_path: Path) -> IndexService:
    """An IndexService over a copy of a fixture store's index directory, loaded after a clean exit."""
    index_dir = tmp_path / "index"
    shutil.copytree(store / "index", index_dir)
    service = IndexService(index_dir, SLOTS, ENTRIES)
    service.load(last_exit_ok=True)
    return service


def rebuilt(commitlog: Path, index_dir: Path) -> IndexService:
    service = IndexService(index_dir, SLOTS, ENTRIES)
    service.load(last_exit_ok=True)
    service.build_index_batch(dispatches(commitlog))
    return service


def assert_queries(service: IndexService, rows: list[dict[str, Any]]) -> None:
    """Every dump ``query`` row: IndexService.queryOffset(topic, key, 64, 0, Long.MAX) in raw order."""
    assert rows
    for row in rows:
        result = service.query_offset(row["topic"], row["key"], 64, 0, LONG_MAX)
        assert result.phy_offsets == row["indexPhyOffsets"], row
        if row["indexPhyOffsets"]:
            assert (result.index_last_update_timestamp, result.index_last_update_phy_offset) == \
                (row["indexLastUpdateTimestamp"], row["indexLastUpdatePhyoffset"]), row
        else:  # queryMessage copies them only when an offset matched; queryOffset always has them
            assert row["indexLastUpdateTimestamp"] == row["indexLastUpdatePhyoffset"] == 0


def assert_same_files(ours: list[IndexFile], theirs: list[IndexFile]) -> None:
    """Same headers and byte-identical slot tables and entries, file by file (names aside)."""
    assert len(ours) == len(theirs)
    for mine, ref in zip(ours, theirs, strict=True):
        assert mine.header == ref.stored_header(), ref.name
        assert mine.body() == ref.body(), ref.name


def request(offset: int, ts: int, keys: str | None = None, uniq: str | None = None, topic: str = "T",
            sys_flag: int = 0) -> DispatchRequest:
    return DispatchRequest(success=True, msg_size=100, topic=topic, commitlog_offset=offset,
                           store_timestamp=ts, keys=keys, uniq_key=uniq, sys_flag=sys_flag)


@pytest.fixture
def close_after() -> Iterator[Callable[[IndexService], IndexService]]:
    opened: list[IndexService] = []

    def register(service: IndexService) -> IndexService:
        opened.append(service)
        return service

    yield register
    for service in opened:
        service.close()


# -- golden: the normal run ------------------------------------------------------------------------
def test_rebuilt_index_equals_rocketmq_files(pristine_store: StoreFactory, dump_rows: DumpRows,
                                             tmp_path: Path, close_after: Callable[..., IndexService]) -> None:
    """All 3000 messages into a fresh service: 16 files whose headers and bytes after the header are
    RocketMQ's (timeDiff too: it derives from the records' store timestamps)."""
    store = pristine_store("normal-raw")
    service = close_after(rebuilt(store / "commitlog", tmp_path / "index"))
    ours, theirs = service.files, fixture_files(store / "index")
    assert_same_files(ours, theirs)
    rows = dump_rows("normal", "indexfile")
    assert [header_dict(f) for f in ours] == [{k: r[k] for k in HEADER_FIELDS} for r in rows]
    assert [f.index_count for f in ours[:-1]] == [ENTRIES] * 15  # full at 400: 399 entries each
    names = [f.name for f in ours]
    assert names == sorted(set(names)) and all(len(n) == 17 and n.isdigit() for n in names)


@pytest.mark.parametrize("source", ["fixture-files", "rebuilt"])
def test_normal_dump_queries(source: str, pristine_store: StoreFactory, dump_rows: DumpRows,
                             tmp_path: Path, close_after: Callable[..., IndexService]) -> None:
    store = pristine_store("normal-raw")
    service = loaded_copy(store, tmp_path) if source == "fixture-files" \
        else rebuilt(store / "commitlog", tmp_path / "index")
    close_after(service)
    rows = dump_rows("normal", "query")
    assert {r["keyKind"] for r in rows} == {"KEYS", "UNIQ_KEY", "MISSING"}
    assert any(r["topic"] == "SCHEDULE_TOPIC_XXXX" and r["indexPhyOffsets"] for r in rows)
    assert sum(len(r["indexPhyOffsets"]) == 64 for r in rows) == 13  # the maxMsgsNumBatch cap
    assert_queries(service, rows)


@pytest.mark.parametrize("run", ["crash", "torn"])
def test_recovered_dump_queries_on_recovered_files(run: str, pristine_store: StoreFactory, dump_rows: DumpRows,
                                                   tmp_path: Path, close_after: Callable[..., IndexService]) -> None:
    service = close_after(loaded_copy(pristine_store(f"{run}-recovered"), tmp_path))
    rows = dump_rows(run, "query")
    assert_queries(service, rows)
    lost = [r for r in rows if r["keyKind"] == "UNIQ_KEY_LOST"]
    assert len(lost) == (1 if run == "torn" else 0)


# -- abnormal recovery -----------------------------------------------------------------------------
@pytest.mark.parametrize(("run", "from_start"), [("crash", False), ("crash", True), ("torn", False)])
def test_abnormal_load_drops_newer_files_and_redispatch_rebuilds_them(
        run: str, from_start: bool, fixture_store: StoreFactory, pristine_store: StoreFactory,
        dump_rows: DumpRows, close_after: Callable[..., IndexService]) -> None:
    """kill -9 left 11 files; indexMsgTimestamp (the end of the last *full* file, flushed on roll) keeps
    10. Re-dispatch from the 10th file's endPhyOffset (or from the log start: the ``<`` skip rule makes
    it the same) rebuilds the 11th byte for byte as RocketMQ's recovery did, the message at
    endPhyOffset 1954001 indexed twice included, and the recovered dump's queries all hit."""
    store = fixture_store(f"{run}-raw")
    raw_names = sorted(p.name for p in (store / "index").iterdir())
    checkpoint = StoreCheckpoint(store / "checkpoint")
    service = close_after(IndexService(store / "index", SLOTS, ENTRIES, checkpoint))
    try:
        assert service.load(last_exit_ok=False) == raw_names[-1:]
        assert [f.end_timestamp <= checkpoint.index_msg_timestamp for f in service.files] == [True] * 10
        assert service.end_phy_offset == 1954001
        service.build_index_batch(dispatches(store / "commitlog", None if from_start else service.end_phy_offset))
    finally:
        checkpoint.close()
    recovered = pristine_store(f"{run}-recovered") / "index"
    assert_same_files(service.files, fixture_files(recovered))
    names = [f.name for f in service.files]
    assert names[:10] == raw_names[:10] and names[10] not in raw_names  # rebuilt under a new name
    rows = dump_rows(run, "indexfile")
    assert [header_dict(f) for f in service.files] == [{k: r[k] for k in HEADER_FIELDS} for r in rows]
    assert_queries(service, dump_rows(run, "query"))
    assert service.query_offset("TopicA", "7F00000110921B6D35860001F99207C6", 64, 0, LONG_MAX).phy_offsets \
        == [1954001, 1954001]


def test_clean_load_keeps_every_file(fixture_store: StoreFactory, close_after: Callable[..., IndexService]) -> None:
    store = fixture_store("crash-raw")
    service = close_after(IndexService(store / "index", SLOTS, ENTRIES, checkpoint=None))
    assert service.load(last_exit_ok=True) == []
    assert len(service.files) == 11


def test_abnormal_load_without_checkpoint_drops_everything(tmp_path: Path) -> None:
    service = IndexService(tmp_path / "index", SLOTS, ENTRIES)
    service.build_index_batch([request(0, 1_000, "a b")])
    service.close()
    again = IndexService(tmp_path / "index", SLOTS, ENTRIES)
    assert len(again.load(last_exit_ok=False)) == 1 and again.files == []


# -- truncate and expiry ---------------------------------------------------------------------------
def test_truncate_drops_files_past_the_new_end_and_redispatch_restores_queries(
        pristine_store: StoreFactory, dump_rows: DumpRows, tmp_path: Path,
        close_after: Callable[..., IndexService]) -> None:
    store = pristine_store("normal-raw")
    service = close_after(rebuilt(store / "commitlog", tmp_path / "index"))
    resume = service.truncate(1_500_000)
    assert resume == 1481992 and len(service.files) == 8  # the 9th file ends at 1615405
    assert all(f.end_phy_offset < 1_500_000 for f in service.files)
    service.build_index_batch(dispatches(store / "commitlog", resume))
    for row in dump_rows("normal", "query"):
        got = service.query_offset(row["topic"], row["key"], 64, 0, LONG_MAX).phy_offsets
        expected = row["indexPhyOffsets"]
        if got.count(resume) == 2:  # the message at the resume point is indexed again, as after a recovery
            first = got.index(resume)
            assert got[first + 1] == resume
            del got[first]
            assert len(got) in (len(expected), 63)  # 63 when the duplicate took a place of the 64
        assert got == expected[:len(got)], row


def test_truncate_to_zero_empties_the_index(tmp_path: Path) -> None:
    service = IndexService(tmp_path / "index", 3, 4)
    service.build_index_batch([request(o * 100, 1_000 + o, f"k{o}") for o in range(10)])
    assert len(service.files) == 4
    assert service.truncate(0) == 0 and service.files == [] and list((tmp_path / "index").iterdir()) == []


def test_truncate_lowers_the_checkpoint(tmp_path: Path) -> None:
    checkpoint = StoreCheckpoint(tmp_path / "checkpoint")
    try:
        service = IndexService(tmp_path / "index", 3, 4, checkpoint)
        service.build_index_batch([request(o * 100, 1_000 * (o + 1), "k") for o in range(7)])
        assert checkpoint.index_msg_timestamp == 6_000  # the second full file's end
        assert service.truncate(350) == 200  # drops files 2 and 3 (offsets 300.. and 600)
        assert checkpoint.index_msg_timestamp == 3_000
        service.close()
        reloaded = IndexService(tmp_path / "index", 3, 4, checkpoint)
        assert reloaded.load(last_exit_ok=False) == [] and len(reloaded.files) == 1
        reloaded.close()
    finally:
        checkpoint.close()


def test_delete_expired_keeps_the_last_file(pristine_store: StoreFactory, tmp_path: Path) -> None:
    service = rebuilt(pristine_store("normal-raw") / "commitlog", tmp_path / "index")
    first_names = [f.name for f in service.files[:3]]
    assert service.delete_expired(605082) == first_names  # files ending below the new min offset
    assert service.files[0].begin_phy_offset == 605081
    assert len(service.delete_expired(LONG_MAX)) == 12 and len(service.files) == 1
    service.close()


# -- building rules --------------------------------------------------------------------------------
def test_uniq_key_first_then_each_nonempty_key(store_geometry: GeometryPreset, tmp_path: Path) -> None:
    with_index = IndexService(tmp_path / "index", store_geometry.hash_slot_num, store_geometry.index_num)
    with_index.build_index_batch([request(0, 5_000, keys="  a  b ", uniq="U"), request(100, 5_000, uniq="")])
    f = with_index.files[0]
    hashes = [e.key_hash for e in f.entries()]
    assert hashes == [index_key_hash(k) for k in ("T#U", "T#a", "T#b", "T#")]  # "" UNIQ_KEY counts
    assert with_index.query_offset("T", "", 64, 0, LONG_MAX).phy_offsets == [100]
    with_index.close()


def test_transaction_types(store_geometry: GeometryPreset, tmp_path: Path) -> None:
    service = IndexService(tmp_path / "index", store_geometry.hash_slot_num, store_geometry.index_num)
    service.build_index_batch([
        request(0, 1, "prepared", sys_flag=TRANSACTION_PREPARED_TYPE),
        request(100, 1, "commit", sys_flag=TRANSACTION_COMMIT_TYPE),
        request(200, 1, "rollback", sys_flag=TRANSACTION_ROLLBACK_TYPE),
    ])
    found = {k: service.query_offset("T", k, 64, 0, LONG_MAX).phy_offsets for k in ("prepared", "commit", "rollback")}
    assert found == {"prepared": [0], "commit": [100], "rollback": []}
    assert service.end_phy_offset == 100
    service.close()


def test_redispatch_skips_below_end_phy_offset_but_not_at_it(store_geometry: GeometryPreset, tmp_path: Path) -> None:
    service = IndexService(tmp_path / "index", store_geometry.hash_slot_num, store_geometry.index_num)
    batch = [request(o, 1_000, f"k{o}") for o in (0, 100, 200)]
    service.build_index_batch(batch)
    service.build_index_batch(batch)  # RocketMQ's test is commitLogOffset < endPhyOffset
    assert [e.phy_offset for e in service.files[0].entries()] == [0, 100, 200, 200]
    service.close()


def test_roll_flushes_the_full_file_and_checkpoints_its_end(tmp_path: Path) -> None:
    checkpoint = StoreCheckpoint(tmp_path / "checkpoint")
    try:
        service = IndexService(tmp_path / "index", 3, 4, checkpoint)
        service.build_index_batch([request(0, 10_000, "a b c")])  # 3 entries: full at indexCount 4
        assert checkpoint.index_msg_timestamp == 0 and len(service.files) == 1
        service.build_index_batch([request(100, 17_500, "d")])
        assert checkpoint.index_msg_timestamp == 10_000
        assert StoreCheckpoint(tmp_path / "checkpoint").index_msg_timestamp == 10_000  # on disk
        first, second = service.files
        assert first.is_write_full and not second.is_write_full
        # The new file started from the full one's end: its first entry's timeDiff counts from there,
        # and only then does beginTimestamp become that message's store time.
        assert (second.begin_timestamp, second.begin_phy_offset) == (17_500, 100)
        assert [e.time_diff for e in second.entries()] == [7]
        service.close()
    finally:
        checkpoint.close()


def test_a_full_last_file_rolls_at_the_next_batch(tmp_path: Path) -> None:
    service = IndexService(tmp_path / "index", 3, 4)
    service.build_index_batch([request(0, 10_000, "a b c")])
    service.build_index_batch([request(100, 10_000)])  # no key: RocketMQ still gets a writable file first
    assert len(service.files) == 2
    assert service.files[1].header == IndexHeader(10_000, 10_000, 0, 0, 0, 1)  # the full file's end values
    service.close()


def test_file_names_are_unique_and_increasing(tmp_path: Path) -> None:
    frozen = 1_795_299_522.778  # every file created "in the same millisecond"
    service = IndexService(tmp_path / "index", 3, 4, clock=lambda: frozen)
    service.build_index_batch([request(o * 100, 1_000, "a b c") for o in range(4)])
    names = [f.name for f in service.files]
    assert len(names) == 4 and names == sorted(set(names))
    assert names[0] == index_file_name(1_795_299_522_778)
    assert names[1] == next_index_file_name(names[0])
    backwards = IndexService(tmp_path / "index", 3, 4, clock=lambda: frozen - 3600)
    backwards.load(last_exit_ok=True)
    backwards.build_index_batch([request(1_000, 2_000, "x y z w")])
    later = [f.name for f in backwards.files]
    assert later[:4] == names and later[4] > names[-1]
    service.close()
    backwards.close()


def test_next_name_crosses_a_second_and_a_year() -> None:
    assert next_index_file_name("20261231235959999") == "20270101000000000"
    assert next_index_file_name("20261121221842786") == "20261121221842787"


def test_default_geometry_file_is_sparse(tmp_path: Path) -> None:
    f = IndexFile(tmp_path / "20260101000000000", create=True)
    try:
        assert f.path.stat().st_size == index_file_size(5_000_000, 20_000_000) == 420_000_040
        assert f.path.stat().st_blocks * 512 < 1 << 20
        assert f.put_key("T#k", 0, 1_000) and f.select_phy_offsets("T#k", 64, 0, LONG_MAX) == [0]
    finally:
        f.destroy()
    assert not f.path.exists()


def test_wrong_geometry_is_refused(pristine_store: StoreFactory) -> None:
    path = next((pristine_store("normal-raw") / "index").iterdir())
    with pytest.raises(IndexFileError, match="8440"):
        IndexFile(path, 200, 400, read_only=True)


def test_int_min_hash_is_indexed_as_zero(tmp_path: Path) -> None:
    """abs(Integer.MIN_VALUE) is negative in Java; RocketMQ maps it to 0 (slot 0)."""
    prefix = java_hash_u32("T#")
    target = (0x8000_0000 - prefix * 31**7) % 2**32
    digits = []
    for _ in range(7):
        target, d = divmod(target, 31)
        digits.append(d)
    key = "".join(chr(d) for d in reversed(digits))
    assert java_string_hash("T#" + key) == -(2**31)
    service = IndexService(tmp_path / "index", 3, 8)
    service.build_index_batch([request(0, 1_000, keys=key)])
    assert [e.key_hash for e in service.files[0].entries()] == [0]
    assert service.query_offset("T", key, 64, 0, LONG_MAX).phy_offsets == [0]
    service.close()


# -- queries across files --------------------------------------------------------------------------
def test_query_time_range_across_files(tmp_path: Path) -> None:
    """Files are searched newest first only when their [begin, end] span meets the range, and the walk
    stops after a file that began before ``begin``; within a file the chain stops at older entries.
    RocketMQ quirk kept: a rolled file's first entry counts its timeDiff from the previous file's
    endTimestamp, but reads add it to the new beginTimestamp, so that entry looks 10 s younger here."""
    service = IndexService(tmp_path / "index", 3, 4)
    base = 100_000
    # three messages a file, store times 10 s apart
    service.build_index_batch([request(i * 100, base + i * 10_000, "k") for i in range(9)])
    assert [(f.begin_timestamp - base, f.end_timestamp - base) for f in service.files] == \
        [(0, 20_000), (30_000, 50_000), (60_000, 80_000)]
    assert [e.time_diff for f in service.files for e in f.entries()] == [0, 10, 20, 10, 10, 20, 10, 10, 20]

    def query(begin: int, end: int, max_num: int = 64) -> list[int]:
        return service.query_offset("T", "k", max_num, base + begin, base + end).phy_offsets

    assert query(-base, LONG_MAX - base) == [800, 700, 600, 500, 400, 300, 200, 100, 0]
    assert query(35_000, 65_000) == [500, 400, 300]  # 300 (stored at +30 s) reads as +40 s; 600 as +70 s
    assert query(40_000, 40_000) == [400, 300]
    assert query(45_000, 45_000) == []  # inside a file's span, between two entries
    assert query(30_000, 30_000) == []  # the message stored then reads as +40 s
    assert query(-base, LONG_MAX - base, max_num=2) == [800, 700]
    assert query(-base, LONG_MAX - base, max_num=1000) == query(-base, LONG_MAX - base)  # maxMsgsNumBatch
    nothing = service.query_offset("T", "nothing", 64, 0, LONG_MAX)
    assert nothing == ([], base + 80_000, 800)  # the newest file's end values even without a match
    # Pages of one walk: skip passes over the first hits, across files; each page is at most maxMsgsNumBatch.
    pages = [service.query_offset("T", "k", 2, 0, LONG_MAX, skip=skip).phy_offsets for skip in range(0, 10, 2)]
    assert pages == [[800, 700], [600, 500], [400, 300], [200, 100], [0]]
    assert service.query_offset("T", "k", 64, base + 35_000, base + 65_000, skip=1).phy_offsets == [400, 300]
    assert service.query_offset("T", "k", 64, 0, LONG_MAX, skip=9).phy_offsets == []
    service.close()


def test_a_damaged_chain_ends_the_walk(tmp_path: Path) -> None:
    f = IndexFile(tmp_path / "20260101000000000", 1, 3, create=True)
    assert f.put_key("T#a", 10, 1_000) and f.put_key("T#a", 20, 1_000) and not f.put_key("T#a", 30, 1_000)
    assert f.select_phy_offsets("T#a", 64, 0, LONG_MAX) == [20, 10]
    f._mm[40:44] = (3).to_bytes(4, "big")  # the slot names entry 3 == indexCount: past the last entry
    assert f.select_phy_offsets("T#a", 64, 0, LONG_MAX) == []
    f.close()


# -- properties ------------------------------------------------------------------------------------
KEY_TEXT = st.one_of(
    st.text(max_size=12),  # any str: non-BMP characters and lone surrogates included
    st.text(alphabet="AaBb", max_size=8),  # "Aa" and "BB" have the same Java hash
    st.sampled_from(["Aa", "BB", "AaAa", "BBBB", "AaBB", "BBAa", "🚀key", "订单-1"]),
)


@settings(max_examples=60, deadline=None)
@given(keys=st.lists(st.tuples(KEY_TEXT, st.integers(0, 2_500)), min_size=1, max_size=40),
       query=KEY_TEXT, max_num=st.integers(0, 12), begin=st.integers(0, 60_000), span=st.integers(0, 60_000),
       slots=st.integers(1, 5))
def test_select_returns_exactly_the_matching_entries(tmp_path_factory: pytest.TempPathFactory,
                                                     keys: list[tuple[str, int]], query: str, max_num: int,
                                                     begin: int, span: int, slots: int) -> None:
    """Keys put in commitlog order (store times never decrease): select gives the offsets of the entries
    with the query's key hash whose store time, as the index sees it (beginTimestamp + whole seconds),
    lies in [begin, end]; newest first; at most max_num; the put fails once indexNum - 1 are in."""
    index_num = 24
    f = IndexFile(tmp_path_factory.mktemp("idx") / "20260101000000000", slots, index_num, create=True)
    try:
        model: list[tuple[int, int, int]] = []  # (key hash, offset, indexed time)
        ts = 1_000
        for i, (key, step) in enumerate(keys):
            ts += step
            ok = f.put_key(key, i, ts)
            assert ok == (len(model) < index_num - 1)
            if ok:
                first = model[0][2] if model else ts
                model.append((index_key_hash(key), i, first + (ts - first) // 1000 * 1000))
        end = begin + span + model[0][2] - 1_000
        begin += model[0][2] - 1_000
        h = index_key_hash(query)
        expected = [o for k, o, t in reversed(model) if k == h and begin <= t <= end][:max_num]
        assert f.select_phy_offsets(query, max_num, begin, end) == expected
        assert [e.key_hash for e in f.entries()] == [k for k, _, _ in model]
    finally:
        f.destroy()


@given(st.text())
def test_fast_java_hash_is_exact(text: str) -> None:
    assert java_hash_u32(text) == java_string_hash(text) & MASK32
    assert index_key_hash_fast(text) == index_key_hash(text)


@given(st.text(alphabet=st.characters(max_codepoint=127)), st.text(alphabet=st.characters(max_codepoint=127)))
def test_fast_java_hash_on_ascii(prefix: str, text: str) -> None:
    assert java_hash_u32(prefix + "#" + text) == java_string_hash(prefix + "#" + text) & MASK32


LONG_KEYS = st.text(alphabet="ab", min_size=630, max_size=640)  # around java_hash's fast-path limit


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["TopicA", "Topic-Long-Name_with.chars", "订阅", "T🚀"]),
                          st.one_of(st.none(), st.text(max_size=10), LONG_KEYS), st.one_of(st.none(), KEY_TEXT)),
                min_size=1, max_size=15))
def test_batch_build_hashes_like_index_key_hash(tmp_path_factory: pytest.TempPathFactory,
                                                messages: list[tuple[str, str | None, str | None]]) -> None:
    """The hash inlined in build_index_batch equals index_key_hash(topic#key) on any text."""
    service = IndexService(tmp_path_factory.mktemp("idx") / "index", 7, 200)
    service.build_index_batch([request(i * 10, 1_000, keys, uniq, topic)
                               for i, (topic, keys, uniq) in enumerate(messages)])
    expected = [index_key_hash(f"{topic}#{word}")
                for topic, keys, uniq in messages
                for word in ([uniq] if uniq is not None else []) + [k for k in (keys or "").split(" ") if k]]
    assert [e.key_hash for f in service.files for e in f.entries()] == expected
    service.destroy()


@pytest.mark.parametrize("length", [639, 640, 641, 5000])
def test_fast_java_hash_long_ascii(length: int) -> None:
    text = ("order-#" * length)[:length]
    assert java_hash_u32(text) == java_string_hash(text) & MASK32


def test_abs_java_int() -> None:
    assert [abs_java_int(u) for u in (0, 1, 0x7FFF_FFFF, 0x8000_0000, 0x8000_0001, MASK32)] == \
        [0, 1, 0x7FFF_FFFF, 0, 0x7FFF_FFFF, 1]


# -- inspect CLI -----------------------------------------------------------------------------------
def run_inspect(*args: str | Path) -> subprocess.CompletedProcess[bytes]:
    """``--json`` with the field names of RocketMQ's reference dumps, which the tests compare with."""
    names = ("--json-names", "rocketmq") if "--json" in args else ()
    return run_mqstore("inspect", "index", *args, *names)


def test_inspect_index_json(pristine_store: StoreFactory, dump_rows: DumpRows) -> None:
    index_dir = pristine_store("crash-recovered") / "index"
    path = sorted(index_dir.iterdir())[-1]
    result = run_inspect(path, "--json", "--slots")
    assert result.returncode == 0 and result.stderr == b"", result.stderr
    rows = [json.loads(line) for line in result.stdout.decode().splitlines()]
    dump = [r for r in dump_rows("crash", "indexfile") if r["name"] == path.name]
    assert rows[0] == {**dump[0], "type": "indexheader"}
    assert list(rows[0]) == ["type", *[k for k in dump[0] if k != "type"]]  # the dump's field order
    f = IndexFile(path, SLOTS, ENTRIES, read_only=True)
    entries = [r for r in rows if r["type"] == "indexentry"]
    assert len(entries) == rows[0]["indexCount"] - 1 == 241
    assert entries[0] == {"type": "indexentry", "entry": 1, "keyHash": 2091857729, "phyOffset": 1954001,
                          "timeDiff": 0, "prevIndex": 0}
    assert [(r["entry"], r["keyHash"], r["phyOffset"], r["timeDiff"], r["prevIndex"]) for r in entries] == \
        [(e.number, e.key_hash, e.phy_offset, e.time_diff, e.prev_index) for e in f.entries()]
    slots = [(r["slot"], r["value"]) for r in rows if r["type"] == "indexslot"]
    assert len(slots) == rows[0]["hashSlotCount"] == 88 and slots == list(f.slots())
    f.close()


def test_inspect_index_table_and_errors(pristine_store: StoreFactory, tmp_path: Path) -> None:
    index_dir = pristine_store("normal-raw") / "index"
    table = run_inspect(sorted(index_dir.iterdir())[-1])
    lines = table.stdout.decode().splitlines()
    assert table.returncode == 0 and lines[0].startswith("# name=20261121221844301") and len(lines) == 2 + 30
    not_a_file = run_inspect(index_dir)
    assert not_a_file.returncode == 2 and b"not a file" in not_a_file.stderr
    odd = tmp_path / "odd"
    odd.write_bytes(bytes(1000))
    bad = run_inspect(odd)
    assert bad.returncode == 2 and b"--hash-slot-num" in bad.stderr


def test_infer_geometry() -> None:
    assert infer_geometry(8440) == (100, 400)
    assert infer_geometry(420_000_040) == (5_000_000, 20_000_000)
    assert infer_geometry(index_file_size(10, 7), hash_slot_num=10) == (10, 7)
    assert infer_geometry(index_file_size(10, 7), index_num=7) == (10, 7)
    with pytest.raises(IndexFileError):
        infer_geometry(index_file_size(10, 7), hash_slot_num=11, index_num=7)


# -- rewind: mqstore's crash recovery (RocketMQ drops whole files instead) -------------------------
def build_in_chunks(service: IndexService, requests: list[DispatchRequest], chunk: int = 37) -> None:
    """Dispatch as the indexer does: one build_index_batch per Tail chunk."""
    for start in range(0, len(requests), chunk):
        service.build_index_batch(requests[start:start + chunk])


def decoded(files: list[IndexFile]) -> list[tuple[IndexHeader, list[tuple[int, int]], list[Any]]]:
    return [(f.header, list(f.slots()), list(f.entries())) for f in files]


@pytest.mark.parametrize("records_before_cut", [1, 798, 1234, 2999])
def test_rewind_to_a_saved_state_then_redispatch_rebuilds_rocketmq_files(
        records_before_cut: int, pristine_store: StoreFactory, tmp_path: Path,
        close_after: Callable[..., IndexService]) -> None:
    """The state saved after ``records_before_cut`` records; then every record indexed (several files
    more); the rewind deletes the files created since and rewinds the saved one: the files are those of
    a build that stopped there (headers exact, bytes equal), and re-dispatch from the saved reput
    offset gives RocketMQ's files byte for byte: no entry lost, none doubled."""
    store = pristine_store("normal-raw")
    requests = dispatches(store / "commitlog")
    cut = requests[records_before_cut].commitlog_offset
    service = close_after(IndexService(tmp_path / "index", SLOTS, ENTRIES))
    service.load(last_exit_ok=True)
    build_in_chunks(service, requests[:records_before_cut])
    saved = service.state()
    build_in_chunks(service, requests[records_before_cut:])
    assert len(service.files) == 16
    stopped = close_after(IndexService(tmp_path / "stopped", SLOTS, ENTRIES))
    build_in_chunks(stopped, requests[:records_before_cut])

    result = service.rewind(cut, saved)
    assert decoded(service.files) == decoded(stopped.files)
    assert [f.body() for f in service.files] == [f.body() for f in stopped.files]
    assert result.removed_entries == result.repaired_slots == 0  # the saved file had nothing past the cut
    assert len(result.deleted_files) == 16 - len(stopped.files)
    build_in_chunks(service, dispatches(store / "commitlog", cut))
    assert_same_files(service.files, fixture_files(store / "index"))


def write_header(f: IndexFile, header: IndexHeader) -> None:
    f._mm[:40] = struct.pack(">qqqqii", header.begin_timestamp, header.end_timestamp, header.begin_phy_offset,
                             header.end_phy_offset, header.hash_slot_count, header.index_count)


def test_rewind_removes_what_a_kill_left_past_the_header(tmp_path: Path) -> None:
    """kill -9 during a put: entries and slots are written, the header is not (it is written once per
    put call). The saved state's header is trusted; what follows it goes, slots included."""
    items = [(h % 13, 100 * (i // 2), 1_000 + 700 * i) for i, h in enumerate(range(0, 400, 7))]
    kept = IndexFile(tmp_path / "20260101000000000", 5, 80, create=True)
    assert kept.put_items(items[:30]) == 30
    f = IndexFile(tmp_path / "20260101000000001", 5, 80, create=True)
    f.put_items(items[:30])
    saved = f.header
    f.put_items(items[30:44])
    lagging = f.header
    f.put_items(items[44:])
    write_header(f, lagging)  # the header of the last put never reached the file
    f.close()
    f = IndexFile(tmp_path / "20260101000000001", 5, 80)
    assert f.header == lagging
    result = f.rewind(items[30][1], saved, exact=saved)
    assert (result.removed, result.repaired_slots, result.changed) == (0, 0, True)
    assert f.header == f.stored_header() == kept.header and f.body() == kept.body()
    f.close()
    kept.close()


def test_rewind_recomputes_slots_whose_chains_cross_lost_pages(tmp_path: Path) -> None:
    """A power loss keeps any subset of the dirty pages: here the slot table's page reached the disk
    and the entries after the saved state did not. Those slots cannot be walked back through the lost
    entries; they are recomputed from the kept ones."""
    items = [(i * 3 % 11, 50 * i, 5_000 + 10 * i) for i in range(60)]
    kept = IndexFile(tmp_path / "20260101000000000", 7, 100, create=True)
    kept.put_items(items[:25])
    f = IndexFile(tmp_path / "20260101000000001", 7, 100, create=True)
    f.put_items(items[:25])
    saved = f.header
    f.put_items(items[25:])
    start = 40 + 7 * 4 + 26 * 20  # entry 26, the first one after the saved state
    f._mm[start:start + 35 * 20] = bytes(35 * 20)  # the entries' pages were lost
    result = f.rewind(items[25][1], saved, exact=saved)
    assert result.repaired_slots == 7 and result.removed == 0
    assert f.header == kept.header and f.body() == kept.body()
    f.close()
    kept.close()


@settings(max_examples=80, deadline=None)
@given(hashes=st.lists(st.integers(0, 40), min_size=1, max_size=30), slots=st.integers(1, 6),
       saved_at=st.integers(0, 30), cut_at=st.integers(0, 30), written=st.integers(0, 30),
       steps=st.lists(st.integers(0, 2_500), min_size=30, max_size=30))
def test_rewind_equals_a_build_without_the_removed_entries(
        tmp_path_factory: pytest.TempPathFactory, hashes: list[int], slots: int, saved_at: int, cut_at: int,
        written: int, steps: list[int]) -> None:
    """Any keys (colliding hashes, shared slots), two keys for some messages, a state saved after
    ``saved_at`` items, ``written`` more items after it of which the header saw only some: rewinding to
    a record boundary at or before the saved state leaves the bytes of a build of the kept items, and
    the header too, endTimestamp exact at the saved state and else to the second."""
    index_num = 24
    items: list[tuple[int, int, int]] = []  # (key hash, commitlog offset, store time): two keys a message
    ts = 1_000_000
    for i, key_hash in enumerate(hashes[:index_num - 1]):
        if i % 2 == 0:
            ts += steps[i]
        items.append((key_hash, 100 * (i - i % 2), ts))
    saved_at = min(saved_at, len(items))
    cut_at = min(cut_at, saved_at)
    cut_at -= cut_at % 2  # a record boundary: never between the two keys of one message
    cut = items[cut_at][1] if cut_at < len(items) else items[-1][1] + 100
    directory = tmp_path_factory.mktemp("rewind")
    kept = IndexFile(directory / "20260101000000000", slots, index_num, create=True)
    kept.put_items(items[:cut_at])
    f = IndexFile(directory / "20260101000000001", slots, index_num, create=True)
    f.put_items(items[:saved_at])
    saved = f.header
    end = min(len(items), saved_at + written)
    f.put_items(items[saved_at:(saved_at + end) // 2])
    lagging = f.header
    f.put_items(items[(saved_at + end) // 2:end])
    write_header(f, lagging)
    try:
        f.rewind(cut, saved, exact=saved)
        assert f.body() == kept.body()
        if cut_at == 0:
            assert f.index_count == 1
            return
        got, want = f.header, kept.header
        assert 0 <= want.end_timestamp - got.end_timestamp < 1000
        assert got.end_timestamp == want.end_timestamp or cut_at < saved_at
        assert (got.begin_timestamp, got.begin_phy_offset, got.end_phy_offset, got.hash_slot_count,
                got.index_count) == (want.begin_timestamp, want.begin_phy_offset, want.end_phy_offset,
                                     want.hash_slot_count, want.index_count)
    finally:
        f.close()
        kept.close()


def test_rewind_refuses_a_state_the_files_do_not_hold(tmp_path: Path) -> None:
    service = IndexService(tmp_path / "index", 3, 40)
    service.build_index_batch([request(o * 100, 1_000 + o, f"k{o}") for o in range(10)])
    saved = service.state()
    assert saved.header is not None
    other = IndexState(saved.file_name, IndexHeader(saved.header.begin_timestamp, saved.header.end_timestamp,
                                                    777, saved.header.end_phy_offset, 3, 5))
    before = service.files[0].body()
    with pytest.raises(IndexStateMismatch, match="from commitlog offset 0, but the saved state has 4 from 777"):
        service.rewind(500, other)
    assert service.files[0].body() == before and service.files[0].index_count == 11
    too_many = IndexState(saved.file_name, dataclasses.replace(saved.header, index_count=30))
    with pytest.raises(IndexStateMismatch):
        service.rewind(500, too_many)
    service.close()


def test_rewind_after_rocketmq_recovery_indexes_the_resume_record_once(
        fixture_store: StoreFactory, pristine_store: StoreFactory, tmp_path: Path,
        close_after: Callable[..., IndexService]) -> None:
    """The crash fixture after RocketMQ's load (newer files dropped): rewinding to the last file's
    endPhyOffset before re-dispatching from it takes that message's keys out first, so it is indexed
    once (RocketMQ's recovered files hold it twice) and the files equal a fresh build."""
    store = fixture_store("crash-raw")
    checkpoint = StoreCheckpoint(store / "checkpoint")
    try:
        service = close_after(IndexService(store / "index", SLOTS, ENTRIES, checkpoint))
        service.load(last_exit_ok=False)
        resume = service.end_phy_offset
        assert resume == 1954001
        result = service.rewind(resume)
        # its first key was the full 10th file's last entry (the others went to the dropped 11th)
        assert result.removed_entries == 1 and result.deleted_files == [] and not service.files[-1].is_write_full
        service.build_index_batch(dispatches(store / "commitlog", resume))
    finally:
        checkpoint.close()
    assert service.query_offset("TopicA", "7F00000110921B6D35860001F99207C6", 64, 0, LONG_MAX).phy_offsets == \
        [1954001]
    fresh = close_after(rebuilt(store / "commitlog", tmp_path / "fresh"))
    assert decoded(service.files) == decoded(fresh.files)
    assert [f.body() for f in service.files] == [f.body() for f in fresh.files]


@pytest.mark.parametrize("last_exit_ok", [True, False])
def test_load_deletes_a_file_whose_creation_was_interrupted(tmp_path: Path, last_exit_ok: bool) -> None:
    """kill -9 between creating a new index file and sizing it leaves 0 bytes: it never held an entry,
    and opening it as an index file would fail the restart."""
    service = IndexService(tmp_path / "index", 3, 8)
    service.build_index_batch([request(o * 100, 1_000 + o, f"k{o}") for o in range(5)])
    service.close()
    interrupted = tmp_path / "index" / "29991231235959999"
    interrupted.touch()
    again = IndexService(tmp_path / "index", 3, 8)
    assert interrupted.name in again.load(last_exit_ok)
    assert not interrupted.exists() and len(again.files) == (1 if last_exit_ok else 0)
    again.close()
