"""The engine's invariant assertions fire, naming the invariant, when the state they guard is broken
(each test breaks it on purpose); nothing broken is written."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from services.commitlog import message_store
from services.commitlog.message_encoder import MessageEncoder
from services.commitlog.message_store import MessageStore
from services.commitlog.put_result import PutMessageResult
from services.commitlog.recovery import RecoveryResult
from services.indexer.indexer_store import IndexerStore
from services.store.config import MessageStoreConfig, load_config
from services.store.formats.consume_queue import CQ_STORE_UNIT_SIZE, UNIT, ConsumeQueue
from services.store.formats.mapped_file import MappedFile
from services.store.formats.message import Message
from services.store.formats.record import DispatchRequest
from services.store.invariants import InvariantError
from tests.geometry import SMALL

FILE_SIZE = 64 * 1024


@pytest.fixture
def store(tmp_path: Path) -> Iterator[MessageStore]:
    store = MessageStore(load_config(environ={}, mapped_file_size_commit_log=FILE_SIZE, max_message_size=16 * 1024),
                         tmp_path)
    store.start()
    yield store
    store.shutdown()


def test_put_loop_refuses_a_record_below_the_log_end(store: MessageStore, monkeypatch: pytest.MonkeyPatch) -> None:
    log = store.commit_log
    while log.mfq.max_wrote_offset < FILE_SIZE - 4096:
        store.put_message(Message("T", 0, b"x" * 1000))
    before = log.mfq.files[0].read(0, 64)

    def roll_back(mapped: MappedFile, store_timestamp: int) -> MappedFile:
        return log.mfq.files[0]  # a roll that lands on the start of the log instead of the next file

    monkeypatch.setattr(log, "_roll", roll_back)
    with pytest.raises(InvariantError, match="invariant broken: commitlog offsets increase: a record at offset 0"):
        store.put_messages([Message("T", 0, b"y" * 1000)] * 8)
    assert log.mfq.files[0].read(0, 64) == before


def test_put_loop_refuses_a_record_larger_than_a_file(store: MessageStore) -> None:
    log = store.commit_log
    store.put_message(Message("T", 0, b"x"))
    # An encoder that believes in larger files lets through a record no file can hold.
    log.encoder = MessageEncoder(log.config.store_host, 4 * FILE_SIZE, 4 * FILE_SIZE, 18, 86400 * 3)
    with pytest.raises(InvariantError, match="a record never crosses a file end"):
        store.put_message(Message("T", 0, b"z" * (FILE_SIZE + 100)))


def test_put_loop_refuses_a_queue_table_gone_negative(store: MessageStore) -> None:
    store.commit_log.queue_table[("T", 1)] = -1
    with pytest.raises(InvariantError, match="the queue offset assigned is the queue table's next: T queue 1"):
        store.put_message(Message("T", 1, b"x"))


def _records(count: int, start_offset: int = 0, size: int = 100) -> list[DispatchRequest]:
    return [DispatchRequest(True, size, "T", 0, start_offset + size * i, i, store_timestamp=1_800_000_000_000 + i)
            for i in range(count)]


@pytest.fixture
def indexer(tmp_path: Path) -> Iterator[IndexerStore]:
    store = IndexerStore(SMALL.config(flush_interval_consume_queue=3_600_000), tmp_path / "indexer")
    store.start()
    yield store
    store.shutdown()


@pytest.mark.parametrize(("chunk", "next_offset", "match"), [
    (_records(3, start_offset=400), 700, "first record is at offset 400, below the reput offset 1000"),
    (_records(2, start_offset=1000) + _records(1, start_offset=1150), 1250,
     "record at offset 1150 starts before the end 1200"),
    (_records(3, start_offset=1000), 1200, "next reput offset 1200 is below the end 1300"),
])
def test_dispatch_refuses_records_out_of_commitlog_order(indexer: IndexerStore, chunk: list[DispatchRequest],
                                                         next_offset: int, match: str) -> None:
    indexer.dispatch(_records(10), 1000)
    with pytest.raises(InvariantError, match=f"dispatched commitlog offsets increase: .*{match}"):
        indexer.dispatch(chunk, next_offset)
    assert indexer.reput_offset == 1000


def test_consume_queue_units_go_only_at_their_queue_offset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    queue = ConsumeQueue(tmp_path, "T", 0, CQ_STORE_UNIT_SIZE * 4)
    file_for = queue._file_for

    def misplaced(queue_offset: int) -> MappedFile:
        mapped = file_for(queue_offset)
        if queue_offset == 4:  # the second file, but written past its first unit's place
            mapped.wrote_position = CQ_STORE_UNIT_SIZE
        return mapped

    monkeypatch.setattr(queue, "_file_for", misplaced)
    units = b"".join(UNIT.pack(100 * i, 100, 0) for i in range(6))
    with pytest.raises(InvariantError, match="ConsumeQueue units are written at their queue offset: T/0: the unit "
                                             "of queue offset 4 would go to byte 100"):
        queue.put_packed(units, 0, 6, 0, 600, [0] * 6)
    queue.shutdown()


def _cut_at(monkeypatch: pytest.MonkeyPatch, cut: Callable[[RecoveryResult], RecoveryResult]) -> None:
    """Recovery finds what ``cut`` makes of the real walk's result."""
    walk = message_store.recover_normally

    def recover(*args: Any, **kwargs: Any) -> RecoveryResult:
        return cut(walk(*args, **kwargs))

    monkeypatch.setattr(message_store, "recover_normally", recover)


def _stopped_store(root: Path, count: int = 5) -> tuple[MessageStoreConfig, list[PutMessageResult]]:
    config = load_config(environ={}, mapped_file_size_commit_log=FILE_SIZE, max_message_size=16 * 1024)
    store = MessageStore(config, root)
    store.start()
    results = store.put_messages([Message("T", 0, b"x" * 100)] * count)
    store.shutdown()
    return config, results


def test_recovery_refuses_a_cut_past_the_mapped_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config, _ = _stopped_store(tmp_path)
    outside = FILE_SIZE + 200
    _cut_at(monkeypatch, lambda found: replace(found, end=outside))
    with pytest.raises(InvariantError, match=f"recovery cuts within the mapped files: the cut at offset {outside} "
                                             f"is outside the files' \\[0, {FILE_SIZE}\\]"):
        MessageStore(config, tmp_path).start()


def test_recovery_refuses_a_cut_inside_a_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config, results = _stopped_store(tmp_path)
    inside = results[-1].commitlog_offset + 10
    _cut_at(monkeypatch, lambda found: replace(found, end=inside))
    monkeypatch.setattr(MessageStore, "_check_missing_log", lambda self, recorded_end: True)  # the loss accepted
    with pytest.raises(InvariantError, match=f"recovery cuts at a record boundary: the cut at offset {inside}"):
        MessageStore(config, tmp_path).start()


def test_recovery_refuses_a_cut_below_the_durable_end_the_missing_log_check_let_through(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config, results = _stopped_store(tmp_path)
    last = results[-1]
    # The log found one record shorter (a boundary) than the snapshot of the clean stop says was durable.
    _cut_at(monkeypatch, lambda found: replace(found, end=last.commitlog_offset,
                                               last_record_offset=results[-2].commitlog_offset))
    monkeypatch.setattr(MessageStore, "_check_missing_log", lambda self, recorded_end: False)
    with pytest.raises(InvariantError, match="recovery never cuts below the durable end without the refusal path: "
                                             f"the cut at offset {last.commitlog_offset} is below "
                                             f"{last.commitlog_offset + last.wrote_bytes}"):
        MessageStore(config, tmp_path).start()
