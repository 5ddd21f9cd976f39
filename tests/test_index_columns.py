"""The columnar index build (DispatchColumns -> collect_columns -> put_columns) writes the same bytes as
the record-by-record one, on any keys, topics, skips, hash collisions and file rolls; and the
vectorised Java hash equals String.hashCode."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.store.formats.dispatch_columns import DispatchColumns
from services.store.formats.index_file import IndexColumns, IndexFile
from services.store.formats.index_service import IndexService
from services.store.formats.java_hash import (
    MASK32,
    abs_java_ints,
    combine_u32,
    index_key_hash,
    java_string_hash,
    segment_hashes_u32,
    utf16_units,
)
from services.store.formats.message import TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE
from services.store.formats.record import DispatchRequest

WORDS = st.one_of(
    st.text(max_size=12),  # any str: non-BMP characters and lone surrogates included
    st.text(alphabet="AaBb ", max_size=10),  # "Aa" and "BB" collide; runs of separators
    st.sampled_from(["Aa", "BB", "AaAa", "BBBB", " a  b ", "🚀key", "订单-1", "", " "]),
)
ASCII_WORDS = st.text(alphabet="abcAB01- ", max_size=24)
MESSAGES = st.lists(st.tuples(
    st.sampled_from(["T", "TopicA", "订阅", "T🚀"]),
    st.one_of(st.none(), WORDS),  # KEYS
    st.one_of(st.none(), WORDS),  # UNIQ_KEY
    st.sampled_from([0, 0, 0, TRANSACTION_ROLLBACK_TYPE, TRANSACTION_PREPARED_TYPE]),
    st.integers(0, 3),  # commitlog offset step (0: the same offset again)
    st.integers(-2_000, 5_000),  # store time step, ms (backwards too)
), min_size=1, max_size=60)


def requests_of(messages: list[tuple[str, str | None, str | None, int, int, int]]) -> list[DispatchRequest]:
    out, offset, ts = [], 0, 1_700_000_000_000
    for topic, keys, uniq, sys_flag, step, dt in messages:
        offset, ts = offset + step * 100, ts + dt
        out.append(DispatchRequest(True, 100, topic, 0, offset, 0, 0, ts, keys, uniq, sys_flag))
    return out


def build(index_dir: Path, batches: list[list[DispatchRequest]], columnar: bool) -> list[tuple[str, bytes]]:
    """(name, bytes) of every index file after building ``batches`` one path or the other."""
    clock = iter(range(1_800_000_000, 1_900_000_000)).__next__
    service = IndexService(index_dir, 7, 23, clock=lambda: float(clock()),
                           columnar_min_records=0 if columnar else 1 << 30)
    for batch in batches:
        service.build_index_batch(batch)
    files = [(f.name, f._mm[:]) for f in service.files]
    service.close()
    return files


@settings(max_examples=150, deadline=None)
@given(MESSAGES, st.integers(1, 60), st.booleans())
def test_columnar_build_writes_the_same_files(tmp_path_factory: pytest.TempPathFactory,
                                              messages: list[tuple[str, str | None, str | None, int, int, int]],
                                              chunk: int, backwards: bool) -> None:
    requests = requests_of(messages)
    if backwards and len(requests) > 2:  # offsets going down take the per-record rule, also columnar
        requests[1], requests[2] = requests[2], requests[1]
    batches = [requests[i:i + chunk] for i in range(0, len(requests), chunk)]
    batches.append(requests[: len(requests) // 2])  # a re-dispatch: all below endPhyOffset but one
    root = tmp_path_factory.mktemp("idx")
    assert build(root / "columns", batches, columnar=True) == build(root / "records", batches, columnar=False)


def test_columnar_build_of_an_ascii_chunk_matches_index_key_hash(tmp_path: Path) -> None:
    """A chunk the numpy path takes whole (ascending offsets, BMP text, two topics)."""
    requests = [DispatchRequest(True, 100, f"Topic{i % 2}", 0, i * 100, 0, 0, 1_000 + i, f"order-{i}  user-{i % 7} ",
                                f"UNIQ{i:08X}" if i % 5 else None) for i in range(200)]
    service = IndexService(tmp_path / "index", 101, 2_000, columnar_min_records=0)
    service.build_index_batch(requests)
    expected = [(index_key_hash(f"{r.topic}#{w}"), r.commitlog_offset)
                for r in requests for w in ([r.uniq_key] if r.uniq_key is not None else []) + (r.keys or "").split()]
    assert [(e.key_hash, e.phy_offset) for f in service.files for e in f.entries()] == expected
    for r in requests[::37]:
        assert r.commitlog_offset in service.query_offset(r.topic, r.keys.split()[0], 64, 0, 10**13).phy_offsets
    service.close()


@pytest.mark.parametrize("topics", [["T"], ["T", "订阅", "U"]])
def test_columnar_build_without_keys(tmp_path: Path, topics: list[str]) -> None:
    """A chunk with UNIQ_KEYs only (what most producers send) takes the short path: same files."""
    requests = [DispatchRequest(True, 100, topics[i % len(topics)], 0, i * 100, 0, 0, 1_000 + i, None,
                                None if i % 9 == 4 else f"UNIQ{i:06X}") for i in range(100)]
    assert build(tmp_path / "columns", [requests], columnar=True) == build(tmp_path / "records", [requests],
                                                                            columnar=False)


def test_put_columns_keeps_the_write_order_of_put_items(tmp_path: Path) -> None:
    """Batches of any size, across a fresh file's first entry and a full file, give put_items' bytes."""
    rng = np.random.default_rng(7)
    items = IndexColumns(rng.integers(0, 2**31, 120), np.arange(120) * 10, 1_000_000 + rng.integers(-5, 5, 120) * 900)
    a = IndexFile(tmp_path / "a", 5, 100, create=True, prev_end_phy_offset=0, prev_end_timestamp=999_000)
    b = IndexFile(tmp_path / "b", 5, 100, create=True, prev_end_phy_offset=0, prev_end_timestamp=999_000)
    pos = 0
    for size in (1, 2, 30, 97):
        pos = a.put_columns(items, pos) if size > 1 else a.put_columns(IndexColumns(*(c[:1] for c in items)), 0)
    assert pos == 99 and a.is_write_full
    assert b.put_items(items.tuples(0, 120)) == 99
    assert a._mm[:] == b._mm[:]
    a.close()
    b.close()


@settings(max_examples=200, deadline=None)
@given(st.lists(WORDS, max_size=20), st.text(max_size=6))
def test_segment_hashes_equal_string_hash_code(words: list[str], prefix: str) -> None:
    text = "".join(words)
    units = utf16_units(text)
    lengths = np.array([len(w.encode("utf-16-le", "surrogatepass")) // 2 for w in words], dtype=np.int64)
    ends = np.cumsum(lengths)
    hashes = segment_hashes_u32(units, ends - lengths, ends)
    assert hashes.tolist() == [java_string_hash(w) & MASK32 for w in words]
    prefix_hash = java_string_hash(prefix) & MASK32
    combined = abs_java_ints(combine_u32(prefix_hash, hashes, lengths))
    assert combined.tolist() == [index_key_hash(prefix + w) for w in words]


def test_dispatch_columns_read_each_field() -> None:
    requests = [DispatchRequest(True, 10 + i, "T" if i else "U", i, 100 * i, i + 5, -i, 7 * i, None, "u", i)
                for i in range(3)]
    columns = DispatchColumns(iter(requests))
    assert columns.count == 3 and columns.all_success and columns.single_topic is None
    assert columns.msg_size.tolist() == [10, 11, 12] and columns.tags_code.tolist() == [0, -1, -2]
    assert columns.queue_offset.tolist() == [5, 6, 7] and columns.commitlog_offset.tolist() == [0, 100, 200]
