"""Transactions against a real system (``mqstore up``, small geometry, short check settings):
RocketMQ 4.9.8's half / commit / op records field by field, commit, rollback, a second end, check-back
(UNKNOWN twice then COMMIT), a half never answered discarded after transactionCheckMax checks, and
bad requests refused with what to fix."""

from __future__ import annotations

import json
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from mqstore.client import TransactionCheck, TransactionProducer, TransactionState
from mqstore.v1 import common_pb2, gateway_pb2, query_pb2, query_pb2_grpc, transaction_pb2
from tests.commitlog.commitlog_process import commitlog_env, mqstore_command
from tests.gateway.system_process import UpProcess, start_up
from tests.geometry import SMALL

CHECK_MAX = 3
ENV = {**SMALL.env(), "MQSTORE_TRANSACTION_TIMEOUT_MS": "1000", "MQSTORE_TRANSACTION_CHECK_INTERVAL_MS": "500",
       "MQSTORE_TRANSACTION_CHECK_MAX": str(CHECK_MAX)}
HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
OP_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
CHECK_MAX_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"
GROUP = "txProducers"


def up_with_checks(store: Path) -> UpProcess:
    return start_up(store, ENV)


@pytest.fixture(scope="module")
def tx_up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpProcess]:
    started = up_with_checks(tmp_path_factory.mktemp("tx") / "store")
    try:
        yield started
        assert started.stop() == 0, started.logs()[-5000:]
    finally:
        started.kill_all()


def _half(up: UpProcess, topic: str, group: str = GROUP, body: bytes = b"order-1",
          **properties: str) -> gateway_pb2.SendResult:
    message = common_pb2.Message(topic=topic, body=body, flag=3, properties={
        "TRAN_MSG": "true", "PGROUP": group, "TAGS": "TagA", "KEYS": "k1", **properties})
    return up.stub.Send(gateway_pb2.SendRequest(message=message), timeout=10)


def _end(up: UpProcess, sent: gateway_pb2.SendResult, resolution: int,
         group: str = GROUP) -> gateway_pb2.EndTransactionResult:
    return up.stub.EndTransaction(transaction_pb2.EndTransactionRequest(
        producer_group=group, transaction_id=sent.msg_id, offset_msg_id=sent.offset_msg_id, resolution=resolution),
        timeout=10)


def _view(up: UpProcess, offset_msg_id: str) -> query_pb2.StoredMessage:
    return up.stub.GetMessage(query_pb2.ViewMessageRequest(msg_id=offset_msg_id), timeout=10).message


def _system_queue(up: UpProcess, topic: str) -> list[query_pb2.StoredMessage]:
    """Every record of a system topic's queue 0 (read from the query service: the gateway serves users)."""
    with grpc.insecure_channel(up.query) as channel:
        stub = query_pb2_grpc.QueryServiceStub(channel)
        try:
            answer = stub.PullMessage(query_pb2.PullMessageRequest(topic=topic, queue_id=0, queue_offset=0,
                                                                   max_messages=256), timeout=10)
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.NOT_FOUND:
                raise
            return []
        return list(answer.messages)


def _real_queue(up: UpProcess, topic: str) -> list[query_pb2.StoredMessage]:
    route = up.stub.GetRoute(gateway_pb2.GetRouteRequest(topic=topic), timeout=10)
    found: list[query_pb2.StoredMessage] = []
    for queue in route.queues:
        answer = up.stub.Pull(query_pb2.PullMessageRequest(topic=topic, queue_id=queue.queue_id,
                                                           queue_offset=0, max_messages=64), timeout=10)
        found.extend(answer.messages)
    return found


def _ops_for(up: UpProcess, half_queue_offset: int, wait: bool = True) -> list[query_pb2.StoredMessage]:
    deadline = time.monotonic() + 10
    while True:
        ops = [m for m in _system_queue(up, OP_TOPIC) if m.body == str(half_queue_offset).encode()]
        if ops or not wait or time.monotonic() > deadline:
            return ops
        time.sleep(0.1)


def test_half_commit_and_op_records_match_rocketmq_4_9_8(tx_up: UpProcess) -> None:
    sent = _half(tx_up, "TxCommit", color="red")
    assert sent.topic == HALF_TOPIC and sent.queue_id == 0
    half = _view(tx_up, sent.offset_msg_id)
    props = dict(half.properties)
    # parseHalfMessageInner: REAL_TOPIC / REAL_QID added, transaction type reset to NOT_TYPE.
    assert (half.topic, half.queue_id) == (HALF_TOPIC, 0)
    assert props["REAL_TOPIC"] == "TxCommit" and props["REAL_QID"].isdigit()
    assert props["TRAN_MSG"] == "true" and props["PGROUP"] == GROUP and props["UNIQ_KEY"] == sent.msg_id
    assert half.sys_flag & 0xC == 0 and half.prepared_transaction_offset == 0
    assert _real_queue(tx_up, "TxCommit") == [], "a half is invisible to consumers"

    ended = _end(tx_up, sent, transaction_pb2.COMMIT)
    assert ended.applied and ended.committed.topic == "TxCommit"
    assert ended.committed.msg_id == sent.msg_id
    committed = _view(tx_up, ended.committed.offset_msg_id)
    # endMessageTransaction: real topic and queue, COMMIT type, prepared offset = the half's commitlog offset,
    # the half's whole properties string (REAL_TOPIC, REAL_QID and TRAN_MSG are cleared from the map only).
    assert (committed.topic, committed.queue_id) == ("TxCommit", int(props["REAL_QID"]))
    assert committed.sys_flag & 0xC == 0x8
    assert committed.prepared_transaction_offset == half.commitlog_offset
    assert dict(committed.properties) == props
    assert (committed.body, committed.flag, committed.born_timestamp, committed.born_host, committed.reconsume_times) \
        == (half.body, half.flag, half.born_timestamp, half.born_host, half.reconsume_times)
    consumed = _real_queue(tx_up, "TxCommit")
    assert [m.body for m in consumed] == [b"order-1"]

    (op,) = _ops_for(tx_up, half.queue_offset)
    # addRemoveTagInTransactionOp: tags "d", body = the half's queue offset, sys_flag 0, queue = the half's.
    assert (op.topic, op.queue_id, op.sys_flag, op.tags) == (OP_TOPIC, 0, 0, "d")
    assert dict(op.properties) == {"TAGS": "d", "WAIT": "true"}
    assert op.prepared_transaction_offset == 0
    assert op.born_host == op.store_host == half.store_host, "the broker writes its op records itself"

    again = _end(tx_up, sent, transaction_pb2.COMMIT)
    assert not again.applied and not again.HasField("committed"), "a second end changes nothing"
    assert not _end(tx_up, sent, transaction_pb2.ROLLBACK).applied
    assert len(_real_queue(tx_up, "TxCommit")) == 1 and len(_ops_for(tx_up, half.queue_offset)) == 1


def test_rollback_writes_only_the_op_record(tx_up: UpProcess) -> None:
    sent = _half(tx_up, "TxRollback")
    half = _view(tx_up, sent.offset_msg_id)
    ended = _end(tx_up, sent, transaction_pb2.ROLLBACK)
    assert ended.applied and not ended.HasField("committed")
    assert len(_ops_for(tx_up, half.queue_offset)) == 1
    assert not _end(tx_up, sent, transaction_pb2.COMMIT).applied
    time.sleep(0.3)
    assert _real_queue_or_empty(tx_up, "TxRollback") == []


def test_unknown_writes_nothing(tx_up: UpProcess) -> None:
    sent = _half(tx_up, "TxUnknown", group="unknownGroup")
    half = _view(tx_up, sent.offset_msg_id)
    assert not _end(tx_up, sent, transaction_pb2.UNKNOWN, group="unknownGroup").applied
    assert _ops_for(tx_up, half.queue_offset, wait=False) == []


def test_check_back_unknown_twice_then_commit(tx_up: UpProcess) -> None:
    checks: list[TransactionCheck] = []
    answered = threading.Event()

    def check(c: TransactionCheck) -> TransactionState:
        checks.append(c)
        if len(checks) <= 2:
            return TransactionState.UNKNOWN
        answered.set()
        return TransactionState.COMMIT

    with TransactionProducer("checkGroup", lambda m, a: TransactionState.UNKNOWN, check,
                             address=tx_up.gateway) as producer:
        result = producer.send("TxCheck", b"checked", keys="order-9")
        assert result.state is TransactionState.UNKNOWN and not result.applied
        assert answered.wait(20), f"checks seen: {checks}"
        deadline = time.monotonic() + 10
        while not _real_queue_or_empty(tx_up, "TxCheck") and time.monotonic() < deadline:
            time.sleep(0.1)
    consumed = _real_queue_or_empty(tx_up, "TxCheck")
    assert [m.body for m in consumed] == [b"checked"]
    assert [c.check_times for c in checks[:3]] == [1, 2, 3]
    assert all(c.transaction_id == result.transaction_id for c in checks)
    assert checks[0].topic == "TxCheck" and checks[0].keys == ("order-9",) and checks[0].body == b"checked"
    # Each check names the half's put-back copy (RocketMQ's putBackHalfMsgQueue), counted up.
    copies = {c.offset_msg_id for c in checks}
    assert len(copies) == len(checks) and result.half.offset_msg_id not in copies
    assert dict(consumed[0].properties)["TRANSACTION_CHECK_TIMES"] == "3"
    time.sleep(1.5)
    assert len(_real_queue_or_empty(tx_up, "TxCheck")) == 1, "committed once"


def test_an_end_whose_caller_gives_up_is_applied_once(tx_up: UpProcess) -> None:
    """EndTransaction with client deadlines of 2-40 ms while a check producer answers COMMIT: the calls
    that end DEADLINE_EXCEEDED may or may not have ended their half, but no message is committed twice."""
    def check(c: TransactionCheck) -> TransactionState:
        return TransactionState.COMMIT

    with TransactionProducer("hastyEnds", check=check, address=tx_up.gateway) as producer:
        halves = [producer.send_half("TxHasty", f"hasty-{i}".encode())[1] for i in range(80)]
        gave_up = 0
        for i, half in enumerate(halves):
            try:
                tx_up.stub.EndTransaction(transaction_pb2.EndTransactionRequest(
                    producer_group="hastyEnds", transaction_id=half.msg_id, offset_msg_id=half.offset_msg_id,
                    resolution=transaction_pb2.COMMIT), timeout=(2 + i % 39) / 1000)
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED, exc
                gave_up += 1
        deadline = time.monotonic() + 20
        while len(_real_queue_or_empty(tx_up, "TxHasty")) < len(halves) and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1.5)  # more check rounds: nothing is committed again
    bodies = sorted(m.body for m in _real_queue_or_empty(tx_up, "TxHasty"))
    assert bodies == sorted(f"hasty-{i}".encode() for i in range(80)), f"{gave_up} of 80 ends gave up"


def _real_queue_or_empty(up: UpProcess, topic: str) -> list[query_pb2.StoredMessage]:
    try:
        return _real_queue(up, topic)
    except grpc.RpcError as exc:
        if exc.code() == grpc.StatusCode.NOT_FOUND:
            return []
        raise


class SilentProducer:
    """A TransactionChecks stream of ``group`` that receives checks and never answers them."""

    def __init__(self, up: UpProcess, group: str, metadata: tuple[tuple[str, str], ...] = ()) -> None:
        self.checks: list[transaction_pb2.TransactionCheck] = []
        self.error: grpc.RpcError | None = None
        self._hold = threading.Event()

        def requests() -> Iterator[transaction_pb2.TransactionCheckStreamRequest]:
            yield transaction_pb2.TransactionCheckStreamRequest(producer_group=group)
            self._hold.wait()

        self._stream = up.stub.TransactionChecks(requests(), metadata=metadata)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for check in self._stream:
                self.checks.append(check)
        except grpc.RpcError as exc:
            self.error = exc

    def close(self) -> None:
        self._hold.set()
        self._stream.cancel()
        self._thread.join(5)


def test_a_half_never_answered_is_discarded_after_the_max_checks(tx_up: UpProcess) -> None:
    silent = SilentProducer(tx_up, "nobodyListens")  # checked (and counted) only while a producer is connected
    try:
        sent = _half(tx_up, "TxNeverAnswered", group="nobodyListens")
        deadline = time.monotonic() + 20
        while True:
            discarded = [m for m in _system_queue(tx_up, CHECK_MAX_TOPIC) if m.uniq_key == sent.msg_id]
            if discarded or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    finally:
        silent.close()
    assert [c.check_times for c in silent.checks] == list(range(1, CHECK_MAX + 1))
    assert len(discarded) == 1
    props = dict(discarded[0].properties)
    assert props["TRANSACTION_CHECK_TIMES"] == str(CHECK_MAX) and props["REAL_TOPIC"] == "TxNeverAnswered"
    copies = [m for m in _system_queue(tx_up, HALF_TOPIC) if m.uniq_key == sent.msg_id]
    assert len(copies) == 1 + CHECK_MAX, "the half and one put-back copy per check"
    assert "was checked 3 times without an answer: discarded to TRANS_CHECK_MAX_TIME_TOPIC" in tx_up.logs()
    assert not _end(tx_up, sent, transaction_pb2.COMMIT, group="nobodyListens").applied
    assert _real_queue_or_empty(tx_up, "TxNeverAnswered") == []
    # The scheduler's metrics (its port follows the gateway's): checks, discards, ends by outcome.
    with urllib.request.urlopen(f"http://127.0.0.1:{tx_up.metrics_base_port + 5}/metrics", timeout=10) as page:
        text = page.read().decode()
    assert "mqstore_scheduler_transaction_checks_total" in text
    assert 'mqstore_scheduler_transaction_ends_total{applied="false",resolution="COMMIT"}' in text
    discarded = [line for line in text.splitlines() if line.startswith("mqstore_scheduler_transaction_discarded_total")]
    assert discarded and float(discarded[0].split()[-1]) >= 1


def test_bad_requests_are_refused_with_what_to_fix(tx_up: UpProcess) -> None:
    message = common_pb2.Message(topic="TxBad", body=b"x", properties={"TRAN_MSG": "true"})
    with pytest.raises(grpc.RpcError) as caught:
        tx_up.stub.Send(gateway_pb2.SendRequest(message=message), timeout=10)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "PGROUP" in caught.value.details()
    message.properties["PGROUP"] = GROUP
    with pytest.raises(grpc.RpcError) as caught:
        tx_up.stub.SendBatch(gateway_pb2.SendBatchRequest(messages=[message]), timeout=10)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "batch" in caught.value.details()
    raw = common_pb2.Message(topic="TxBad", body=b"x", sys_flag=0x4)
    with pytest.raises(grpc.RpcError) as caught:
        tx_up.stub.Send(gateway_pb2.SendRequest(message=raw), timeout=10)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "transaction" in caught.value.details()
    sent = _half(tx_up, "TxBad")
    with pytest.raises(grpc.RpcError) as caught:
        _end(tx_up, sent, transaction_pb2.COMMIT, group="otherGroup")
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "producer group" in caught.value.details()
    plain = tx_up.stub.Send(gateway_pb2.SendRequest(message=common_pb2.Message(topic="TxBad", body=b"y")), timeout=10)
    with pytest.raises(grpc.RpcError) as caught:
        _end(tx_up, plain, transaction_pb2.COMMIT)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "not a half" in caught.value.details()


def test_cli_send_transaction(tx_up: UpProcess) -> None:
    def send(state: str, text: str) -> dict[str, object]:
        done = subprocess.run([*mqstore_command(), "send", "TxCli", text, "--transaction", state, "--gateway",
                               tx_up.gateway, "--json"], capture_output=True, text=True, timeout=60,
                              env=commitlog_env())
        assert done.returncode == 0, done.stderr
        answer: dict[str, object] = json.loads(done.stdout)
        return answer

    committed = send("commit", "cli-commit")
    assert committed["state"] == "COMMIT" and committed["applied"] is True
    assert isinstance(committed["committed"], dict) and committed["committed"]["topic"] == "TxCli"
    rolled_back = send("rollback", "cli-rollback")
    assert rolled_back["applied"] is True and rolled_back["committed"] is None
    unknown = send("unknown", "cli-unknown")
    assert unknown["applied"] is False and unknown["committed"] is None
    assert [m.body for m in _real_queue(tx_up, "TxCli")] == [b"cli-commit"]


def test_a_check_stream_must_name_its_group_first(tx_up: UpProcess) -> None:
    answer = transaction_pb2.TransactionCheckStreamRequest(answer=transaction_pb2.EndTransactionRequest())
    with pytest.raises(grpc.RpcError) as caught:
        list(tx_up.stub.TransactionChecks(iter([answer]), timeout=10))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "producer_group" in caught.value.details()
    bad_group = transaction_pb2.TransactionCheckStreamRequest(producer_group="bad group!")
    with pytest.raises(grpc.RpcError) as caught:
        list(tx_up.stub.TransactionChecks(iter([bad_group]), timeout=10))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_a_long_immunity_does_not_hold_the_half_queue(tx_up: UpProcess) -> None:
    immune = _half(tx_up, "TxImmune", group="immuneGroup", body=b"immune", CHECK_IMMUNITY_TIME_IN_SECONDS="60")
    immune_half = _view(tx_up, immune.offset_msg_id)
    checked = threading.Event()

    def check(c: TransactionCheck) -> TransactionState:
        checked.set()
        return TransactionState.COMMIT

    with TransactionProducer("afterImmune", check=check, address=tx_up.gateway) as producer:
        producer.send_half("TxImmune", b"after")
        assert checked.wait(15), "a half after one within a long immunity is checked in time"
        deadline = time.monotonic() + 10
        while b"after" not in [m.body for m in _real_queue_or_empty(tx_up, "TxImmune")] and time.monotonic() < deadline:
            time.sleep(0.1)
    copies = [m for m in _system_queue(tx_up, HALF_TOPIC) if m.uniq_key == immune.msg_id]
    assert len(copies) >= 2, "4.9.8's putImmunityMsgBackToHalfQueue"
    assert all(dict(m.properties)["TRAN_PREPARED_QUEUE_OFFSET"] == str(immune_half.queue_offset) for m in copies[1:])
    assert all("TRANSACTION_CHECK_TIMES" not in m.properties for m in copies), "not checked yet"
    assert _end(tx_up, immune, transaction_pb2.COMMIT, group="immuneGroup").applied
    assert not _end(tx_up, immune, transaction_pb2.COMMIT, group="immuneGroup").applied
    deadline = time.monotonic() + 10  # the commit is readable once the indexer has dispatched it
    while len(_real_queue_or_empty(tx_up, "TxImmune")) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert sorted(m.body for m in _real_queue_or_empty(tx_up, "TxImmune")) == [b"after", b"immune"]
