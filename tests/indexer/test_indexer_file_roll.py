"""The indexer crosses every commitlog file boundary (issue 15): at a BLANK end of file, whether it
is caught up and waits at the BLANK or lags and gets a chunk of records ending at it, and across a
commitlog file that is BLANK from its first byte. Real commitlog and indexer processes, 1 MiB
commitlog files and 10 KB messages, so about 100 records fill a file."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from mqstore.v1 import commitlog_pb2, common_pb2
from services.store.formats.record import BLANK_MAGIC_CODE, encode_blank
from tests.commitlog.commitlog_process import CommitLogProcess, StartCommitLog, stop_cleanly
from tests.indexer.indexer_process import IndexerProcess, start_indexer
from tests.indexer.test_indexer_crash import all_units

MIB = 1024 * 1024
FILE_SIZE = 1 * MIB
BODY = 10_000
ENV = {
    "MQSTORE_MAPPED_FILE_SIZE_COMMIT_LOG": str(FILE_SIZE),
    "MQSTORE_MAPPED_FILE_SIZE_CONSUME_QUEUE": str(20 * 64),  # a CQ file every 64 units
    "MQSTORE_MAX_HASH_SLOT_NUM": "64",
    "MQSTORE_MAX_INDEX_NUM": "400",
}
TOPIC = "RollT"
QUEUES = 2
STALL_S = 10.0  # an indexer that does not move for this long is stuck


class Indexers:
    """start_indexer that stops every indexer still running at teardown; ``source`` is where they read
    records (MQSTORE_INDEXER_REPUT_SOURCE: the commitlog's files, or its byte-carrying Tail)."""

    def __init__(self, source: str = "auto") -> None:
        self.started: list[IndexerProcess] = []
        self.source = source

    def __call__(self, store: Path, commitlog: CommitLogProcess) -> IndexerProcess:
        indexer = start_indexer(store, commitlog.address, {**ENV, "MQSTORE_INDEXER_REPUT_SOURCE": self.source})
        self.started.append(indexer)
        return indexer

    def stop_all(self) -> None:
        for indexer in self.started:
            if indexer.running:
                assert indexer.stop() == 0, indexer.logs()


@pytest.fixture(params=["files", "tail"])
def indexers(request: pytest.FixtureRequest) -> Iterator[Indexers]:
    started = Indexers(request.param)
    yield started
    started.stop_all()


def message(i: int) -> common_pb2.Message:
    return common_pb2.Message(topic=TOPIC, queue_id=i % QUEUES, body=bytes([65 + i % 26]) * BODY,
                              properties={"KEYS": f"roll-{i}"})


def append_batches(commitlog: CommitLogProcess, first: int, count: int,
                   batch: int = 20) -> list[commitlog_pb2.AppendResult]:
    results: list[commitlog_pb2.AppendResult] = []
    for start in range(first, first + count, batch):
        messages = [message(i) for i in range(start, min(start + batch, first + count))]
        results += commitlog.stub.AppendBatch(commitlog_pb2.AppendBatchRequest(messages=messages), timeout=10).results
    return results


def end_of(result: commitlog_pb2.AppendResult) -> int:
    return int(result.commitlog_offset + result.wrote_bytes)


def wait_dispatched(indexer: IndexerProcess, offset: int) -> None:
    """Until the reput offset reaches ``offset``; fails, with the indexer's log, if it stalls."""
    deadline = time.monotonic() + STALL_S
    while (status := indexer.status()).reput_offset < offset:
        if time.monotonic() > deadline:
            pytest.fail(f"the indexer is stuck at reput offset {status.reput_offset} < {offset}:\n"
                        f"{indexer.logs()[-4000:]}")
        time.sleep(0.002)


def assert_every_record_has_its_unit(indexer: IndexerProcess, results: Sequence[commitlog_pb2.AppendResult]) -> None:
    for queue_id in range(QUEUES):
        expected = [(r.queue_offset, r.commitlog_offset, r.wrote_bytes) for r in results
                    if r.topic == TOPIC and r.queue_id == queue_id]
        got = [(u.queue_offset, u.commitlog_offset, u.size) for u in all_units(indexer, TOPIC, queue_id)]
        assert len(got) == len(expected), f"queue {queue_id}: {len(got)} units for {len(expected)} records"
        assert got == expected


def resyncs(indexer: IndexerProcess) -> list[str]:
    return [r["msg"] for r in indexer.log_records() if "resynchronised" in r.get("msg", "")
            or "stalled" in r.get("msg", "")]


def files_of(results: Sequence[commitlog_pb2.AppendResult]) -> set[int]:
    return {r.commitlog_offset // FILE_SIZE for r in results}


# -- a BLANK end of file ---------------------------------------------------------------------------
def test_a_caught_up_indexer_crosses_every_file_roll(start_commitlog: StartCommitLog, indexers: Indexers,
                                                     tmp_path: Path) -> None:
    """Each send waits for the indexer to dispatch the one before, so at every roll the indexer waits
    at the end of the log exactly where the BLANK is then written."""
    commitlog = start_commitlog(tmp_path / "broker", ENV)
    indexer = indexers(tmp_path / "indexer", commitlog)
    results: list[commitlog_pb2.AppendResult] = []
    for i in range(300):
        if results:
            wait_dispatched(indexer, end_of(results[-1]))
        results.append(commitlog.stub.Append(commitlog_pb2.AppendRequest(message=message(i)), timeout=10))
    assert files_of(results) == {0, 1, 2}
    wait_dispatched(indexer, end_of(results[-1]))
    assert_every_record_has_its_unit(indexer, results)
    assert resyncs(indexer) == []


def test_a_lagging_indexer_crosses_every_file_roll(start_commitlog: StartCommitLog, indexers: Indexers,
                                                   tmp_path: Path) -> None:
    """Everything is written before the indexer starts: its chunks carry records up to each BLANK."""
    commitlog = start_commitlog(tmp_path / "broker", ENV)
    results = append_batches(commitlog, 0, 300)
    assert files_of(results) == {0, 1, 2}
    indexer = indexers(tmp_path / "indexer", commitlog)
    wait_dispatched(indexer, end_of(results[-1]))
    assert_every_record_has_its_unit(indexer, results)
    assert resyncs(indexer) == []


def test_tail_announces_the_blank_it_skips(start_commitlog: StartCommitLog, tmp_path: Path) -> None:
    """The protocol itself: from a BLANK, the first chunk says so (no records, start_offset at the
    BLANK, next_offset at the next file); a chunk of records that reaches a BLANK ends there and its
    next_offset is the next file's start."""
    commitlog = start_commitlog(tmp_path / "broker", ENV)
    results = append_batches(commitlog, 0, 150)
    last_in_first_file = max((r for r in results if r.commitlog_offset < FILE_SIZE), key=end_of)
    blank = end_of(last_in_first_file)
    assert blank < FILE_SIZE <= results[-1].commitlog_offset
    raw = (tmp_path / "broker" / "commitlog" / f"{0:020d}").read_bytes()
    assert (int.from_bytes(raw[blank:blank + 4]), int.from_bytes(raw[blank + 4:blank + 8])) == \
        (FILE_SIZE - blank, BLANK_MAGIC_CODE)

    stream = commitlog.stub.Tail(commitlog_pb2.TailRequest(from_offset=blank, poll_wait_ms=100), timeout=10)
    skip, first = next(stream), next(stream)
    stream.cancel()
    assert (skip.start_offset, skip.next_offset, skip.record_count, skip.data) == (blank, FILE_SIZE, 0, b"")
    assert first.start_offset == FILE_SIZE and first.record_count > 0

    stream = commitlog.stub.Tail(commitlog_pb2.TailRequest(
        from_offset=last_in_first_file.commitlog_offset, poll_wait_ms=100), timeout=10)
    chunk = next(stream)
    stream.cancel()
    assert (chunk.start_offset, chunk.record_count, len(chunk.data), chunk.next_offset) == \
        (last_in_first_file.commitlog_offset, 1, last_in_first_file.wrote_bytes, FILE_SIZE)


# -- a commitlog file that is BLANK from its first byte ---------------------------------------------
def blank_out_the_rest(commitlog_dir: Path, end: int) -> None:
    """Make ``end`` (inside the first file) the last record's end, followed by a BLANK to the end of
    the file, a second file BLANK from its first byte, and an empty third file: the log continues in
    the third file, as a real RocketMQ log can."""
    first = commitlog_dir / f"{0:020d}"
    with open(first, "r+b") as f:
        f.seek(end)
        f.write(encode_blank(FILE_SIZE - end))
    (commitlog_dir / f"{FILE_SIZE:020d}").write_bytes(encode_blank(FILE_SIZE).ljust(FILE_SIZE, b"\0"))
    (commitlog_dir / f"{2 * FILE_SIZE:020d}").write_bytes(bytes(FILE_SIZE))


@pytest.mark.parametrize("queue_offsets", ["snapshot", "rebuilt"])
def test_a_wholly_blank_file_in_the_middle_of_the_log(start_commitlog: StartCommitLog, indexers: Indexers,
                                                      tmp_path: Path, queue_offsets: str) -> None:
    broker = tmp_path / "broker"
    commitlog = start_commitlog(broker, ENV)
    before = append_batches(commitlog, 0, 20)
    indexer = indexers(tmp_path / "indexer", commitlog)
    wait_dispatched(indexer, end_of(before[-1]))
    assert indexer.stop() == 0
    stop_cleanly(commitlog)

    blank_out_the_rest(broker / "commitlog", end_of(before[-1]))
    if queue_offsets == "rebuilt":  # no snapshot: the queue offsets are rebuilt from the first file
        for name in ("queue_offsets.json", "queue_offsets.json.bak"):
            (broker / "config" / name).unlink(missing_ok=True)

    # Recovery walks through the BLANK file; the queue offsets continue after the 20 records.
    commitlog = start_commitlog(broker, ENV)
    info = commitlog.stub.GetStoreInfo(commitlog_pb2.GetStoreInfoRequest())
    assert info.recovered_offset == info.max_offset == 2 * FILE_SIZE
    # A Tail may start on the BLANK file itself (a reconnection there): it is told of the skip.
    stream = commitlog.stub.Tail(commitlog_pb2.TailRequest(from_offset=FILE_SIZE, poll_wait_ms=100), timeout=10)
    skip = next(stream)
    stream.cancel()
    assert (skip.start_offset, skip.next_offset, skip.record_count) == (FILE_SIZE, 2 * FILE_SIZE, 0)
    # The indexer waits at the first BLANK, caught up, when the next records arrive.
    indexer = indexers(tmp_path / "indexer", commitlog)
    wait_dispatched(indexer, 2 * FILE_SIZE)
    after = append_batches(commitlog, 20, 20)
    assert after[0].commitlog_offset == 2 * FILE_SIZE
    assert [r.queue_offset for r in after if r.queue_id == 0] == list(range(10, 20))
    wait_dispatched(indexer, end_of(after[-1]))
    assert_every_record_has_its_unit(indexer, before + after)
    assert resyncs(indexer) == []

    # A new indexer reads it all lagging: a chunk up to the first BLANK, then the BLANK file.
    fresh = indexers(tmp_path / "fresh-indexer", commitlog)
    wait_dispatched(fresh, end_of(after[-1]))
    assert_every_record_has_its_unit(fresh, before + after)
    assert resyncs(fresh) == []

    # A crash recovery walks through it too.
    commitlog.kill9()
    commitlog = start_commitlog(broker, ENV, port=commitlog.port)
    info = commitlog.stub.GetStoreInfo(commitlog_pb2.GetStoreInfoRequest())
    assert info.max_offset == end_of(after[-1])
    more = append_batches(commitlog, 40, 2)
    assert [r.queue_offset for r in more] == [20, 20]
    wait_dispatched(indexer, end_of(more[-1]))
    assert_every_record_has_its_unit(indexer, before + after + more)
