"""Fuzzed bad input for every RPC of the gateway (hypothesis): each answer is INVALID_ARGUMENT with a
message, it is decided at the edge, and nothing changes behind it (the commitlog's end, the topics)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mqstore.v1 import commitlog_pb2, common_pb2, gateway_pb2, query_pb2
from tests.gateway.system_process import UpProcess
from tests.query.test_bad_input import (
    FUZZ,
    bad_groups,
    bad_ids,
    bad_names,
    key_queries,
    legal_names,
    offset_commits,
    offset_queries,
    producer_only_fields,
    pull_requests,
    queue_requests,
    view_requests,
)

# Oversized values are the point of some cases: hypothesis need not warn about their repr.
pytestmark = pytest.mark.filterwarnings("ignore:Generating overly large repr")
bodies = st.binary(min_size=1, max_size=64)
bad_properties = st.one_of(
    st.dictionaries(st.text(min_size=1, max_size=8).map(lambda t: t + "\x01"), st.text(max_size=8), min_size=1),
    st.dictionaries(st.text(min_size=1, max_size=8).filter(lambda t: "\x01" not in t and "\x02" not in t),
                    st.text(max_size=8).map(lambda t: t + "\x02"), min_size=1),
    st.just({"K": "v" * 40_000}),
)


def bad_messages() -> st.SearchStrategy[common_pb2.Message]:
    return st.one_of(
        st.builds(common_pb2.Message, topic=bad_names, body=bodies),
        st.builds(common_pb2.Message, topic=legal_names, body=st.just(b"")),
        st.builds(common_pb2.Message, topic=legal_names, body=bodies, properties=bad_properties),
        st.builds(common_pb2.Message, topic=legal_names, body=st.just(b"x" * (65 * 1024))),
        producer_only_fields.map(lambda fields: common_pb2.Message(**{"topic": "FuzzTopic", "body": b"b", **fields})),
    )


def sends() -> st.SearchStrategy[gateway_pb2.SendRequest]:
    return st.builds(gateway_pb2.SendRequest, message=bad_messages())


def batches() -> st.SearchStrategy[gateway_pb2.SendBatchRequest]:
    good = common_pb2.Message(topic="FuzzTopic", body=b"fine")
    return st.one_of(
        st.just(gateway_pb2.SendBatchRequest()),
        st.lists(bad_messages(), min_size=1, max_size=3).map(
            lambda bad: gateway_pb2.SendBatchRequest(messages=[good, *bad])),
        st.just(gateway_pb2.SendBatchRequest(messages=[good] * 1025)),
    )


def topic_requests() -> st.SearchStrategy[commitlog_pb2.TopicRequest]:
    def topic(**bad: Any) -> st.SearchStrategy[commitlog_pb2.TopicRequest]:
        fields = {"topic": legal_names, "read_queue_nums": st.integers(1, 16), "write_queue_nums": st.integers(1, 16),
                  "perm": st.sampled_from([2, 4, 6]), **bad}
        return st.builds(common_pb2.TopicConfig, **fields).map(lambda c: commitlog_pb2.TopicRequest(topic=c))
    return st.one_of(topic(topic=bad_names), topic(read_queue_nums=st.integers(-5, 0)),
                     topic(write_queue_nums=st.integers(1025, 2**31 - 1)), topic(perm=st.integers(8, 100)))


def send_backs() -> st.SearchStrategy[gateway_pb2.ConsumerSendBackRequest]:
    """Bad groups, ids, delay levels, limits, topics: all refused before any lookup (nothing stored)."""
    some_id = st.just("7F00000100002A9F0000000000000000")
    request = gateway_pb2.ConsumerSendBackRequest
    return st.one_of(
        st.builds(request, group=bad_groups, msg_id=some_id),
        st.builds(request, group=st.integers(121, 255).map(lambda n: "G" * n), msg_id=some_id),
        st.builds(request, group=legal_names, msg_id=bad_ids),
        st.builds(request, group=legal_names, msg_id=some_id, delay_level=st.integers(-2**31, -2)),
        st.builds(request, group=legal_names, msg_id=some_id,
                  max_reconsume_times=st.one_of(st.integers(-2**31, -1), st.integers(1001, 2**31 - 1))),
        st.builds(request, group=legal_names, msg_id=some_id, topic=bad_names.filter(bool)),
    )


CASES: dict[str, st.SearchStrategy[Any]] = {
    "Send": sends(),
    "SendBatch": batches(),
    "Pull": pull_requests(),
    "GetMessage": view_requests(),
    "QueryByKey": key_queries(),
    "SearchOffset": st.one_of(queue_requests(query_pb2.SearchOffsetRequest),
                              st.builds(query_pb2.SearchOffsetRequest, topic=legal_names, queue_id=st.integers(0, 7),
                                        timestamp=st.integers(-2**63, -1))),
    "GetQueueOffsets": queue_requests(query_pb2.GetQueueOffsetRangeRequest),
    "CommitOffset": offset_commits(),
    "QueryOffset": offset_queries(),
    "CreateTopic": topic_requests(),
    "UpdateTopic": topic_requests(),
    "GetRoute": st.builds(gateway_pb2.GetRouteRequest, topic=bad_names),
    "ConsumerSendBack": send_backs(),
}


@pytest.fixture(scope="module")
def seeded(up: UpProcess) -> UpProcess:
    up.stub.Send(gateway_pb2.SendRequest(message=common_pb2.Message(topic="FuzzTopic", body=b"seed")), timeout=10)
    return up


@pytest.mark.parametrize("method", sorted(CASES))
def test_bad_input_gets_invalid_argument_and_changes_nothing(seeded: UpProcess, method: str) -> None:
    before = seeded.store_state()
    call: Callable[..., Any] = getattr(seeded.stub, method)

    @FUZZ
    @given(request=CASES[method])
    def check(request: Any) -> None:
        with pytest.raises(grpc.RpcError) as info:
            call(request, timeout=10)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (request, info.value.details())
        assert info.value.details()

    check()
    assert seeded.store_state() == before


def _is_bad(request: gateway_pb2.SendRequest) -> bool:
    """Every generated good message is a plain body to FuzzTopic; anything else is a bad one."""
    m = request.message
    return (not m.body or m.topic != "FuzzTopic" or bool(m.properties) or m.sys_flag != 0 or m.flag != 0
            or m.reconsume_times != 0 or m.prepared_transaction_offset != 0)


@FUZZ
@given(requests=st.lists(st.one_of(sends(), st.builds(gateway_pb2.SendRequest, message=st.builds(
    common_pb2.Message, topic=st.just("FuzzTopic"), body=bodies))), min_size=1, max_size=6).filter(
        lambda rs: any(_is_bad(r) for r in rs)))
def test_a_stream_stops_at_the_first_bad_message(seeded: UpProcess, requests: list[gateway_pb2.SendRequest]) -> None:
    first_bad = next(i for i, r in enumerate(requests) if _is_bad(r))
    acknowledged = 0
    with pytest.raises(grpc.RpcError) as info:
        for _ in seeded.stub.SendStream(iter(requests), timeout=10):
            acknowledged += 1
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert acknowledged <= first_bad
    numbers = [int(n) for n in re.findall(r"message #(\d+)", info.value.details() or "")]
    assert numbers and numbers[0] == first_bad, info.value.details()


@pytest.mark.parametrize("method", sorted({*CASES, "SendStream", "ListTopics"}))
def test_garbage_bytes_never_crash_the_gateway(seeded: UpProcess, method: str) -> None:
    """Bytes that are not the request message: an error status, and the gateway keeps serving."""
    path = f"/mqstore.v1.MessagingService/{method}"
    for payload in (b"\xff\xff\xff", b"\x0a\xff", bytes(range(256))):
        if method == "SendStream":
            call = seeded.channel.stream_stream(path, request_serializer=None, response_deserializer=None)
            with pytest.raises(grpc.RpcError) as info:
                list(call(iter([payload]), timeout=10))
        else:
            unary = seeded.channel.unary_unary(path, request_serializer=None, response_deserializer=None)
            with pytest.raises(grpc.RpcError) as info:
                unary(payload, timeout=10)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (method, info.value.details())
        assert "not a valid" in (info.value.details() or "")
    assert seeded.stub.ListTopics(commitlog_pb2.ListTopicsRequest(), timeout=10).topics
