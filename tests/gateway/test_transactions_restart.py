"""Transactions across a restart of every service (``mqstore up`` stopped and started on its store):
the op topic and the checker's progress are the state, so a half ended before the restart is never
checked again, a half pending across it can be ended by its original offset msg id (even after the
checker put copies of it back), and a half left open is checked and committed once afterwards."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path

import grpc
import pytest

from mqstore.client import TransactionCheck, TransactionProducer, TransactionState
from mqstore.v1 import common_pb2, gateway_pb2, query_pb2, transaction_pb2
from tests.commitlog.commitlog_process import commitlog_env, mqstore_command
from tests.gateway.system_process import UpProcess, start_up
from tests.geometry import SMALL

ENV = {**SMALL.env(), "MQSTORE_TRANSACTION_TIMEOUT_MS": "1500", "MQSTORE_TRANSACTION_CHECK_INTERVAL_MS": "500"}


def _half(up: UpProcess, topic: str, group: str, body: bytes) -> gateway_pb2.SendResult:
    message = common_pb2.Message(topic=topic, body=body, properties={"TRAN_MSG": "true", "PGROUP": group})
    return up.stub.Send(gateway_pb2.SendRequest(message=message), timeout=10)


def _end(up: UpProcess, sent: gateway_pb2.SendResult, group: str) -> gateway_pb2.EndTransactionResult:
    return up.stub.EndTransaction(transaction_pb2.EndTransactionRequest(
        producer_group=group, transaction_id=sent.msg_id, offset_msg_id=sent.offset_msg_id,
        resolution=transaction_pb2.COMMIT), timeout=10)


def _bodies(up: UpProcess, topic: str) -> list[bytes]:
    try:
        route = up.stub.GetRoute(gateway_pb2.GetRouteRequest(topic=topic), timeout=10)
    except grpc.RpcError as exc:
        if exc.code() == grpc.StatusCode.NOT_FOUND:
            return []
        raise
    bodies: list[bytes] = []
    for queue in route.queues:
        answer = up.stub.Pull(query_pb2.PullMessageRequest(topic=topic, queue_id=queue.queue_id, queue_offset=0,
                                                           max_messages=64), timeout=10)
        bodies.extend(m.body for m in answer.messages)
    return sorted(bodies)


def _wait_bodies(up: UpProcess, topic: str, expected: list[bytes], timeout_s: float = 20) -> list[bytes]:
    deadline = time.monotonic() + timeout_s
    while True:
        found = _bodies(up, topic)
        if found == expected or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


@pytest.mark.parametrize("stop", ["clean", "kill-9"])
def test_commit_and_check_back_across_a_restart_of_every_service(tmp_path: Path, stop: str) -> None:
    store = tmp_path / "store"
    first = start_up(store, ENV)
    try:
        done_before = _half(first, "TxRestart", "restartCheck", b"done-before")
        assert _end(first, done_before, "restartCheck").applied
        pending_end = _half(first, "TxRestart", "restartEnd", b"ended-after")
        pending_check = _half(first, "TxRestart", "restartCheck", b"checked-after")
        assert _wait_bodies(first, "TxRestart", [b"done-before"]) == [b"done-before"]
        if stop == "clean":
            assert first.stop() == 0, first.logs()[-5000:]
        else:  # every process at once, mid-round: the checker's offsets file may lag the op topic
            first.kill_all()
            first.proc.wait(30)
    finally:
        first.kill_all()

    second = start_up(store, ENV)
    try:
        # Pending across the restart: older than the timeout by now, so the checker may already have
        # put copies back; the original offset msg id still ends the transaction, once.
        time.sleep(2.5)
        ended = _end(second, pending_end, "restartEnd")
        assert ended.applied and ended.committed.topic == "TxRestart"
        assert not _end(second, pending_end, "restartEnd").applied

        checks: list[TransactionCheck] = []
        answered = threading.Event()

        def check(c: TransactionCheck) -> TransactionState:
            checks.append(c)
            answered.set()
            return TransactionState.COMMIT

        with TransactionProducer("restartCheck", check=check, address=second.gateway):
            assert answered.wait(20), "the half left open before the restart is checked after it"
            expected = [b"checked-after", b"done-before", b"ended-after"]
            assert _wait_bodies(second, "TxRestart", expected) == expected
            time.sleep(1.5)  # a few more check rounds: nothing is checked or committed again
        assert _bodies(second, "TxRestart") == expected
        assert {c.transaction_id for c in checks} == {pending_check.msg_id}, \
            "a half ended before the restart is never checked"
        assert second.stop() == 0, second.logs()[-5000:]
    finally:
        second.kill_all()
    progress = json.loads((store / "scheduler" / "config" / "transactionOffset.json").read_text())
    assert progress["halfOffset"] >= 3 and progress["opOffset"] >= 3, progress
    # A RocketMQ broker given the store starts checking where mqstore's checker stopped.
    dest = tmp_path / "rocketmq"
    done = subprocess.run([*mqstore_command(), "export-rocketmq-store", str(store), str(dest)], capture_output=True,
                          text=True, timeout=120, env=commitlog_env())
    assert done.returncode == 0, done.stderr
    table = json.loads((dest / "config" / "consumerOffset.json").read_text())["offsetTable"]
    assert table["RMQ_SYS_TRANS_HALF_TOPIC@CID_RMQ_SYS_TRANS"] == {"0": progress["halfOffset"]}
    assert table["RMQ_SYS_TRANS_OP_HALF_TOPIC@CID_RMQ_SYS_TRANS"] == {"0": progress["opOffset"]}
