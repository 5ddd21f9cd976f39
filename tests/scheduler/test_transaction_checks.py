"""The transaction checker against real commitlog, indexer and scheduler processes: an end applied once
whatever its caller does (cancelled EndHalf calls while a check producer answers COMMIT), a commit
record left without its op record (a crash between the two) completed on restart without a second
commit, halves older than fileReservedTime discarded on the first round (4.9.8's needSkip), and the
first round after one check interval (TransactionalMessageCheckService waits before it checks), and a
half no watcher may be asked about put back unchecked, its count kept, until one is."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from gateway.transaction_relay import half_message
from mqstore.v1 import commitlog_pb2, common_pb2, scheduler_pb2, scheduler_pb2_grpc, transaction_pb2
from services.scheduler.peers import message_to_proto
from services.store.formats.message import MessageRecord
from services.store.formats.message_id import decode_message_id
from services.store.formats.record import decode_record
from services.store.rules import transaction_records as tx
from tests.scheduler.conftest import Shard
from tests.scheduler.scheduler_process import SchedulerProcess, queue_records, start_scheduler

INTERVAL_MS = 300
CHECKS_ENV = {"MQSTORE_TRANSACTION_TIMEOUT_MS": "200", "MQSTORE_TRANSACTION_CHECK_INTERVAL_MS": str(INTERVAL_MS)}


@pytest.fixture
def fresh(shard: Shard, tmp_path: Path) -> Iterator[Path]:
    """A scheduler store that starts checking where the half queue ends now (the tests share one shard)."""
    store = tmp_path / "scheduler"
    halves = len(queue_records(shard.commitlog, shard.indexer, tx.HALF_TOPIC, 0))
    ops = len(queue_records(shard.commitlog, shard.indexer, tx.OP_TOPIC, 0))
    (store / "config").mkdir(parents=True)
    tx.write_check_offsets(store / "config" / tx.CHECK_OFFSETS_FILE, halves, ops)
    yield store


def _scheduler(shard: Shard, store: Path, env: dict[str, str] | None = None) -> SchedulerProcess:
    return start_scheduler(store, shard.root / "broker", shard.root / "indexer", shard.commitlog.address,
                           shard.indexer.address, {**shard.env, **CHECKS_ENV, **(env or {})})


def _halves(shard: Shard, topic: str, group: str, count: int,
            born_timestamp: int = 0) -> list[tuple[commitlog_pb2.AppendResult, str]]:
    """``count`` halves of ``topic`` (queue 0), each with its UNIQ_KEY, dispatched by the indexer."""
    results = []
    for i in range(count):
        key = f"{random.getrandbits(128):032X}"
        message = common_pb2.Message(topic=topic, body=f"{topic}-{i}".encode(), born_timestamp=born_timestamp,
                                     born_host="10.0.0.9:4000",
                                     properties={"TRAN_MSG": "true", "PGROUP": group, "UNIQ_KEY": key})
        request = commitlog_pb2.AppendRequest(message=half_message(message, 0), transaction_flow=True)
        results.append((shard.commitlog.stub.Append(request, timeout=10), key))
    info = shard.commitlog.stub.GetStoreInfo(commitlog_pb2.GetStoreInfoRequest(), timeout=5)
    shard.indexer.wait_caught_up(info.max_offset)
    return results


def _end(stub: scheduler_pb2_grpc.TransactionServiceStub, group: str, offset_msg_id: str, timeout: float,
         resolution: int = transaction_pb2.COMMIT) -> scheduler_pb2.EndHalfResult:
    return stub.EndHalf(scheduler_pb2.EndHalfRequest(
        request=transaction_pb2.EndTransactionRequest(producer_group=group, offset_msg_id=offset_msg_id,
                                                      resolution=resolution),
        commitlog_offset=decode_message_id(offset_msg_id)[1]), timeout=timeout)


class Checks:
    """A watcher of one producer group's checks (the gateway's side); ``answer`` ends each check."""

    def __init__(self, address: str, group: str, answer: int | None = transaction_pb2.COMMIT,
                 topics: tuple[str, ...] = ("*",)) -> None:
        self.channel = grpc.insecure_channel(address)
        self.stub = scheduler_pb2_grpc.TransactionServiceStub(self.channel)
        self.group = group
        self.answer = answer
        self.received: list[tuple[float, transaction_pb2.TransactionCheck]] = []
        self.failed: list[str] = []
        self._call = self.stub.WatchChecks(scheduler_pb2.WatchChecksRequest(producer_group=group, topics=topics))
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for check in self._call:
                self.received.append((time.monotonic(), check))
                if self.answer is not None:
                    try:
                        _end(self.stub, self.group, check.offset_msg_id, 10, self.answer)
                    except grpc.RpcError as exc:
                        self.failed.append(f"{exc.code().name}: {exc.details()}")
        except grpc.RpcError:
            pass

    def close(self) -> None:
        self._call.cancel()
        self._thread.join(5)
        self.channel.close()


def _real_keys(shard: Shard, topic: str) -> Counter[str]:
    return Counter(record.properties["UNIQ_KEY"] for _, record in queue_records(shard.commitlog, shard.indexer,
                                                                                 topic, 0))


def _wait(condition: Callable[[], object], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)


def test_a_cancelled_end_is_applied_once_while_a_check_commits(shard: Shard, fresh: Path) -> None:
    scheduler = _scheduler(shard, fresh)
    checks = Checks(scheduler.address, "cancelledEnds")
    try:
        halves = _halves(shard, "TxCancelled", "cancelledEnds", 120)
        time.sleep(0.25)  # past the timeout: every half is due at the next round
        stub = scheduler_pb2_grpc.TransactionServiceStub(scheduler.channel)
        cancelled = 0
        for i, (half, _) in enumerate(halves):
            try:
                _end(stub, "cancelledEnds", half.msg_id, timeout=(2 + i % 39) / 1000)
            except grpc.RpcError as exc:
                assert exc.code() in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED), exc
                cancelled += 1
        _wait(lambda: len(_real_keys(shard, "TxCancelled")) >= len(halves), 30)
        time.sleep(4 * INTERVAL_MS / 1000)  # more rounds: nothing is committed again
        found = _real_keys(shard, "TxCancelled")
        assert checks.failed == []
        assert len(found) == len(halves), f"{len(found)} of {len(halves)} committed ({cancelled} ends cancelled)"
        twice = {key: n for key, n in found.items() if n > 1}
        assert not twice, f"{len(twice)} of {len(halves)} committed twice ({cancelled} ends cancelled)"
    finally:
        checks.close()
        assert scheduler.stop() == 0, scheduler.logs()


def test_a_commit_without_its_op_is_completed_on_restart_not_committed_again(shard: Shard, fresh: Path) -> None:
    first = _scheduler(shard, fresh)
    assert first.stop() == 0, first.logs()  # its offsets file starts at these halves
    ((half, _),) = _halves(shard, "TxCrashed", "crashedEnd", 1)
    # What a crash between the commit record and the op record leaves: the commit alone.
    data = shard.commitlog.stub.Read(commitlog_pb2.ReadRequest(offset=half.commitlog_offset, size=half.wrote_bytes),
                                     timeout=5).data
    commit = tx.commit_of(decode_record(data))
    shard.commitlog.stub.Append(commitlog_pb2.AppendRequest(message=message_to_proto(commit), transaction_flow=True),
                                timeout=10)
    time.sleep(0.3)  # past the timeout
    second = _scheduler(shard, fresh)
    checks = Checks(second.address, "crashedEnd")
    try:
        time.sleep(5 * INTERVAL_MS / 1000)
        assert [c.transaction_id for _, c in checks.received] == [], "a committed half is never checked"
        stub = scheduler_pb2_grpc.TransactionServiceStub(second.channel)
        assert not _end(stub, "crashedEnd", half.msg_id, 10).applied
        assert list(_real_keys(shard, "TxCrashed").values()) == [1]
        ops = [r for _, r in queue_records(shard.commitlog, shard.indexer, tx.OP_TOPIC, 0)
               if tx.op_half_offset(r) == half.queue_offset]
        assert len(ops) == 1, "the op record derived from the commit record"
    finally:
        checks.close()
        assert second.stop() == 0, second.logs()


def test_a_half_older_than_the_file_reserved_time_is_discarded_in_the_first_round(shard: Shard, fresh: Path) -> None:
    born = int(time.time() * 1000) - 73 * 3600 * 1000  # fileReservedTime: 72 h
    ((_, key),) = _halves(shard, "TxExpired", "expiredHalf", 1, born_timestamp=born)
    scheduler = _scheduler(shard, fresh)
    checks = Checks(scheduler.address, "expiredHalf", answer=None)

    def discarded() -> list[MessageRecord]:
        return [r for _, r in queue_records(shard.commitlog, shard.indexer, tx.CHECK_MAX_TIME_TOPIC, 0)
                if r.properties.get("UNIQ_KEY") == key]

    try:
        _wait(discarded, 10)
        time.sleep(3 * INTERVAL_MS / 1000)
        copies = [r for _, r in queue_records(shard.commitlog, shard.indexer, tx.HALF_TOPIC, 0)
                  if r.properties["UNIQ_KEY"] == key]
        assert checks.received == [], "never checked"
        assert len(copies) == 1, "never put back"
        (moved,) = discarded()
        assert tx.PROPERTY_TRANSACTION_CHECK_TIMES not in moved.properties
    finally:
        checks.close()
        assert scheduler.stop() == 0, scheduler.logs()


def test_the_first_round_comes_after_one_check_interval(shard: Shard, fresh: Path) -> None:
    _halves(shard, "TxFirstRound", "firstRound", 1)
    time.sleep(0.3)  # due at once
    interval_ms = 2000
    started = time.monotonic()
    scheduler = _scheduler(shard, fresh, {"MQSTORE_TRANSACTION_CHECK_INTERVAL_MS": str(interval_ms)})
    checks = Checks(scheduler.address, "firstRound")
    try:
        _wait(lambda: checks.received, 15)
        assert checks.received, "checked"
        waited = checks.received[0][0] - started
        assert waited >= interval_ms / 1000, f"first check {waited:.2f}s after the start, before one interval"
    finally:
        checks.close()
        assert scheduler.stop() == 0, scheduler.logs()


def test_a_half_no_watcher_names_waits_unchecked_until_one_does(shard: Shard, fresh: Path) -> None:
    ((_, key),) = _halves(shard, "TxNamed", "namedTopics", 1)
    scheduler = _scheduler(shard, fresh, {"MQSTORE_TRANSACTION_CHECK_MAX": "2"})
    others = Checks(scheduler.address, "namedTopics", answer=None, topics=("TxOther", "Orders-*"))
    try:
        time.sleep(5 * INTERVAL_MS / 1000)  # rounds enough to discard it, were its checks counted
        assert others.received == [], "a watcher that does not name the topic is never handed its check"
        copies = [r for _, r in queue_records(shard.commitlog, shard.indexer, tx.HALF_TOPIC, 0)
                  if r.properties["UNIQ_KEY"] == key]
        assert len(copies) > 2, "put back each round (it does not hold the half queue)"
        assert all(tx.PROPERTY_TRANSACTION_CHECK_TIMES not in r.properties for r in copies), "no check spent"
        named = Checks(scheduler.address, "namedTopics", topics=("Tx*",))
        try:
            _wait(lambda: named.received, 10)
            assert [c.check_times for _, c in named.received] == [1]
            _wait(lambda: _real_keys(shard, "TxNamed"), 10)
            assert list(_real_keys(shard, "TxNamed").values()) == [1]
        finally:
            named.close()
        assert others.received == []
    finally:
        others.close()
        assert scheduler.stop() == 0, scheduler.logs()
