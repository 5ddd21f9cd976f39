"""Fuzzed bad input for every RPC of the query service (hypothesis): each answer carries the precise
status code and a message, and nothing changes (no write reaches the commitlog, the indexer or the
consumer offset table). Also: health and reflection are on."""

from __future__ import annotations

import json
import re
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqstore.v1 import commitlog_pb2, indexer_pb2, query_pb2
from services.store.formats.message_id import make_message_id
from tests.query.query_process import System, message

FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
LEGAL = re.compile(r"^[%|a-zA-Z0-9_.\-]+$")

# Names of dots only are refused everywhere: a name becomes a directory or a config key (issue 17).
DOT_NAMES = st.sampled_from([".", "..", "..."])
legal_names = st.from_regex(r"[a-zA-Z0-9_%|.\-]{1,24}", fullmatch=True).filter(
    lambda t: set(t) != {"."} and not t.startswith(("%RETRY%", "%DLQ%", "RMQ_SYS_")))
bad_names = st.one_of(st.just(""), st.text(min_size=1, max_size=30).filter(lambda t: not LEGAL.match(t)),
                      st.integers(128, 300).map(lambda n: "T" * n), DOT_NAMES)
bad_groups = st.one_of(st.just(""), st.text(min_size=1, max_size=30).filter(lambda t: not LEGAL.match(t)),
                       st.integers(256, 400).map(lambda n: "G" * n), DOT_NAMES)
#: What only the store's own flows may write (issue 17): (field, value) pairs of a producer's message.
SYSTEM_TOPICS = st.sampled_from(["SCHEDULE_TOPIC_XXXX", "TBW102", "RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRACE_TOPIC",
                                 "%RETRY%fuzz", "%DLQ%fuzz"])
producer_only_fields: st.SearchStrategy[dict[str, Any]] = st.one_of(
    st.sampled_from([0x4, 0x8, 0xC, -1, 0x7FFFFFFF, 0x1000, 0x40]).map(lambda f: {"sys_flag": f}),
    st.integers(-(2**31), -1).map(lambda f: {"flag": f}),
    st.integers(-(2**31), -1).map(lambda r: {"reconsume_times": r}),
    st.integers(-(2**63), -1).map(lambda o: {"prepared_transaction_offset": o}),
    SYSTEM_TOPICS.map(lambda t: {"topic": t}),
    st.text(alphabet="0123456789ABCDEFxyz-", max_size=80).filter(
        lambda k: not (len(k) in (32, 56) and all(c in "0123456789ABCDEF" for c in k))).map(
        lambda k: {"properties": {"UNIQ_KEY": k}}),
)
queues = st.integers(0, 1023)
bad_queues = st.one_of(st.integers(-2**31, -1), st.integers(1024, 2**31 - 1))
bad_offsets = st.integers(-2**63, -1)
hex_digits = st.text(alphabet="0123456789ABCDEFabcdef", min_size=0, max_size=70)
bad_ids = st.one_of(hex_digits.filter(lambda t: len(t) not in (32, 52, 56)),
                    st.text(min_size=32, max_size=32).filter(lambda t: not re.fullmatch(r"[0-9A-Fa-f]{32}", t)))


def pull_requests() -> st.SearchStrategy[query_pb2.PullMessageRequest]:
    def pull(**bad: Any) -> st.SearchStrategy[query_pb2.PullMessageRequest]:
        return st.builds(query_pb2.PullMessageRequest, **{"topic": legal_names, "queue_id": queues,
                                                           "queue_offset": st.integers(0, 10**6),
                                                           "raw_records": st.booleans(), **bad})
    return st.one_of(
        pull(topic=bad_names), pull(queue_id=bad_queues), pull(queue_offset=bad_offsets),
        pull(max_messages=st.one_of(st.integers(-2**31, -1), st.integers(1025, 2**31 - 1))),
        pull(max_bytes=st.one_of(st.integers(-2**31, -1), st.integers(32 * 2**20 + 1, 2**31 - 1))),
        pull(long_poll_ms=st.one_of(st.integers(-2**31, -1), st.integers(15_001, 2**31 - 1))),
        pull(subscription=st.one_of(st.lists(st.sampled_from(["||", " "]), min_size=1).map("".join).filter(
                                        lambda text: "||" in text),
                                    st.just("x" * 8193),
                                    st.just(" || ".join(f"t{i}" for i in range(65))))),
    )


def view_requests() -> st.SearchStrategy[query_pb2.ViewMessageRequest]:
    return st.one_of(
        st.builds(query_pb2.ViewMessageRequest, msg_id=bad_ids, kind=st.integers(0, 2)),
        st.builds(query_pb2.ViewMessageRequest, msg_id=st.just("7F00000100002A9F0000000000000000"),
                  kind=st.integers(3, 2**31 - 1)),
        st.builds(query_pb2.ViewMessageRequest, msg_id=st.just("7F00000100002A9F0000000000000000"),
                  topic=bad_names.filter(bool)),
    )


def key_queries() -> st.SearchStrategy[query_pb2.QueryMessageRequest]:
    def query(**bad: Any) -> st.SearchStrategy[query_pb2.QueryMessageRequest]:
        return st.builds(query_pb2.QueryMessageRequest, **{"topic": legal_names, "key": legal_names, **bad})
    return st.one_of(
        query(topic=bad_names), query(key=st.one_of(st.just(""), st.text(min_size=1).map(lambda t: t + "\x02"))),
        query(begin_timestamp=bad_offsets), query(end_timestamp=bad_offsets),
        query(begin_timestamp=st.integers(1000, 2**62), end_timestamp=st.integers(1, 999)),
        query(max_num=st.one_of(st.integers(-2**31, -1), st.integers(65, 2**31 - 1))),
    )


def queue_requests(kind: Any, **extra: Any) -> st.SearchStrategy[Any]:
    return st.one_of(st.builds(kind, topic=bad_names, queue_id=queues, **extra),
                     st.builds(kind, topic=legal_names, queue_id=bad_queues, **extra))


def offset_commits() -> st.SearchStrategy[query_pb2.UpdateConsumerOffsetRequest]:
    def commit(**bad: Any) -> st.SearchStrategy[query_pb2.UpdateConsumerOffsetRequest]:
        return st.builds(query_pb2.UpdateConsumerOffsetRequest, **{
            "consumer_group": legal_names, "topic": legal_names, "queue_id": queues,
            "offset": st.integers(0, 2**40), **bad})
    return st.one_of(commit(consumer_group=bad_groups), commit(topic=bad_names), commit(queue_id=bad_queues),
                     commit(offset=bad_offsets))


def offset_queries() -> st.SearchStrategy[query_pb2.QueryConsumerOffsetRequest]:
    return st.one_of(
        st.builds(query_pb2.QueryConsumerOffsetRequest, consumer_group=bad_groups, topic=legal_names, queue_id=queues),
        st.builds(query_pb2.QueryConsumerOffsetRequest, consumer_group=legal_names, topic=bad_names, queue_id=queues),
        st.builds(query_pb2.QueryConsumerOffsetRequest, consumer_group=legal_names, topic=legal_names,
                  queue_id=bad_queues))


CASES = {
    "PullMessage": pull_requests(),
    "ViewMessage": view_requests(),
    "QueryMessage": key_queries(),
    "SearchOffset": st.one_of(queue_requests(query_pb2.SearchOffsetRequest),
                              st.builds(query_pb2.SearchOffsetRequest, topic=legal_names, queue_id=queues,
                                        timestamp=bad_offsets)),
    "GetQueueOffsetRange": queue_requests(query_pb2.GetQueueOffsetRangeRequest),
    "GetEarliestMsgStoreTime": queue_requests(query_pb2.GetEarliestMsgStoreTimeRequest),
    "UpdateConsumerOffset": offset_commits(),
    "QueryConsumerOffset": offset_queries(),
}


def state(system: System) -> tuple[int, int, int]:
    """What bad input must not change: the log's end, the indexer's dispatch count, the topics."""
    info = system.commitlog.stub.GetStoreInfo(commitlog_pb2.GetStoreInfoRequest(), timeout=5)
    status = system.indexer.stub.GetDispatchStatus(indexer_pb2.GetDispatchStatusRequest(), timeout=5)
    topics = system.commitlog.stub.ListTopics(commitlog_pb2.ListTopicsRequest(), timeout=5)
    return info.max_offset, status.dispatched_records, len(topics.topics)


@pytest.fixture(scope="module")
def seeded(system: System) -> System:
    system.append([message("FuzzTopic", 0, b"seed", KEYS="seed-key")])
    system.query.stub.UpdateConsumerOffset(query_pb2.UpdateConsumerOffsetRequest(
        consumer_group="FuzzGroup", topic="FuzzTopic", queue_id=0, offset=1), timeout=5)
    return system


@pytest.mark.parametrize("method", sorted(CASES))
def test_bad_input_gets_invalid_argument_and_changes_nothing(seeded: System, method: str) -> None:
    before = state(seeded)
    call = getattr(seeded.query.stub, method)

    @FUZZ
    @given(request=CASES[method])
    def check(request: Any) -> None:
        with pytest.raises(grpc.RpcError) as info:
            call(request, timeout=5)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (request, info.value.details())
        assert info.value.details()

    check()
    assert state(seeded) == before


@FUZZ
@given(offset=st.integers(0, 2**63 - 1), host=st.tuples(st.integers(1, 223), st.integers(0, 255),
                                                          st.integers(1, 65535)))
def test_offset_ids_of_other_hosts_are_not_found_naming_the_host(seeded: System, offset: int,
                                                                 host: tuple[int, int, int]) -> None:
    first, last, port = host
    address = f"{first}.0.{last}.1:{port}"
    if address == "127.0.0.1:10911":
        return
    msg_id = make_message_id(address, offset)
    with pytest.raises(grpc.RpcError) as info:
        seeded.query.stub.ViewMessage(query_pb2.ViewMessageRequest(msg_id=msg_id,
                                                                   kind=query_pb2.MESSAGE_ID_KIND_OFFSET), timeout=5)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    assert address in str(info.value.details())


def test_health_and_reflection(seeded: System) -> None:
    check = seeded.query.health.Check(health_pb2.HealthCheckRequest(service="mqstore.v1.QueryService"), timeout=5)
    assert check.status == health_pb2.HealthCheckResponse.SERVING
    services = reflection_pb2_grpc.ServerReflectionStub(seeded.query.channel).ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5)
    names = {s.name for response in services for s in response.list_services_response.service}
    assert {"mqstore.v1.QueryService", "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"} <= names


def test_the_offset_table_holds_only_the_valid_commit(seeded: System) -> None:
    """Runs last: a clean stop writes the table, which must hold the one valid commit and nothing else."""
    query = seeded.restart_query()
    path = query.store_dir / "config" / "consumerOffset.json"
    assert json.loads(path.read_text())["offsetTable"] == {"FuzzTopic@FuzzGroup": {"0": 1}}
