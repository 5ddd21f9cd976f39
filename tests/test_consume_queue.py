"""ConsumeQueue against real RocketMQ 4.9.8 stores: files rebuilt from the commitlog byte for byte, the
dumps' ``cqrange``/``cq``/``timequery`` rows, idempotent re-dispatch, recovery and truncation, the
``mqstore inspect consumequeue`` CLI, and a property test of put/read across file boundaries."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.store.formats.commitlog_walk import RecordEntry, iter_commitlog, list_commitlog_files
from services.store.formats.consume_queue import (
    BLANK_UNIT,
    CQ_STORE_UNIT_SIZE,
    ConsumeQueue,
    ConsumeQueueStore,
    Unit,
    _all_valid,
    is_valid_unit,
)
from services.store.formats.mapped_file import OS_PAGE_SIZE
from services.store.formats.message import (
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_NOT_TYPE,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
)
from services.store.formats.record import DispatchRequest, RecordError, decode_record
from tests.commitlog.commitlog_process import run_mqstore
from tests.conftest import DumpRows, LinesLoader, StoreFactory
from tests.geometry import GeometryPreset

CQ_FILE_SIZE = 6000  # mappedFileSizeConsumeQueue of the fixtures: 300 units
DISPATCH_CHUNK = 256
#: dump run -> the store tarball it describes (after the real recovery)
DUMP_STORES = {"normal": "normal-raw", "crash": "crash-recovered", "torn": "torn-recovered"}


# -- helpers --------------------------------------------------------------------------------------
@cache
def _dispatch_requests(commitlog_dir: Path) -> tuple[DispatchRequest, ...]:
    return tuple(entry.dispatch for entry in iter_commitlog(commitlog_dir) if isinstance(entry, RecordEntry))


def _cq_files(root: Path) -> dict[str, bytes]:
    return {path.relative_to(root).as_posix(): path.read_bytes() for path in root.rglob("*") if path.is_file()}


def _dispatch_all(store: ConsumeQueueStore, requests: tuple[DispatchRequest, ...]) -> int:
    """Dispatch in chunks, as the reput loop does."""
    return sum(store.dispatch_batch(requests[i:i + DISPATCH_CHUNK]) for i in range(0, len(requests), DISPATCH_CHUNK))


@contextmanager
def built_store(root: Path, requests: tuple[DispatchRequest, ...]) -> Iterator[ConsumeQueueStore]:
    store = ConsumeQueueStore(root, CQ_FILE_SIZE)
    _dispatch_all(store, requests)
    try:
        yield store
    finally:
        store.shutdown()


@contextmanager
def recovered_store(store_dir: Path, meta: dict[str, Any]) -> Iterator[ConsumeQueueStore]:
    """Open a store's queues the way DefaultMessageStore.load/recover does: recover every queue, cut
    units past the commitlog's end, then correct the min offsets against the commitlog's min offset."""
    store = ConsumeQueueStore(store_dir / "consumequeue", CQ_FILE_SIZE)
    store.load_all()
    if store.recover_all() >= meta["maxPhyOffset"]:
        store.truncate_dirty(meta["maxPhyOffset"])
    store.correct_min_offset(meta["minPhyOffset"])
    try:
        yield store
    finally:
        store.shutdown()


class CommitLogReader:
    """pickupStoreTimestamp over a fixture's commitlog: decode the record at (offset, size); -1 past
    the recovered end of the log or for bytes that are not a record."""

    def __init__(self, commitlog_dir: Path) -> None:
        self.files = list_commitlog_files(commitlog_dir)
        walk = iter_commitlog(commitlog_dir)
        for _ in walk:
            pass
        assert walk.end is not None
        self.max_offset = walk.end.offset

    def store_time(self, offset: int, size: int) -> int:
        if offset < 0 or size <= 0 or offset + size > self.max_offset:
            return -1
        file = self.files[offset // self.files[0].size]
        with file.path.open("rb") as handle:
            data = os.pread(handle.fileno(), size, offset - file.start_offset)
        try:
            return decode_record(data).store_timestamp
        except RecordError:
            return -1


def _meta(dump_rows: DumpRows, run: str) -> dict[str, Any]:
    (meta,) = dump_rows(run, "meta")
    return meta


# -- building from the commitlog ------------------------------------------------------------------
@pytest.mark.parametrize("name", ["normal-raw", "crash-recovered"])
def test_dispatch_rebuilds_the_fixture_files(pristine_store: StoreFactory, tmp_path: Path, name: str) -> None:
    fixture = pristine_store(name)
    requests = _dispatch_requests(fixture / "commitlog")
    with built_store(tmp_path / "consumequeue", requests) as store:
        assert store.max_physic_offset() == max(r.commitlog_offset + r.msg_size for r in requests)
    expected = _cq_files(fixture / "consumequeue")
    got = _cq_files(tmp_path / "consumequeue")
    assert sorted(got) == sorted(expected)  # same names: no successor for an exactly full file
    for path, data in expected.items():
        assert got[path] == data, path


def test_redispatch_changes_nothing(pristine_store: StoreFactory, tmp_path: Path) -> None:
    fixture = pristine_store("normal-raw")
    requests = _dispatch_requests(fixture / "commitlog")
    with built_store(tmp_path / "consumequeue", requests) as store:
        assert _dispatch_all(store, requests) == 0
        for request in requests[::97]:  # one by one, out of order
            queue = store.find_or_create(request.topic, request.queue_id)
            assert queue.put_message_position_info(request.commitlog_offset, request.msg_size,
                                                   request.tags_code, request.queue_offset)
    assert _cq_files(tmp_path / "consumequeue") == _cq_files(fixture / "consumequeue")


def test_reopened_queues_skip_what_they_hold(pristine_store: StoreFactory, fixture_store: StoreFactory,
                                             dump_rows: DumpRows) -> None:
    """After a restart the queues know their max commitlog offset: re-dispatch writes nothing."""
    store_dir = fixture_store("normal-raw")
    before = _cq_files(store_dir / "consumequeue")
    with recovered_store(store_dir, _meta(dump_rows, "normal")) as store:
        assert _dispatch_all(store, _dispatch_requests(pristine_store("normal-raw") / "commitlog")) == 0
    assert _cq_files(store_dir / "consumequeue") == before


@pytest.mark.parametrize("cut_index", [0, 1, 299 * 10, 1500, 2999])
def test_truncate_then_redispatch_rebuilds_the_same_bytes(pristine_store: StoreFactory, tmp_path: Path,
                                                          cut_index: int) -> None:
    """Cut at a record's commitlog offset (2990 is TopicA/0's unit 300, the first of its second file,
    which must go), then re-dispatch from there: the files come back byte for byte."""
    fixture = pristine_store("normal-raw")
    requests = _dispatch_requests(fixture / "commitlog")
    cut = requests[cut_index].commitlog_offset
    with built_store(tmp_path / "consumequeue", requests) as store:
        store.truncate_dirty(cut)
        for queue in store.queues():
            units = queue.get_units(0, 1000)
            assert all(offset < cut for offset, _, _, _ in units)
            assert len(units) == queue.max_offset_in_queue
            assert queue.max_physic_offset == (units[-1][0] + units[-1][1] if units else cut)
        assert store.max_physic_offset() <= cut
        assert store.max_physic_offset() == max(
            (r.commitlog_offset + r.msg_size for r in requests[:cut_index]), default=cut)
        _dispatch_all(store, requests)
    assert _cq_files(tmp_path / "consumequeue") == _cq_files(fixture / "consumequeue")


def test_truncate_deletes_files_past_the_cut(pristine_store: StoreFactory, tmp_path: Path) -> None:
    requests = _dispatch_requests(pristine_store("normal-raw") / "commitlog")
    with built_store(tmp_path / "consumequeue", requests) as store:
        queue = store.find_or_create("TopicA", 0)
        first_of_second_file = queue.get_units(300, 1)[0][0]
        store.truncate_dirty(first_of_second_file)
        assert queue.max_offset_in_queue == 300
        assert [f.path.name for f in queue.mapped_file_queue.files] == ["00000000000000000000"]
        assert sorted(p.name for p in queue.store_path.iterdir()) == ["00000000000000000000"]
        store.truncate_dirty(0)
        assert queue.max_offset_in_queue == 0 and queue.mapped_file_queue.files == []
        assert store.max_physic_offset() == 0  # RocketMQ: the truncation point when nothing is left


def test_transaction_types_and_blanks_in_dispatch(store_geometry: GeometryPreset, tmp_path: Path) -> None:
    """Only TRANSACTION_NOT_TYPE and TRANSACTION_COMMIT_TYPE records are queued; BLANKs are skipped."""
    store = ConsumeQueueStore(tmp_path / "consumequeue", store_geometry.cq_file_size)

    def request(offset: int, queue_offset: int, sys_flag: int) -> DispatchRequest:
        return DispatchRequest(success=True, msg_size=100, topic="T", queue_id=0, commitlog_offset=offset,
                               queue_offset=queue_offset, tags_code=offset, store_timestamp=offset,
                               sys_flag=sys_flag)

    requests = [request(0, 0, TRANSACTION_NOT_TYPE), request(100, 1, TRANSACTION_PREPARED_TYPE),
                DispatchRequest(success=True, msg_size=0), request(200, 1, TRANSACTION_COMMIT_TYPE),
                request(300, 2, TRANSACTION_ROLLBACK_TYPE | 0x1), request(400, 2, TRANSACTION_NOT_TYPE),
                DispatchRequest(success=False, msg_size=-1)]
    assert store.dispatch_batch(requests) == 3
    assert store.find_or_create("T", 0).get_units(0, 10) == [(0, 100, 0, 0), (200, 100, 200, 1), (400, 100, 400, 2)]
    assert store.logics_msg_timestamp == 400
    store.shutdown()


# -- the dumps ------------------------------------------------------------------------------------
@pytest.mark.parametrize("run", list(DUMP_STORES))
def test_cqrange_and_cq_rows(fixture_store: StoreFactory, dump_rows: DumpRows, run: str) -> None:
    store_dir = fixture_store(DUMP_STORES[run])
    with recovered_store(store_dir, _meta(dump_rows, run)) as store:
        ranges = dump_rows(run, "cqrange")
        with_files = {(q.topic, q.queue_id) for q in store.queues()}
        for row in ranges:
            key = (row["topic"], row["queueId"])
            if key not in with_files:  # ScheduleMessageService's in-memory queues: no files
                assert row["topic"] == "SCHEDULE_TOPIC_XXXX" and row["maxOffset"] == 0
                continue
            queue = store.find_or_create(*key)
            assert {"minOffset": queue.min_offset_in_queue, "maxOffset": queue.max_offset_in_queue,
                    "maxPhysicOffset": queue.max_physic_offset, "minLogicOffset": queue.min_logic_offset} == \
                {k: row[k] for k in ("minOffset", "maxOffset", "maxPhysicOffset", "minLogicOffset")}, key
        assert with_files <= {(r["topic"], r["queueId"]) for r in ranges}
        got = [{"type": "cq", "topic": q.topic, "queueId": q.queue_id, "cqOffset": cq_offset,
                "phyOffset": offset, "size": size, "tagsCode": tags_code}
               for q in store.queues()
               for offset, size, tags_code, cq_offset in q.get_units(q.min_offset_in_queue, 10_000)]
        assert got == dump_rows(run, "cq")
        assert store.max_physic_offset() == _meta(dump_rows, run)["maxPhyOffset"]


def test_unknown_queue_is_empty(fixture_store: StoreFactory, dump_rows: DumpRows) -> None:
    store_dir = fixture_store("normal-raw")
    with recovered_store(store_dir, _meta(dump_rows, "normal")) as store:
        queue = store.find_or_create("SCHEDULE_TOPIC_XXXX", 0)
        assert (queue.min_offset_in_queue, queue.max_offset_in_queue, queue.max_physic_offset,
                queue.min_logic_offset) == (0, 0, -1, 0)
        assert queue.get_units(0, 10) == [] and queue.get_index_buffer(0) is None
        assert queue.get_offset_in_queue_by_time(123, lambda offset, size: 0) == 0
        assert not (store_dir / "consumequeue" / "SCHEDULE_TOPIC_XXXX" / "0").exists()


@pytest.mark.parametrize("run", list(DUMP_STORES))
def test_timequery_rows(fixture_store: StoreFactory, dump_rows: DumpRows, run: str) -> None:
    """File mtimes come from the tarball (kept to the nanosecond by the extraction and the copy)."""
    store_dir = fixture_store(DUMP_STORES[run])
    reader = CommitLogReader(store_dir / "commitlog")
    meta = _meta(dump_rows, run)
    assert reader.max_offset == meta["maxPhyOffset"]
    with recovered_store(store_dir, meta) as store:
        rows = dump_rows(run, "timequery")
        assert rows
        got = [store.find_or_create(row["topic"], row["queueId"]).get_offset_in_queue_by_time(
            row["timestamp"], reader.store_time, meta["minPhyOffset"]) for row in rows]
    assert got == [row["offset"] for row in rows]


def test_timequery_picks_the_file_by_mtime(fixture_store: StoreFactory, dump_rows: DumpRows) -> None:
    """TopicA/0's unit 225 is in the first file, but that file was last written before its store
    time, so the search runs in the second file and answers its first unit, 300."""
    store_dir = fixture_store("normal-raw")
    reader = CommitLogReader(store_dir / "commitlog")
    with recovered_store(store_dir, _meta(dump_rows, "normal")) as store:
        queue = store.find_or_create("TopicA", 0)
        (offset, size, _, _), = queue.get_units(225, 1)
        mid = reader.store_time(offset, size)
        assert queue.get_offset_in_queue_by_time(mid, reader.store_time) == 300
        first = queue.mapped_file_queue.files[0].path
        os.utime(first, ns=(0, (mid + 10_000) * 1_000_000))  # as if written after it
        assert queue.get_offset_in_queue_by_time(mid, reader.store_time) == 225
        assert queue.get_offset_in_queue_by_time(mid - 4, reader.store_time) == 224  # nearer 224 (-7 ms) than 225


@pytest.mark.parametrize("run", list(DUMP_STORES))
def test_timequery_rows_on_rebuilt_queues(pristine_store: StoreFactory, dump_rows: DumpRows, tmp_path: Path,
                                          run: str) -> None:
    """Queues rebuilt from the commitlog long after the broker wrote them give RocketMQ's answers: each
    file carries its last unit's store time as mtime, not the time of the rebuild."""
    fixture = pristine_store(DUMP_STORES[run])
    meta = _meta(dump_rows, run)
    requests = tuple(r for r in _dispatch_requests(fixture / "commitlog")
                     if r.commitlog_offset + r.msg_size <= meta["maxPhyOffset"])
    reader = CommitLogReader(fixture / "commitlog")
    root = tmp_path / "consumequeue"
    with built_store(root, requests):
        pass
    store = ConsumeQueueStore(root, CQ_FILE_SIZE)
    store.load_all()
    store.recover_all()
    store.correct_min_offset(meta["minPhyOffset"])
    try:
        rows = dump_rows(run, "timequery")
        got = [store.find_or_create(row["topic"], row["queueId"]).get_offset_in_queue_by_time(
            row["timestamp"], reader.store_time, meta["minPhyOffset"]) for row in rows]
    finally:
        store.shutdown()
    assert got == [row["offset"] for row in rows]


# -- offset by time on a queue we control ---------------------------------------------------------
def _timed_queue(root: Path, store_times: list[int]) -> tuple[ConsumeQueue, Callable[[int, int], int]]:
    """One queue of units whose record at commitlog offset 100*i was stored at store_times[i]."""
    queue = ConsumeQueue(root, "T", 0, 20 * 4)
    queue.put_batch([(100 * i, 100, 0, i) for i in range(len(store_times))])
    times = {100 * i: t for i, t in enumerate(store_times)}
    for mapped in queue.mapped_file_queue.files:  # every file written "in the future"
        os.utime(mapped.path, ns=(0, 10**18))
    return queue, lambda offset, size: times.get(offset, -1)


@pytest.mark.parametrize(("timestamp", "expected"), [
    (0, 0), (999, 0), (1000, 0), (1004, 0),  # before or at the first: the first
    (1005, 0), (1006, 1),  # 1005 is as near 1000 as 1010: the earlier one wins
    (1010, 1), (1016, 2), (1030, 3), (1031, 3), (2**63 - 1, 3),  # past the last: the last
])
def test_timequery_nearest_and_edges(tmp_path: Path, timestamp: int, expected: int) -> None:
    queue, store_time_of = _timed_queue(tmp_path, [1000, 1010, 1020, 1030])
    assert queue.get_offset_in_queue_by_time(timestamp, store_time_of) == expected
    queue.shutdown()


def test_timequery_unreadable_record_and_min_physic_offset(tmp_path: Path) -> None:
    queue, store_time_of = _timed_queue(tmp_path, [1000, 1010, 1020, 1030])
    assert queue.get_offset_in_queue_by_time(1020, lambda offset, size: -1) == 0
    # units below the commitlog's min offset are passed over without reading them
    assert queue.get_offset_in_queue_by_time(1000, store_time_of, min_physic_offset=200) == 2
    assert queue.get_offset_in_queue_by_time(1000, store_time_of, min_physic_offset=10_000) == 0
    queue.shutdown()


# -- recovery --------------------------------------------------------------------------------------
@pytest.mark.parametrize(("topic", "queue_id", "file_name", "last_unit"), [
    ("TopicA", 1, "00000000000000006000", 449),
    ("Topic-Long-Name_with.chars", 0, "00000000000000000000", 299),  # the last unit of a full file
])
def test_recover_truncates_a_torn_last_unit(pristine_store: StoreFactory, fixture_store: StoreFactory,
                                            dump_rows: DumpRows, topic: str, queue_id: int,
                                            file_name: str, last_unit: int) -> None:
    store_dir = fixture_store("normal-raw")
    path = store_dir / "consumequeue" / topic / str(queue_id) / file_name
    position = last_unit * CQ_STORE_UNIT_SIZE % CQ_FILE_SIZE
    data = bytearray(path.read_bytes())
    data[position + 8:position + CQ_STORE_UNIT_SIZE] = bytes(12)  # size and tags code never made it
    path.write_bytes(data)
    with recovered_store(store_dir, _meta(dump_rows, "normal")) as store:
        queue = store.find_or_create(topic, queue_id)
        assert queue.max_offset_in_queue == last_unit
        (offset, size, _, _), = queue.get_units(last_unit - 1, 10)
        assert queue.max_physic_offset == offset + size
        assert path.read_bytes()[position:] == bytes(CQ_FILE_SIZE - position)  # the torn bytes are zeroed
        _dispatch_all(store, _dispatch_requests(pristine_store("normal-raw") / "commitlog"))
        assert queue.max_offset_in_queue == last_unit + 1
    assert _cq_files(store_dir / "consumequeue") == _cq_files(pristine_store("normal-raw") / "consumequeue")


def test_clean_recovery_writes_nothing(fixture_store: StoreFactory, dump_rows: DumpRows) -> None:
    store_dir = fixture_store("crash-recovered")
    root = store_dir / "consumequeue"
    before = {p: p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file()}
    with recovered_store(store_dir, _meta(dump_rows, "crash")) as store:
        assert len(store.queues()) == 8
    assert {p: p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file()} == before


def test_recover_drops_files_after_a_hole(tmp_path: Path) -> None:
    """A unit missing in the middle of the last 3 files ends the data there; later files go."""
    queue = ConsumeQueue(tmp_path, "T", 0, 20 * 3)
    queue.put_batch([(100 * i, 100, i, i) for i in range(8)])
    path = queue.mapped_file_queue.files[1].path
    queue.shutdown()
    data = bytearray(path.read_bytes())
    data[20:40] = bytes(20)  # unit 4
    path.write_bytes(data)
    reopened = ConsumeQueue(tmp_path, "T", 0, 20 * 3)
    reopened.load()
    reopened.recover()
    assert reopened.max_offset_in_queue == 4
    assert reopened.max_physic_offset == 400
    assert [f.path.name for f in reopened.mapped_file_queue.files] == [f"{0:020d}", f"{60:020d}"]
    assert reopened.put_batch([(100 * i, 100, i, i) for i in range(8)]) == 4
    assert reopened.get_units(0, 100) == [(100 * i, 100, i, i) for i in range(8)]
    reopened.shutdown()


# -- RocketMQ's put rules ---------------------------------------------------------------------------
def test_fill_pre_blank_and_min_offset(tmp_path: Path) -> None:
    """A queue whose first unit is cq offset 10 (7 units a file): its first file starts at unit 7 and
    units 7..9 are blanks (0, Integer.MAX_VALUE, 0)."""
    queue = ConsumeQueue(tmp_path, "T", 0, 20 * 7)
    assert queue.put_message_position_info(5000, 120, 42, 10)
    assert [f.path.name for f in queue.mapped_file_queue.files] == [f"{140:020d}"]
    data = queue.mapped_file_queue.files[0].path.read_bytes()
    assert data[:60] == BLANK_UNIT * 3
    assert data[60:80] == (5000).to_bytes(8, "big") + (120).to_bytes(4, "big") + (42).to_bytes(8, "big")
    assert (queue.min_offset_in_queue, queue.max_offset_in_queue) == (10, 11)
    assert queue.get_units(7, 10) == []  # below the min offset
    assert queue.get_units(10, 10) == [(5000, 120, 42, 10)]
    queue.shutdown()
    reopened = ConsumeQueue(tmp_path, "T", 0, 20 * 7)
    reopened.load()
    reopened.recover()
    assert reopened.max_physic_offset == 5120  # the blanks do not count
    reopened.correct_min_offset(0)  # RocketMQ 4.9: blanks point at 0, so the min falls back to 7
    assert reopened.min_offset_in_queue == 7
    reopened.correct_min_offset(1)
    assert reopened.min_offset_in_queue == 10
    reopened.shutdown()


def test_gap_is_logged_and_appended_at_the_write_position(store_geometry: GeometryPreset, tmp_path: Path,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    queue = ConsumeQueue(tmp_path, "T", 0, store_geometry.cq_file_size)
    queue.put_batch([(0, 10, 0, 0), (10, 10, 0, 1)])
    with caplog.at_level(logging.ERROR, logger="services.store.formats.consume_queue"):
        queue.put_batch([(20, 10, 0, 5)])
    assert "logic queue order maybe wrong" in caplog.text
    assert queue.get_units(0, 10)[-1] == (20, 10, 0, 2)  # as RocketMQ: at the write position
    queue.shutdown()


def test_repeats_are_skipped_by_position_and_by_commitlog_offset(store_geometry: GeometryPreset,
                                                                 tmp_path: Path) -> None:
    queue = ConsumeQueue(tmp_path, "T", 0, store_geometry.cq_file_size)
    assert queue.put_batch([(0, 10, 1, 0), (10, 10, 2, 1), (20, 10, 3, 2)]) == 3
    assert queue.put_batch([(10, 10, 9, 1), (25, 10, 9, 1), (30, 10, 4, 3)]) == 1
    assert queue.get_units(0, 10) == [(0, 10, 1, 0), (10, 10, 2, 1), (20, 10, 3, 2), (30, 10, 4, 3)]
    assert queue.max_physic_offset == 40
    queue.shutdown()


def test_get_index_buffer_and_flush_and_destroy(tmp_path: Path) -> None:
    queue = ConsumeQueue(tmp_path, "T", 3, 20 * 7)
    queue.put_batch([(100 * i, 100, i, i) for i in range(10)])
    buffer = queue.get_index_buffer(5)
    assert buffer is not None and len(buffer) == 2 * 20  # units 5 and 6: the rest of the first file
    assert queue.get_index_buffer(10) is None
    assert queue.flush(0) and queue.flush(0)  # one file per call, as RocketMQ
    assert not queue.flush(0)
    assert queue.roll_next_file(5) == 7
    queue.destroy()
    assert not queue.store_path.exists()
    assert (queue.max_offset_in_queue, queue.max_physic_offset) == (0, -1)
    assert queue.put_batch([(0, 1, 0, 0)]) == 1
    queue.shutdown()


def test_flush_when_the_last_file_is_exactly_full(tmp_path: Path) -> None:
    """Two full files and no successor: nothing is left to flush, and flush must say so."""
    store = ConsumeQueueStore(tmp_path, 20 * 3)
    queue = store.find_or_create("T", 0)
    queue.put_batch([(100 * i, 100, i, i) for i in range(6)])
    while store.flush_all(0):
        pass
    assert queue.mapped_file_queue.flushed_where == 120
    assert not store.flush_all(2)
    store.shutdown()


# -- file mtimes of queues built from the commitlog -----------------------------------------------
PAGE_UNITS = OS_PAGE_SIZE / CQ_STORE_UNIT_SIZE  # 204.8: unit 204 is the first to write into a file's second page


def _stored(count: int, first: int = 0) -> list[DispatchRequest]:
    """Records of queue T/0 in commitlog order; record i was stored at 1_000_000 + 10 * i."""
    return [DispatchRequest(True, 100, "T", 0, 100 * i, i, 0, 1_000_000 + 10 * i) for i in range(first, first + count)]


def _mtimes_ms(queue: ConsumeQueue) -> list[int]:
    return [f.stat().st_mtime_ns // 1_000_000 for f in sorted(queue.store_path.iterdir())]


def test_built_files_get_the_mtime_a_broker_would_leave(tmp_path: Path) -> None:
    """300-unit (two-page) files: a complete file at once gets the store time of unit 204, the first
    written into its last page, as a broker's page faults would set it; the last file at shutdown."""
    store = ConsumeQueueStore(tmp_path, CQ_FILE_SIZE)
    for start in range(0, 700, 64):  # in chunks, as the reput loop dispatches
        store.dispatch_batch(_stored(min(64, 700 - start), start))
    queue = store.find_or_create("T", 0)
    assert int(PAGE_UNITS) == 204
    assert _mtimes_ms(queue)[:2] == [1_000_000 + 10 * 204, 1_000_000 + 10 * 504]
    store.shutdown()
    assert _mtimes_ms(queue) == [1_000_000 + 10 * 204, 1_000_000 + 10 * 504, 1_000_000 + 10 * 600]

    # RocketMQ's answers follow from those mtimes: a time after the last message, the last unit; a
    # time past a file's mtime is searched in the next file.
    def store_time_of(offset: int, size: int) -> int:
        return 1_000_000 + offset // 10

    reopened = ConsumeQueueStore(tmp_path, CQ_FILE_SIZE)
    reopened.load_all()
    reopened.recover_all()
    queue = reopened.find_or_create("T", 0)
    assert queue.get_offset_in_queue_by_time(1_000_000 + 10 * 699 + 1, store_time_of) == 699
    assert queue.get_offset_in_queue_by_time(1_000_000 + 10 * 150, store_time_of) == 150
    assert queue.get_offset_in_queue_by_time(1_000_000 + 10 * 250, store_time_of) == 300
    # Re-dispatching what is there writes nothing and leaves every mtime alone.
    before = _mtimes_ms(queue)
    assert reopened.dispatch_batch(_stored(700)) == 0
    reopened.shutdown()
    assert _mtimes_ms(queue) == before


def test_a_flush_makes_the_next_write_set_the_mtime(tmp_path: Path) -> None:
    """A flush writes the pages back and makes them clean, so the next unit written into the last
    page is the one whose time the file keeps; a reopened queue's first write likewise."""
    store = ConsumeQueueStore(tmp_path, CQ_FILE_SIZE)
    queue = store.find_or_create("T", 0)
    store.dispatch_batch(_stored(210))
    assert store.flush_all(0)
    store.dispatch_batch(_stored(150, 210))
    assert _mtimes_ms(queue)[0] == 1_000_000 + 10 * 210
    store.shutdown()
    assert _mtimes_ms(queue)[1] == 1_000_000 + 10 * 300

    reopened = ConsumeQueueStore(tmp_path, CQ_FILE_SIZE)
    reopened.load_all()
    reopened.recover_all()
    reopened.dispatch_batch(_stored(20, 360))
    reopened.shutdown()
    assert _mtimes_ms(queue) == [1_000_000 + 10 * 210, 1_000_000 + 10 * 360]


def test_truncation_forgets_the_store_time(tmp_path: Path) -> None:
    """Units past a commitlog cut are dropped; the store time of the units left is not known, so the
    file keeps the mtime the truncation's write gave it."""
    store = ConsumeQueueStore(tmp_path, CQ_FILE_SIZE)
    queue = store.find_or_create("T", 0)
    store.dispatch_batch(_stored(50))
    store.truncate_dirty(100 * 40)
    truncated = _mtimes_ms(queue)
    store.shutdown()
    assert _mtimes_ms(queue) == truncated
    assert truncated[0] > 1_000_000 + 10 * 50


# -- property: what goes in comes out ---------------------------------------------------------------
_PUTS = st.lists(st.tuples(st.integers(0, 2), st.integers(1, 5000), st.integers(-(2**63), 2**63 - 1)),
                 min_size=1, max_size=60)


@settings(max_examples=60, deadline=None)
@given(puts=_PUTS, starts=st.tuples(*[st.integers(0, 20)] * 3), chunk=st.integers(1, 17))
def test_put_batch_round_trip(puts: list[tuple[int, int, int]], starts: tuple[int, int, int], chunk: int) -> None:
    """Random (queue, size, tags) units in commitlog order, each queue starting at a random cq offset,
    put in random-sized batches into 7-unit files, read back equal; also after a reload."""
    expected: dict[int, list[Unit]] = {0: [], 1: [], 2: []}
    commitlog_offset = 0
    for queue_index, size, tags_code in puts:
        units = expected[queue_index]
        units.append((commitlog_offset, size, tags_code, starts[queue_index] + len(units)))
        commitlog_offset += size
    with tempfile.TemporaryDirectory() as directory:
        root = Path(directory)
        for queue_index, units in expected.items():
            queue = ConsumeQueue(root, "T", queue_index, 20 * 7)
            for i in range(0, len(units), chunk):
                queue.put_batch(units[i:i + chunk])
            start = starts[queue_index]
            assert queue.get_units(start, 1000) == units
            assert queue.get_units(start + 3, 2) == units[3:5]
            assert queue.max_offset_in_queue == (start + len(units) if units else 0)
            queue.shutdown()
            reopened = ConsumeQueue(root, "T", queue_index, 20 * 7)
            reopened.load()
            reopened.recover()
            reopened.correct_min_offset(0)
            assert reopened.get_units(start, 1000) == units
            assert reopened.max_physic_offset == (units[-1][0] + units[-1][1] if units else -1)
            reopened.shutdown()


_RAW_UNITS = st.lists(st.tuples(st.sampled_from([0, 1, -1, 2**40, -(2**63), 2**63 - 1]),
                                 st.sampled_from([0, 1, 256, 65536, 2**24, 2**31 - 1, -1, -(2**31), 2**24 + 1]),
                                 st.integers(-(2**63), 2**63 - 1)), max_size=40)


@settings(max_examples=200, deadline=None)
@given(units=_RAW_UNITS)
def test_all_valid_agrees_with_the_unit_rule(units: list[tuple[int, int, int]]) -> None:
    """Recovery's vectorised check of a chunk says what the unit-by-unit rule says."""
    chunk = b"".join(offset.to_bytes(8, "big", signed=True) + size.to_bytes(4, "big", signed=True)
                     + tags.to_bytes(8, "big", signed=True) for offset, size, tags in units)
    assert _all_valid(chunk) == all(is_valid_unit(offset, size) for offset, size, _ in units)


# -- mqstore inspect consumequeue --------------------------------------------------------------------
def run_cli(*args: str | Path) -> subprocess.CompletedProcess[bytes]:
    """``--json`` with the field names of RocketMQ's reference dumps, which the tests compare with."""
    names = ("--json-names", "rocketmq") if "--json" in args else ()
    return run_mqstore("inspect", "consumequeue", *args, *names)


@pytest.mark.parametrize("run", ["normal", "crash"])
def test_cli_json_is_the_dump(pristine_store: StoreFactory, dump_lines: LinesLoader, run: str) -> None:
    result = run_cli(pristine_store(DUMP_STORES[run]) / "consumequeue", "--json")
    assert result.returncode == 0, result.stderr.decode()
    assert result.stderr == b""
    expected = [line for line in dump_lines(run) if line.startswith('{"type":"cq"')]
    assert result.stdout.decode("utf-8").splitlines() == expected  # byte for byte


def test_cli_topic_and_queue_dirs_and_table(pristine_store: StoreFactory, dump_rows: DumpRows) -> None:
    root = pristine_store("normal-raw") / "consumequeue"
    topic = run_cli(root / "TopicB", "--json")
    assert topic.returncode == 0
    assert [json.loads(line) for line in topic.stdout.splitlines()] == \
        [r for r in dump_rows("normal", "cq") if r["topic"] == "TopicB"]
    queue = run_cli(root / "Topic-Long-Name_with.chars" / "0", "--json")
    assert len(queue.stdout.splitlines()) == 300
    table = run_cli(root / "TopicA" / "3")
    lines = table.stdout.decode().splitlines()
    assert table.returncode == 0 and lines[0].split() == ["TOPIC", "QUEUE", "CQOFFSET", "PHYOFFSET", "SIZE",
                                                          "TAGSCODE"]
    assert lines[-1] == "# 450 units in 1 queues"


def test_cli_bad_directories(pristine_store: StoreFactory, tmp_path: Path) -> None:
    missing = run_cli(tmp_path / "nope")
    assert missing.returncode == 2 and b"no such directory" in missing.stderr
    bare_root = tmp_path / "bare"  # a store root is read in either layout (tests/test_inspect_cli.py): not this one
    (bare_root / "commitlog").mkdir(parents=True)
    no_queues = run_cli(bare_root)
    assert no_queues.returncode == 2 and b"no ConsumeQueue files" in no_queues.stderr
    queue_dir = tmp_path / "consumequeue" / "T" / "0"
    queue_dir.mkdir(parents=True)
    (queue_dir / "00000000000000000000").write_bytes(bytes(40))
    (queue_dir / "00000000000000000060").write_bytes(bytes(40))
    gap = run_cli(tmp_path / "consumequeue")
    assert gap.returncode == 2 and b"gap" in gap.stderr
