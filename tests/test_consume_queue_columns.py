"""The columnar ConsumeQueue dispatch (DispatchColumns -> ConsumeQueue.put_columns) writes the same files
as the record-by-record one: re-dispatches, gaps, transaction records, several topics, file rolls."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.indexer.indexer_store import _arrivals
from services.store.formats.consume_queue import COLUMNAR_MIN_RECORDS, CQ_STORE_UNIT_SIZE, ConsumeQueueStore
from services.store.formats.dispatch_columns import DispatchColumns
from services.store.formats.message import TRANSACTION_COMMIT_TYPE, TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE
from services.store.formats.record import DispatchRequest

RECORDS = st.lists(st.tuples(
    st.sampled_from([("T", 0), ("T", 1), ("U", 0), ("订阅", 3)]),
    st.sampled_from([0, 0, 0, 0, TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE, TRANSACTION_COMMIT_TYPE]),
    st.sampled_from([1, 1, 1, 1, 0, 2]),  # the queue offset step: 1 in order, 0 again, 2 a gap
    st.integers(-(2**40), 2**40),  # tags code
), min_size=1, max_size=80)


def requests_of(records: list[tuple[tuple[str, int], int, int, int]]) -> list[DispatchRequest]:
    next_cq: dict[tuple[str, int], int] = {}
    out, offset = [], 0
    for (topic, queue_id), sys_flag, step, tags in records:
        cq = next_cq.get((topic, queue_id), -1) + step
        cq = max(cq, 0)
        next_cq[topic, queue_id] = cq
        out.append(DispatchRequest(True, 50, topic, queue_id, offset, cq, tags, 1_700_000_000_000 + offset,
                                   None, None, sys_flag))
        offset += 50
    return out


def build(root: Path, batches: list[list[DispatchRequest]], columnar: bool) -> dict[str, bytes]:
    store = ConsumeQueueStore(root, 7 * CQ_STORE_UNIT_SIZE, columnar_min_records=0 if columnar else 1 << 30)
    written = [store.dispatch_batch(batch) for batch in batches]
    maxima = [(q.topic, q.queue_id, q.max_offset_in_queue, q.max_physic_offset) for q in store.queues()]
    stamp = store.logics_msg_timestamp
    store.shutdown()
    files = {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
    files["summary"] = repr((written, maxima, stamp)).encode()
    return files


@settings(max_examples=150, deadline=None)
@given(RECORDS, st.integers(1, 80), st.integers(0, 40))
def test_columnar_dispatch_writes_the_same_files(tmp_path_factory: pytest.TempPathFactory,
                                                 records: list[tuple[tuple[str, int], int, int, int]],
                                                 chunk: int, again: int) -> None:
    requests = requests_of(records)
    batches = [requests[i:i + chunk] for i in range(0, len(requests), chunk)]
    batches.append(requests[again:again + chunk])  # a re-dispatch of some of them
    root = tmp_path_factory.mktemp("cq")
    assert build(root / "columns", batches, columnar=True) == build(root / "records", batches, columnar=False)


@settings(max_examples=100, deadline=None)
@given(RECORDS)
def test_arrivals_from_the_queue_grouping(records: list[tuple[tuple[str, int], int, int, int]]) -> None:
    """The arrival maxima taken from the ConsumeQueue grouping equal the per-record rule."""
    requests = requests_of(records)
    while len(requests) < COLUMNAR_MIN_RECORDS:  # smaller chunks take the per-record rule itself
        requests = requests + requests
    skipped = (TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE)
    expected = {(r.topic, r.queue_id): r.queue_offset + 1 for r in requests if r.sys_flag & 0xC not in skipped}
    got = _arrivals(DispatchColumns(requests))
    assert list(got.items()) == list(expected.items())


def test_columnar_dispatch_packs_units_as_rocketmq(tmp_path: Path) -> None:
    """A chunk across a file roll: 20-byte big-endian units, negative tags codes included."""
    requests = [DispatchRequest(True, 100, "T", 0, 100 * i, i, -i, 5, None, None, 0) for i in range(40)]
    store = ConsumeQueueStore(tmp_path, 30 * CQ_STORE_UNIT_SIZE, columnar_min_records=0)
    assert store.dispatch_batch(requests) == 40
    queue = store.find_or_create("T", 0)
    assert queue.get_units(0, 100) == [(100 * i, 100, -i, i) for i in range(40)]
    assert len(queue.mapped_file_queue.files) == 2 and queue.max_physic_offset == 4_000
    store.shutdown()
