"""Timer messages through the gateway (``mqstore up``, real processes): the SendResult names
rmq_sys_wheel_timer queue 0, the message reaches a consumer of its topic at its time, a bad or too
distant timer is INVALID_ARGUMENT naming the property, and producers may not send to the timer topic."""

from __future__ import annotations

import time
from collections.abc import Iterator

import grpc
import pytest

from mqstore.v1 import common_pb2, gateway_pb2, query_pb2
from services.store.rules.timer_message import TIMER_TOPIC
from tests.gateway.system_process import UpProcess, running_up


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpProcess]:
    with running_up(tmp_path_factory.mktemp("timer-up") / "store") as started:
        yield started


def _send(up: UpProcess, **properties: str) -> gateway_pb2.SendResult:
    message = common_pb2.Message(topic="TimerViaGateway", body=b"at its time", properties=properties)
    result: gateway_pb2.SendResult = up.stub.Send(gateway_pb2.SendRequest(message=message, queue_id=0), timeout=10)
    return result


def test_a_timer_message_through_the_gateway(up: UpProcess) -> None:
    deliver = time.time_ns() // 1_000_000 + 1500
    result = _send(up, TIMER_DELIVER_MS=str(deliver))
    assert (result.topic, result.queue_id) == (TIMER_TOPIC, 0)
    deadline = time.monotonic() + 15
    messages: list[query_pb2.StoredMessage] = []
    while not messages and time.monotonic() < deadline:
        response = up.stub.Pull(query_pb2.PullMessageRequest(topic="TimerViaGateway", queue_id=0, queue_offset=0,
                                                             max_messages=8, long_poll_ms=500), timeout=10)
        messages = list(response.messages)
    assert [m.uniq_key for m in messages] == [result.msg_id]
    assert messages[0].store_timestamp >= deliver
    assert messages[0].properties["TIMER_OUT_MS"] == str(deliver)


@pytest.mark.parametrize(("properties", "needle"), [
    ({"TIMER_DELIVER_MS": "tomorrow"}, "TIMER_DELIVER_MS property 'tomorrow' is not a whole number"),
    ({"TIMER_DELAY_SEC": str(30 * 86400)}, "beyond the limit of 604800 s (timerMaxDelaySec)"),
])
def test_bad_timers_are_invalid_argument_at_the_gateway(up: UpProcess, properties: dict[str, str],
                                                        needle: str) -> None:
    with pytest.raises(grpc.RpcError) as failure:
        _send(up, **properties)
    assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert needle in failure.value.details()


def test_producers_may_not_send_to_the_timer_topic(up: UpProcess) -> None:
    with pytest.raises(grpc.RpcError) as failure:
        up.stub.Send(gateway_pb2.SendRequest(message=common_pb2.Message(topic=TIMER_TOPIC, body=b"x")), timeout=10)
    assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "system topic" in failure.value.details()
