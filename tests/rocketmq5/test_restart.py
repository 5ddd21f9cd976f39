"""A restart of ``mqstore up`` (gateway and query service) changes nothing a v2 consumer sees: the
shard keeps what is in flight (pop checkpoints), so an acked message is not delivered again, even above
an unacked one, and the unacked one comes back once its invisible duration is over, with its next
delivery attempt."""

from __future__ import annotations

from pathlib import Path

from apache.rocketmq.v2 import definition_pb2 as d
from apache.rocketmq.v2 import service_pb2 as s
from apache.rocketmq.v2 import service_pb2_grpc
from tests.gateway.system_process import start_up
from tests.rocketmq5.test_protocol import ack, message, receive_all
from tests.rocketmq5.topics import create_topic

INVISIBLE_S = 3


def test_a_restart_changes_nothing_a_consumer_sees(tmp_path: Path) -> None:
    topic, group = "rmq5-restart", "g-restart"
    up = start_up(tmp_path / "store")
    try:
        create_topic(up, topic, 1)
        v2 = service_pb2_grpc.MessagingServiceStub(up.channel)
        sent = v2.SendMessage(s.SendMessageRequest(messages=[message(topic, b"m0"), message(topic, b"m1"),
                                                             message(topic, b"m2")]), timeout=10)
        assert sent.status.code == d.Code.OK
        got = receive_all(v2, topic, group, INVISIBLE_S, 3)
        assert [m.body for m in got] == [b"m0", b"m1", b"m2"]
        for m in (got[0], got[2]):
            assert ack(v2, topic, group, m.system_properties.receipt_handle).status.code == d.Code.OK
        assert up.stop() == 0
    finally:
        up.kill_all()

    up = start_up(tmp_path / "store")
    try:
        v2 = service_pb2_grpc.MessagingServiceStub(up.channel)
        again = receive_all(v2, topic, group, 60, 2)
        assert [(m.body, m.system_properties.delivery_attempt) for m in again] == [(b"m1", 2)]
        assert again[0].system_properties.message_id == got[1].system_properties.message_id
        assert up.stop() == 0
    finally:
        up.kill_all()
