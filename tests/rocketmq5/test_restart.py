"""At least once across a restart: the group's committed offset is the lowest in-flight offset, so after
``mqstore up`` restarts, what was acked below it is not delivered again and what was not acked is."""

from __future__ import annotations

import time
from pathlib import Path

from mqstore.apache.rocketmq.v2 import definition_pb2 as d
from mqstore.apache.rocketmq.v2 import service_pb2 as s
from mqstore.apache.rocketmq.v2 import service_pb2_grpc
from tests.gateway.system_process import start_up
from tests.rocketmq5.test_protocol import ack, message, receive_all
from tests.rocketmq5.topics import create_topic


def test_unacked_messages_come_back_after_a_restart(tmp_path: Path) -> None:
    topic, group = "rmq5-restart", "g-restart"
    up = start_up(tmp_path / "store")
    try:
        create_topic(up, topic, 1)
        v2 = service_pb2_grpc.MessagingServiceStub(up.channel)
        sent = v2.SendMessage(s.SendMessageRequest(messages=[message(topic, b"m0"), message(topic, b"m1"),
                                                             message(topic, b"m2")]), timeout=10)
        assert sent.status.code == d.Code.OK
        got = receive_all(v2, topic, group, 60, 3)
        assert [m.body for m in got] == [b"m0", b"m1", b"m2"]
        for m in (got[0], got[2]):
            assert ack(v2, topic, group, m.system_properties.receipt_handle).status.code == d.Code.OK
        time.sleep(0.5)  # the acks' offset is committed within 200 ms
        assert up.stop() == 0
    finally:
        up.kill_all()

    up = start_up(tmp_path / "store")
    try:
        v2 = service_pb2_grpc.MessagingServiceStub(up.channel)
        again = receive_all(v2, topic, group, 60, 2)
        # m1 was not acked; m2 was, but lies above it (delivered again: at least once); m0 never again.
        assert [m.body for m in again] == [b"m1", b"m2"]
        assert again[0].system_properties.message_id == got[1].system_properties.message_id
        assert up.stop() == 0
    finally:
        up.kill_all()
