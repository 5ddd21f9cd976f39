"""A RocketMQ 5 producer's TransactionChecker answers mqstore's check of a half it never ended (the
check travels as RecoverOrphanedTransactionCommand on the producer's telemetry stream); the half is
then committed and readable under its topic. A check goes only to a producer that publishes the half's
topic: a producer of another topic is never asked (and with none of the topic connected, the half
waits unchecked)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from apache.rocketmq.v2 import definition_pb2 as d
from apache.rocketmq.v2 import service_pb2 as s
from apache.rocketmq.v2 import service_pb2_grpc
from gateway.rocketmq5.messages import V2_PRODUCER_GROUP
from mqstore.v1 import common_pb2, gateway_pb2, query_pb2, query_pb2_grpc
from tests.gateway.system_process import UpProcess, running_up
from tests.rocketmq5.test_official_python_client import official
from tests.rocketmq5.test_protocol import endpoints
from tests.rocketmq5.topics import create_topic, stored

ENV = {"MQSTORE_TRANSACTION_TIMEOUT_MS": "1000", "MQSTORE_TRANSACTION_CHECK_INTERVAL_MS": "500"}


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpProcess]:
    with running_up(tmp_path_factory.mktemp("up") / "store", ENV) as started:
        yield started


def test_the_checker_commits_an_orphaned_half(up: UpProcess, tmp_path: Path) -> None:
    create_topic(up, "rmq5-orphans", 2)
    result = official("orphan", up.gateway, tmp_path, topic="rmq5-orphans", wait_s=30)
    assert result["checked"] == [result["id"]], "the checker was asked about the half it left open"
    committed = stored(up, result["id"], "rmq5-orphans")
    assert (committed.topic, committed.body, committed.tags) == ("rmq5-orphans", b"orphan body", "TagO")


class V2Producer:
    """A RocketMQ 5 producer's telemetry stream publishing ``topic``: the transaction ids of the checks
    (RecoverOrphanedTransactionCommand) it receives."""

    def __init__(self, up: UpProcess, topic: str) -> None:
        self.checked: list[str] = []
        self._release = threading.Event()
        settings = d.Settings(client_type=d.ClientType.PRODUCER, access_point=endpoints(up),
                              publishing=d.Publishing(topics=[d.Resource(name=topic)]))

        def commands() -> Iterator[s.TelemetryCommand]:
            yield s.TelemetryCommand(settings=settings)
            self._release.wait(60)

        self._stream = service_pb2_grpc.MessagingServiceStub(up.channel).Telemetry(commands(), timeout=60)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for command in self._stream:
                if command.HasField("recover_orphaned_transaction_command"):
                    self.checked.append(command.recover_orphaned_transaction_command.message.system_properties
                                        .message_id)
        except grpc.RpcError:
            pass

    def close(self) -> None:
        self._release.set()
        self._stream.cancel()
        self._thread.join(5)


def test_a_producer_of_another_topic_is_never_asked(up: UpProcess) -> None:
    create_topic(up, "rmq5-tx-asked", 1)
    create_topic(up, "rmq5-tx-elsewhere", 1)
    elsewhere = V2Producer(up, "rmq5-tx-elsewhere")
    try:
        half = up.stub.Send(gateway_pb2.SendRequest(message=common_pb2.Message(
            topic="rmq5-tx-asked", body=b"not yours", properties={"TRAN_MSG": "true", "PGROUP": V2_PRODUCER_GROUP})),
            timeout=10)
        time.sleep(3)  # past the timeout (1 s), several rounds (0.5 s)
        assert elsewhere.checked == [], "a producer that does not publish the half's topic is never asked"
        with grpc.insecure_channel(up.query) as channel:
            copies = [m for m in query_pb2_grpc.QueryServiceStub(channel).PullMessage(query_pb2.PullMessageRequest(
                topic="RMQ_SYS_TRANS_HALF_TOPIC", queue_id=0, queue_offset=0, max_messages=256), timeout=10).messages
                if m.uniq_key == half.msg_id]
        assert copies and all("TRANSACTION_CHECK_TIMES" not in m.properties for m in copies), "no check spent"
        asked = V2Producer(up, "rmq5-tx-asked")
        try:
            deadline = time.monotonic() + 10
            while not asked.checked and time.monotonic() < deadline:
                time.sleep(0.1)
        finally:
            asked.close()
        assert asked.checked[:1] == [half.msg_id]
        assert elsewhere.checked == []
    finally:
        elsewhere.close()
