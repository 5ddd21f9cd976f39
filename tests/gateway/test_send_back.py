"""ConsumerSendBack against a real system (``mqstore up``): the record RocketMQ 4.9.8's
consumerSendMsgBack stores, field by field, for a retry (SCHEDULE_TOPIC_XXXX, REAL_TOPIC=%RETRY%<group>)
and for a dead letter (%DLQ%<group> at once); bad requests store nothing."""

from __future__ import annotations

import grpc
import pytest

from mqstore.v1 import commitlog_pb2, commitlog_pb2_grpc, common_pb2, gateway_pb2, query_pb2
from tests.gateway.system_process import UpProcess

GROUP = "sendBackGroup"


def _send(up: UpProcess, topic: str, body: bytes = b"payload") -> gateway_pb2.SendResult:
    message = common_pb2.Message(topic=topic, body=body, flag=7, properties={"TAGS": "TagA", "KEYS": "k1 k2",
                                                                             "color": "red"})
    return up.stub.Send(gateway_pb2.SendRequest(message=message), timeout=10)


def _view(up: UpProcess, offset_msg_id: str) -> query_pb2.StoredMessage:
    return up.stub.GetMessage(query_pb2.ViewMessageRequest(msg_id=offset_msg_id), timeout=10).message


def _send_back(up: UpProcess, msg_id: str, **fields: object) -> gateway_pb2.ConsumerSendBackResult:
    request = gateway_pb2.ConsumerSendBackRequest(group=fields.pop("group", GROUP), msg_id=msg_id, **fields)
    return up.stub.ConsumerSendBack(request, timeout=10)


def test_a_retry_is_stored_under_schedule_topic_for_the_groups_retry_topic(up: UpProcess) -> None:
    sent = _send(up, "SendBackRetry")
    original = _view(up, sent.offset_msg_id)
    answer = _send_back(up, sent.offset_msg_id)
    assert (answer.target_topic, answer.dead_letter, answer.reconsume_times, answer.delay_level) == \
        (f"%RETRY%{GROUP}", False, 1, 3)
    assert answer.origin_msg_id == sent.offset_msg_id
    assert answer.send.topic == "SCHEDULE_TOPIC_XXXX" and answer.send.queue_id == 2  # level 3 -> queue 2
    assert answer.send.msg_id == sent.msg_id, "the message keeps its msg id (UNIQ_KEY)"
    stored = _view(up, answer.send.offset_msg_id)
    assert stored.topic == "SCHEDULE_TOPIC_XXXX" and stored.queue_id == 2
    props = dict(stored.properties)
    assert props["REAL_TOPIC"] == f"%RETRY%{GROUP}" and props["REAL_QID"] == "0"
    assert props["RETRY_TOPIC"] == "SendBackRetry"
    assert props["ORIGIN_MESSAGE_ID"] == sent.offset_msg_id
    assert props["DELAY"] == "3" and props["WAIT"] == "false"
    assert props["UNIQ_KEY"] == sent.msg_id and props["TAGS"] == "TagA" and props["KEYS"] == "k1 k2"
    assert props["color"] == "red"
    assert stored.reconsume_times == 1
    assert (stored.body, stored.flag, stored.born_timestamp, stored.born_host) == \
        (original.body, original.flag, original.born_timestamp, original.born_host)
    # The retry topic exists with RocketMQ's one queue.
    route = up.stub.GetRoute(gateway_pb2.GetRouteRequest(topic=f"%RETRY%{GROUP}"), timeout=10)
    assert len(route.queues) == 1


def test_an_explicit_level_and_the_chain_to_the_dead_letter_queue(up: UpProcess) -> None:
    sent = _send(up, "SendBackChain")
    first = _send_back(up, sent.offset_msg_id, delay_level=5)
    assert first.send.topic == "SCHEDULE_TOPIC_XXXX" and first.send.queue_id == 4 and first.delay_level == 5
    # The retried copy handed back again (as a consumer of %RETRY% would): its reconsume times (1)
    # reached the limit of 1, so it is a dead letter; the origin stays the first copy's id.
    second = _send_back(up, first.send.offset_msg_id, max_reconsume_times=1)
    assert second.dead_letter and second.target_topic == f"%DLQ%{GROUP}" and second.reconsume_times == 2
    assert second.send.topic == f"%DLQ%{GROUP}" and second.send.queue_id == 0
    stored = _view(up, second.send.offset_msg_id)
    props = dict(stored.properties)
    assert props["RETRY_TOPIC"] == "SendBackChain" and props["ORIGIN_MESSAGE_ID"] == sent.offset_msg_id
    assert "DELAY" not in props and stored.reconsume_times == 2
    # The dead letter is readable once the indexer has dispatched it: long-poll for it.
    pulled = up.stub.Pull(query_pb2.PullMessageRequest(topic=f"%DLQ%{GROUP}", queue_id=0, queue_offset=0,
                                                       max_messages=32, long_poll_ms=10_000), timeout=20)
    assert sent.msg_id in [m.uniq_key for m in pulled.messages]


def test_level_minus_one_and_the_default_limit_of_16(up: UpProcess) -> None:
    sent = _send(up, "SendBackDlq")
    at_once = _send_back(up, sent.offset_msg_id, delay_level=-1, group="dlqGroup")
    assert at_once.dead_letter and at_once.send.topic == "%DLQ%dlqGroup" and at_once.reconsume_times == 1
    route = up.stub.GetRoute(gateway_pb2.GetRouteRequest(topic="%DLQ%dlqGroup"), timeout=10)
    assert [(q.readable, q.writable) for q in route.queues] == [(True, True)]
    # Reconsume times 1 < 16: a retry at level 3 + 1.
    again = _send_back(up, at_once.send.offset_msg_id, group="dlqGroup")
    assert not again.dead_letter and again.delay_level == 4 and again.send.queue_id == 3


def test_unknown_ids_and_bad_requests_store_nothing(up: UpProcess) -> None:
    before = up.store_state()
    with pytest.raises(grpc.RpcError) as info:
        _send_back(up, "7F00000100002A9F00000000FFFFFF00")
    assert info.value.code() == grpc.StatusCode.NOT_FOUND, info.value.details()
    for fields, words in (({"delay_level": -2}, "delay_level -2"), ({"group": "bad group"}, "illegal characters"),
                          ({"max_reconsume_times": -1}, "max_reconsume_times -1"),
                          ({"group": "G" * 121}, "too long for a retry topic")):
        with pytest.raises(grpc.RpcError) as info:
            _send_back(up, "7F00000100002A9F0000000000000000", **fields)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert words in (info.value.details() or ""), info.value.details()
    assert up.store_state() == before


def test_producers_still_may_not_send_to_group_topics(up: UpProcess) -> None:
    with pytest.raises(grpc.RpcError) as info:
        up.stub.Send(gateway_pb2.SendRequest(message=common_pb2.Message(topic=f"%RETRY%{GROUP}", body=b"x")),
                     timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_only_the_group_flow_writes_group_topics_and_never_system_topics(up: UpProcess) -> None:
    """The commitlog's own edge: AppendRequest.group_flow opens %RETRY% / %DLQ% and nothing else."""
    before = up.store_state()
    with grpc.insecure_channel(up.commitlog) as channel:
        stub = commitlog_pb2_grpc.CommitLogServiceStub(channel)
        for topic, flow in (("%RETRY%direct", False), ("%DLQ%direct", False), ("SCHEDULE_TOPIC_XXXX", True),
                            ("RMQ_SYS_TRANS_HALF_TOPIC", True), ("%RETRY%bad name", True)):
            with pytest.raises(grpc.RpcError) as info:
                stub.Append(commitlog_pb2.AppendRequest(message=common_pb2.Message(topic=topic, body=b"x"),
                                                        group_flow=flow), timeout=10)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (topic, info.value.details())
    assert up.store_state() == before
