"""``mqstore up`` brings the system up; one message goes through the gateway and back."""

from __future__ import annotations

from mqstore.v1 import common_pb2, gateway_pb2, query_pb2
from tests.gateway.system_process import UpProcess


def test_send_then_pull_through_the_gateway(up: UpProcess) -> None:
    sent = up.stub.Send(gateway_pb2.SendRequest(message=common_pb2.Message(topic="smoke", body=b"hello")), timeout=10)
    assert sent.status == 1 and len(sent.msg_id) == 32 and sent.shard == "shard-0"
    pulled = up.stub.Pull(query_pb2.PullMessageRequest(topic="smoke", queue_id=sent.queue_id,
                                                       queue_offset=sent.queue_offset, long_poll_ms=3000), timeout=10)
    assert [m.body for m in pulled.messages] == [b"hello"]
    assert pulled.messages[0].uniq_key == sent.msg_id
    assert pulled.messages[0].msg_id == sent.offset_msg_id
