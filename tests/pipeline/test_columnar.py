"""The columnar split decoder (pipeline/columnar.py) yields exactly the rows of the per-record one.

Generated commitlogs mix the layout the fast path takes with every case it must hand to the
per-record decoder: IPv6 hosts, v2 records, compressed bodies (with --decompress), duplicate and
dropped properties, values holding the name/value separator, non-ASCII text, bad UTF-8, and a torn
record. The two decoders run over the same splits at several split sizes; rows, counts, offsets and
reported problems must be equal. No Spark: this is the workers' code alone.
"""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np
import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.columnar import export_batches, sorted_distinct
from pipeline.export import SCHEMA, decode_split, records_batch
from pipeline.records import record_facts, record_facts_per_record
from pipeline.scan import ScanSummary
from pipeline.split_reader import MappedSplit, plan_splits, scan_split
from services.store.formats.commitlog_walk import list_commitlog_files
from services.store.formats.message import BORNHOST_V6_FLAG, COMPRESSED_FLAG, STOREHOSTADDRESS_V6_FLAG
from services.store.formats.record import MESSAGE_MAGIC_CODE_V2, encode_record
from services.store.formats.socket_address import encode_address

FILE_SIZE = 32 * 1024

_NAMES = st.sampled_from(["UNIQ_KEY", "KEYS", "TAGS", "CLUSTER", "a", "é", ""])
_VALUES = st.one_of(st.sampled_from(["", "v", "x\x01y", "k1  k2 ", " ", "ünï", "𝄞 z", "0A1B2C3D"]),
                    st.text(alphabet="ab \x01é", max_size=6))


@st.composite
def records(draw: st.DrawFn) -> dict[str, object]:
    items = draw(st.lists(st.tuples(_NAMES, _VALUES), max_size=5))
    properties = "\x02".join(f"{name}\x01{value}" if draw(st.booleans()) or not value else name
                             for name, value in items)
    sys_flag = 0
    born, store = "10.0.0.1:4000", "127.0.0.1:10911"
    if draw(st.integers(0, 9)) == 0:
        sys_flag |= BORNHOST_V6_FLAG
        born = "[fe80::1]:4000"
    if draw(st.integers(0, 9)) == 0:
        sys_flag |= STOREHOSTADDRESS_V6_FLAG
        store = "[::1]:10911"
    body = draw(st.binary(max_size=300))
    sys_flag |= draw(st.sampled_from([0, 0, 0, 0x4, 0x8, 0xC]))  # transaction types, rollback (0xC) not indexed
    if draw(st.integers(0, 6)) == 0:
        sys_flag |= COMPRESSED_FLAG
        body = zlib.compress(body) if draw(st.booleans()) else body  # a bad zlib body stays as stored
    topic = draw(st.sampled_from([b"Orders", b"T\xc3\xa9st", b"bad\xff", b"Audit", b"SCHEDULE_TOPIC_XXXX"]))
    return {"topic": topic, "properties": properties.encode("utf-8"), "body": body, "sys_flag": sys_flag,
            "born_host": encode_address(born), "store_host": encode_address(store),
            "queue_id": draw(st.integers(0, 3)), "flag": draw(st.integers(-5, 5)),
            "born_timestamp": draw(st.integers(-10**12, 2 * 10**12)),
            "store_timestamp": draw(st.integers(0, 2 * 10**12)), "crc_ok": draw(st.integers(0, 9)) > 0,
            "v2": draw(st.integers(0, 9)) == 0}


def write_commitlog(directory: Path, specs: list[dict[str, object]], torn_at: int | None) -> Path:
    """One commitlog file of the records (BLANK-free: the rest is zeros), optionally one torn."""
    directory.mkdir(parents=True, exist_ok=True)
    data = bytearray()
    for i, spec in enumerate(specs):
        fields = {k: v for k, v in spec.items() if k not in ("crc_ok", "v2")}
        record = bytearray(encode_record(**fields, queue_offset=i, commitlog_offset=len(data),
                                         crc=None if spec["crc_ok"] else 12345))
        if spec["v2"]:  # the v2 layout: a 2-byte topic length
            topic_at = len(record) - 2 - len(spec["properties"]) - len(spec["topic"]) - 1  # type: ignore[arg-type]
            record[4:8] = MESSAGE_MAGIC_CODE_V2.to_bytes(4, "big")
            record[topic_at:topic_at + 1] = len(spec["topic"]).to_bytes(2, "big")  # type: ignore[arg-type]
            record[0:4] = len(record).to_bytes(4, "big", signed=True)
        if len(data) + len(record) > FILE_SIZE - 8:
            break
        if torn_at == i:
            record[60:70] = bytes(10)
        data += record
    path = directory / "00000000000000000000"
    path.write_bytes(bytes(data).ljust(FILE_SIZE, b"\0"))
    return directory


def decode_both(commitlog: Path, split_size: int, decompress: bool) -> tuple[pa.Table, pa.Table, ScanSummary,
                                                                              ScanSummary]:
    splits = plan_splits(commitlog, split_size, files=list_commitlog_files(commitlog, FILE_SIZE))
    old, new = ScanSummary(), ScanSummary()
    reference = [batch for split in splits for batch in decode_split(split, decompress, old)]
    columnar = [batch for split in splits for batch in export_batches(
        split, decompress, new, 7, SCHEMA, lambda r: records_batch(r, decompress))]
    return pa.Table.from_batches(reference, SCHEMA), pa.Table.from_batches(columnar, SCHEMA), old, new


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(specs=st.lists(records(), min_size=1, max_size=40), torn=st.one_of(st.none(), st.integers(0, 39)),
       decompress=st.booleans(), split_size=st.sampled_from([300, 4096, FILE_SIZE]))
def test_columnar_rows_equal_per_record_rows(tmp_path_factory: object, specs: list[dict[str, object]],
                                             torn: int | None, decompress: bool, split_size: int) -> None:
    commitlog = write_commitlog(tmp_path_factory.mktemp("columnar") / "commitlog",  # type: ignore[attr-defined]
                                specs, torn)
    reference, columnar, old, new = decode_both(commitlog, split_size, decompress)
    assert columnar.num_rows == reference.num_rows
    for name in SCHEMA.names:
        assert columnar[name].combine_chunks().equals(reference[name].combine_chunks()), name
    assert new.splits == old.splits
    assert new.max_end == old.max_end
    assert new.gaps == old.gaps
    assert new.bad_records == old.bad_records


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(specs=st.lists(records(), min_size=1, max_size=40), torn=st.one_of(st.none(), st.integers(0, 39)),
       split_size=st.sampled_from([300, 4096, FILE_SIZE]))
def test_columnar_record_facts_equal_per_record_facts(tmp_path_factory: object, specs: list[dict[str, object]],
                                                      torn: int | None, split_size: int) -> None:
    """verify's and stats' record facts (tags codes, index keys and hashes included)."""
    commitlog = write_commitlog(tmp_path_factory.mktemp("facts") / "commitlog",  # type: ignore[attr-defined]
                                specs, torn)
    splits = plan_splits(commitlog, split_size, files=list_commitlog_files(commitlog, FILE_SIZE))
    old, new = ScanSummary(), ScanSummary()
    reference = pa.Table.from_batches([record_facts_per_record(split, old) for split in splits])
    columnar = pa.Table.from_batches([record_facts(split, new) for split in splits])
    assert columnar.num_rows == reference.num_rows
    for name in reference.schema.names:
        assert columnar[name].combine_chunks().equals(reference[name].combine_chunks()), name
    assert (new.splits, new.max_end, new.gaps, new.bad_records) == (old.splits, old.max_end, old.gaps,
                                                                     old.bad_records)


def test_common_records_take_the_fast_path(tmp_path: Path) -> None:
    """Plain records never reach the per-record decoder (the speed depends on it)."""
    specs = [{"topic": b"Orders", "properties": f"UNIQ_KEY\x01{i:032X}\x02KEYS\x01k{i} x\x02TAGS\x01t".encode(),
              "body": bytes(100), "sys_flag": 0, "born_host": encode_address("10.0.0.1:4000"),
              "store_host": encode_address("127.0.0.1:10911"), "queue_id": i % 2, "flag": 0,
              "born_timestamp": 1_700_000_000_000, "store_timestamp": 1_700_000_000_001, "crc_ok": True,
              "v2": False} for i in range(200)]
    commitlog = write_commitlog(tmp_path / "commitlog", specs, None)
    split = plan_splits(commitlog, FILE_SIZE, files=list_commitlog_files(commitlog, FILE_SIZE))[0]

    def refuse(_: object) -> pa.RecordBatch:
        raise AssertionError("a plain record went to the per-record decoder")

    summary = ScanSummary()
    rows = sum(batch.num_rows for batch in export_batches(split, False, summary, 4096, SCHEMA, refuse))
    assert rows == summary.records > 100
    reference, columnar, _, _ = decode_both(commitlog, 1000, False)
    assert columnar.equals(reference)


def test_properties_next_to_each_other_keep_their_records(tmp_path: Path) -> None:
    """The properties of consecutive records are parsed back to back: empty ones in a row, ones made
    of separators only, trailing separators, and bodies full of separator bytes (never parsed) must
    still give each record its own items, on the fast path."""
    props = [b"", b"", b"TAGS\x01a\x02", b"\x02", b"", b"\x02TAGS\x01b", b"", b"\x02\x02KEYS\x01k1 k2\x02",
             b"\x01\x02\x01", b"a\x01\x01\x02b\x01c", b"", b"TAGS\x01z"]
    specs = [{"topic": b"Orders", "properties": p, "body": (b"\x01\x02" * 40)[:i * 7], "sys_flag": 0,
              "born_host": encode_address("10.0.0.1:4000"), "store_host": encode_address("127.0.0.1:10911"),
              "queue_id": 0, "flag": 0, "born_timestamp": 1, "store_timestamp": 2, "crc_ok": True, "v2": False}
             for i, p in enumerate(props)]
    commitlog = write_commitlog(tmp_path / "commitlog", specs, None)
    split = plan_splits(commitlog, FILE_SIZE, files=list_commitlog_files(commitlog, FILE_SIZE))[0]

    def refuse(_: object) -> pa.RecordBatch:
        raise AssertionError("a record went to the per-record decoder")

    columnar = pa.Table.from_batches(list(export_batches(split, False, ScanSummary(), 4096, SCHEMA, refuse)))
    assert columnar.column("properties").to_pylist() == [
        [], [], [("TAGS", "a")], [], [], [("TAGS", "b")], [], [("KEYS", "k1 k2")], [], [("a", "\x01"), ("b", "c")], [],
        [("TAGS", "z")]]
    reference, columnar, _, _ = decode_both(commitlog, FILE_SIZE, False)
    assert columnar.equals(reference)


def test_bad_utf8_in_a_dropped_property_item_makes_the_record_bad(tmp_path: Path) -> None:
    """The properties string is decoded as a whole: bad UTF-8 in an item RocketMQ drops (no name/value
    separator, an empty name) still makes the record undecodable, in both decoders."""
    props = [b"TAGS\x01a\x02\xfe\xff\x02KEYS\x01k", b"\x01\xfe\x02TAGS\x01b", b"TAGS\x01c\x02", b"TAGS\x01d"]
    specs = [{"topic": b"Orders", "properties": p, "body": b"x", "sys_flag": 0,
              "born_host": encode_address("10.0.0.1:4000"), "store_host": encode_address("127.0.0.1:10911"),
              "queue_id": 0, "flag": 0, "born_timestamp": 1, "store_timestamp": 2, "crc_ok": True, "v2": False}
             for p in props]
    commitlog = write_commitlog(tmp_path / "commitlog", specs, None)
    reference, columnar, old, new = decode_both(commitlog, FILE_SIZE, False)
    assert reference.column("tags").to_pylist() == ["c", "d"] and len(old.bad_records) == 2
    assert columnar.equals(reference) and new.bad_records == old.bad_records
    splits = plan_splits(commitlog, FILE_SIZE, files=list_commitlog_files(commitlog, FILE_SIZE))
    old_facts, new_facts = ScanSummary(), ScanSummary()
    assert record_facts(splits[0], new_facts).equals(record_facts_per_record(splits[0], old_facts))
    assert new_facts.bad_records == old_facts.bad_records


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(specs=st.lists(records(), min_size=1, max_size=40), torn=st.one_of(st.none(), st.integers(0, 39)),
       split_size=st.sampled_from([300, 4096, FILE_SIZE]))
def test_reindex_dispatch_columnar_equals_parsed(tmp_path_factory: object, specs: list[dict[str, object]],
                                                 torn: int | None, split_size: int) -> None:
    """reindex's stage 1: queue units and index items from the columnar decoder equal those from
    parse_dispatch_requests (the path every run took before, and still takes when it must)."""
    import pipeline.reindex as reindex

    commitlog = write_commitlog(tmp_path_factory.mktemp("dispatch") / "commitlog",  # type: ignore[attr-defined]
                                specs, torn)
    splits = plan_splits(commitlog, split_size, files=list_commitlog_files(commitlog, FILE_SIZE))
    columnar = [reindex.dispatch_split(split) for split in splits]
    fast_columns = reindex._fast_columns
    try:
        reindex._fast_columns = lambda *args: None
        parsed = [reindex.dispatch_split(split) for split in splits]
    finally:
        reindex._fast_columns = fast_columns
    assert columnar == parsed


def test_reindex_dispatch_takes_the_columnar_path(tmp_path: Path) -> None:
    import pipeline.reindex as reindex

    specs = [{"topic": b"Orders", "properties": f"UNIQ_KEY\x01{i:032X}\x02KEYS\x01k{i} x\x02TAGS\x01t".encode(),
              "body": bytes(100), "sys_flag": 0, "born_host": encode_address("10.0.0.1:4000"),
              "store_host": encode_address("127.0.0.1:10911"), "queue_id": i % 2, "flag": 0,
              "born_timestamp": 1_700_000_000_000, "store_timestamp": 1_700_000_000_001, "crc_ok": True,
              "v2": False} for i in range(50)]
    commitlog = write_commitlog(tmp_path / "commitlog", specs, None)
    split = plan_splits(commitlog, FILE_SIZE, files=list_commitlog_files(commitlog, FILE_SIZE))[0]
    with MappedSplit(split) as view:
        layout = scan_split(view, split)
        assert all(reindex._fast_columns(view, split, start, end) is not None for start, end in layout.runs)
    dispatched = reindex.dispatch_split(split)
    assert dispatched.records == 50 and dispatched.item_count == 150


@given(st.lists(st.integers(-2**31, 2**31 - 1), max_size=300), st.sampled_from(["<i8", ">i4", "<i4"]))
def test_sorted_distinct_is_np_unique(values: list[int], dtype: str) -> None:
    array = np.array(values, dtype=np.int64).astype(dtype)
    expected = np.unique(array)
    assert sorted_distinct(array).tolist() == expected.tolist()
