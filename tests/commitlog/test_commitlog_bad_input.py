"""Fuzzed bad input for every CommitLogService RPC, against one real server process.

Each case asserts the precise status code and that the store is unchanged afterwards (same min and
max offset, same topics). The server runs with autoCreateTopicEnable off, so an unknown topic is
NOT_FOUND and no rejected put can create a topic as a side effect.
"""

from __future__ import annotations

import string
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from mqstore.v1 import commitlog_pb2 as pb
from mqstore.v1 import common_pb2
from services.server.status import RefusedMessage, refused_message
from tests.commitlog.commitlog_process import CommitLogProcess, StartCommitLog
from tests.query.test_bad_input import producer_only_fields

MIB = 1024 * 1024
MAX_MESSAGE_SIZE = 16 * 1024
TOPIC = "Fuzz"
READ_ONLY_TOPIC = "ReadOnly"
QUEUES = 4
INT32 = (-(2**31), 2**31 - 1)
INT64 = (-(2**63), 2**63 - 1)
INVALID = grpc.StatusCode.INVALID_ARGUMENT
OUT_OF_RANGE = grpc.StatusCode.OUT_OF_RANGE
NOT_FOUND = grpc.StatusCode.NOT_FOUND

FUZZ = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow],
                database=None)


@dataclass(frozen=True)
class Fixture:
    server: CommitLogProcess = field(repr=False)
    records: list[pb.AppendResult] = field(repr=False)


@pytest.fixture(scope="module")
def fx(module_start_commitlog: StartCommitLog, tmp_path_factory: pytest.TempPathFactory) -> Fixture:
    store: Path = tmp_path_factory.mktemp("bad-input") / "store"
    server = module_start_commitlog(store, {"MQSTORE_MAX_MESSAGE_SIZE": str(MAX_MESSAGE_SIZE),
                                            "MQSTORE_AUTO_CREATE_TOPIC_ENABLE": "false"})
    stub = server.stub
    stub.CreateTopic(pb.TopicRequest(topic=common_pb2.TopicConfig(
        topic=TOPIC, read_queue_nums=QUEUES, write_queue_nums=QUEUES, perm=6)))
    stub.CreateTopic(pb.TopicRequest(topic=common_pb2.TopicConfig(
        topic=READ_ONLY_TOPIC, read_queue_nums=1, write_queue_nums=1, perm=4)))
    results = stub.AppendBatch(pb.AppendBatchRequest(messages=[good_message(i) for i in range(20)])).results
    return Fixture(server, list(results))


def good_message(i: int = 0) -> common_pb2.Message:
    return common_pb2.Message(topic=TOPIC, queue_id=i % QUEUES, body=f"good-{i}".encode() * 20,
                              properties={"KEYS": f"k{i}"})


def snapshot(server: CommitLogProcess) -> tuple[int, int, bytes]:
    info = server.stub.GetStoreInfo(pb.GetStoreInfoRequest(), timeout=10)
    topics = server.stub.ListTopics(pb.ListTopicsRequest(), timeout=10)
    return info.min_offset, info.max_offset, topics.SerializeToString(deterministic=True)


def assert_rejected(server: CommitLogProcess, call: Callable[[], object], code: grpc.StatusCode,
                    detail: str | None = None) -> grpc.RpcError:
    """``call`` fails with ``code`` (its details naming ``detail``) and the store did not change.
    Returns the failure."""
    before = snapshot(server)
    with pytest.raises(grpc.RpcError) as failure:
        call()
    assert failure.value.code() == code, failure.value.details()
    assert failure.value.details(), "an error must say what to fix"
    if detail is not None:
        assert detail in failure.value.details()
    assert snapshot(server) == before
    return failure.value


# -- strategies ----------------------------------------------------------------------------------

LEGAL = string.ascii_letters + string.digits + "%|_.-"
# Names of dots only are refused: a topic name becomes a directory (issue 17).
legal_topics = st.text(LEGAL, min_size=1, max_size=40).filter(
    lambda t: t not in (TOPIC, READ_ONLY_TOPIC) and set(t) != {"."}
    and not t.startswith(("%RETRY%", "%DLQ%", "RMQ_SYS_")) and t not in ("TBW102", "BenchmarkTest"))
long_topics = st.text(LEGAL, min_size=128, max_size=300)
illegal_topics = st.tuples(st.text(LEGAL, max_size=10), st.characters(exclude_characters=LEGAL),
                           st.text(max_size=10)).map("".join)
separators = st.sampled_from(["\x01", "\x02"])
with_separator = st.tuples(st.text(max_size=8), separators, st.text(max_size=8)).map("".join)
bad_queue_ids = st.integers(QUEUES, INT32[1]) | st.integers(INT32[0], -1)
bad_born_hosts = st.sampled_from(["nohost", "1.2.3.4", "1.2.3.4:70000", "1.2.3.4:-1", "300.1.1.1:80",
                                  "host.example:80", ":80"])

Case = tuple[common_pb2.Message, grpc.StatusCode]


def _message(**fields: object) -> common_pb2.Message:
    values: dict[str, object] = {"topic": TOPIC, "queue_id": 0, "body": b"body"}
    values.update(fields)
    return common_pb2.Message(**values)


bad_messages: st.SearchStrategy[Case] = st.one_of(
    st.just((_message(topic=""), INVALID)),
    long_topics.map(lambda t: (_message(topic=t), INVALID)),
    illegal_topics.map(lambda t: (_message(topic=t), INVALID)),
    legal_topics.map(lambda t: (_message(topic=t), NOT_FOUND)),
    bad_queue_ids.map(lambda q: (_message(queue_id=q), INVALID)),
    st.just((_message(topic=READ_ONLY_TOPIC), INVALID)),
    st.integers(32_768, 40_000).map(lambda n: (_message(properties={"big": "v" * n}), INVALID)),
    st.integers(1, 4096).map(lambda n: (_message(body=b"x" * (MAX_MESSAGE_SIZE + n)), INVALID)),
    with_separator.map(lambda k: (_message(properties={k: "value"}), INVALID)),
    with_separator.map(lambda v: (_message(properties={"name": v}), INVALID)),
    bad_born_hosts.map(lambda h: (_message(born_host=h), INVALID)),
    st.integers(INT64[0], -1).map(lambda t: (_message(born_timestamp=t), INVALID)),
    st.text(string.ascii_letters, min_size=1, max_size=5).map(
        lambda d: (_message(properties={"DELAY": d}), INVALID)),
    producer_only_fields.map(lambda fields: (_message(**fields), INVALID)),
)


# -- Append, AppendBatch, AppendStream -----------------------------------------------------------

@FUZZ
@given(case=bad_messages)
def test_append_rejects_bad_messages(fx: Fixture, case: Case) -> None:
    message, code = case
    assert_rejected(fx.server, lambda: fx.server.stub.Append(pb.AppendRequest(message=message), timeout=10), code)


@FUZZ
@given(case=bad_messages, goods=st.integers(0, 4), data=st.data())
def test_append_batch_rejects_the_whole_batch(fx: Fixture, case: Case, goods: int, data: st.DataObject) -> None:
    message, code = case
    position = data.draw(st.integers(0, goods))
    messages = [good_message(i) for i in range(goods)]
    messages.insert(position, message)
    detail = f"message #{position}" if code == INVALID and len(messages) > 1 else None
    error = assert_rejected(fx.server, lambda: fx.server.stub.AppendBatch(pb.AppendBatchRequest(messages=messages),
                                                                          timeout=10), code, detail)
    if detail is not None:
        # The position travels as the status's detail too, with the error as it reads for that message alone.
        assert refused_message(error) == RefusedMessage(position, error.details().replace(f"{detail}: ", "", 1))


@FUZZ
@given(case=bad_messages)
def test_append_stream_rejects_a_bad_first_message(fx: Fixture, case: Case) -> None:
    message, code = case

    def call() -> object:
        return list(fx.server.stub.AppendStream(iter([pb.AppendRequest(message=message)]), timeout=10))

    assert_rejected(fx.server, call, code, "message #0 of the stream")


def test_append_requests_without_a_message(fx: Fixture) -> None:
    stub = fx.server.stub
    assert_rejected(fx.server, lambda: stub.Append(pb.AppendRequest(), timeout=10), INVALID, "missing")
    assert_rejected(fx.server, lambda: list(stub.AppendStream(iter([pb.AppendRequest()]), timeout=10)), INVALID,
                    "message #0")


def test_append_batch_bounds(fx: Fixture) -> None:
    stub = fx.server.stub
    assert_rejected(fx.server, lambda: stub.AppendBatch(pb.AppendBatchRequest(), timeout=10), INVALID,
                    "no messages")
    too_many = pb.AppendBatchRequest(messages=[good_message(i) for i in range(1025)])
    assert_rejected(fx.server, lambda: stub.AppendBatch(too_many, timeout=10), INVALID, "1024")
    # Over the 64 MiB batch bound but within the transport limit: the servicer names the bound.
    big = pb.AppendBatchRequest(messages=[_message(body=b"x" * (32 * MIB + 256 * 1024))] * 2)
    assert_rejected(fx.server, lambda: stub.AppendBatch(big, timeout=30), INVALID, str(64 * MIB))
    # Over the transport limit (bound + 1 MiB): gRPC itself refuses to receive it.
    huge = pb.AppendBatchRequest(messages=[_message(body=b"x" * (34 * MIB))] * 2)
    assert_rejected(fx.server, lambda: stub.AppendBatch(huge, timeout=30), grpc.StatusCode.RESOURCE_EXHAUSTED)


# -- Read, ReadBatch -------------------------------------------------------------------------------

offsets = st.integers(*INT64) | st.integers(-10, 4096)
sizes = st.integers(*INT32) | st.integers(-5, 64)


def read_error(offset: int, size: int, max_offset: int) -> grpc.StatusCode | None:
    """The code the service must answer for a range, or None if the range may be fine."""
    if not 0 < size <= 64 * MIB or offset < 0:
        return INVALID
    if offset + size > max_offset:
        return OUT_OF_RANGE
    return None


@FUZZ
@given(offset=offsets, size=sizes)
def test_read_rejects_bad_ranges(fx: Fixture, offset: int, size: int) -> None:
    code = read_error(offset, size, snapshot(fx.server)[1])
    assume(code is not None)
    assert code is not None
    assert_rejected(fx.server, lambda: fx.server.stub.Read(pb.ReadRequest(offset=offset, size=size), timeout=10),
                    code)


@FUZZ
@given(offset=offsets, size=sizes, goods=st.integers(0, 3), data=st.data())
def test_read_batch_rejects_a_bad_range_naming_it(fx: Fixture, offset: int, size: int, goods: int,
                                                  data: st.DataObject) -> None:
    code = read_error(offset, size, snapshot(fx.server)[1])
    assume(code is not None and size <= 32 * MIB)  # bigger sizes would hit the total-bytes bound first
    assert code is not None
    ranges = [pb.ByteRange(offset=r.commitlog_offset, size=r.wrote_bytes) for r in fx.records[:goods]]
    position = data.draw(st.integers(0, goods))
    ranges.insert(position, pb.ByteRange(offset=offset, size=size))
    assert_rejected(fx.server, lambda: fx.server.stub.ReadBatch(pb.ReadBatchRequest(ranges=ranges), timeout=10),
                    code, f"range #{position}")


def test_read_batch_bounds(fx: Fixture) -> None:
    stub = fx.server.stub
    first = fx.records[0]
    one = pb.ByteRange(offset=first.commitlog_offset, size=first.wrote_bytes)
    assert_rejected(fx.server, lambda: stub.ReadBatch(pb.ReadBatchRequest(), timeout=10), INVALID, "no ranges")
    assert_rejected(fx.server, lambda: stub.ReadBatch(pb.ReadBatchRequest(ranges=[one] * 1025), timeout=10),
                    INVALID, "1024")
    big = [pb.ByteRange(offset=0, size=40 * MIB)] * 2
    assert_rejected(fx.server, lambda: stub.ReadBatch(pb.ReadBatchRequest(ranges=big), timeout=10), INVALID,
                    str(64 * MIB))


# -- Tail ------------------------------------------------------------------------------------------

def first_chunk(server: CommitLogProcess, request: pb.TailRequest) -> Callable[[], object]:
    def call() -> object:
        stream = server.stub.Tail(request, timeout=10)
        try:
            return next(stream)
        finally:
            stream.cancel()
    return call


@FUZZ
@given(from_offset=offsets, chunk=st.integers(*INT32), poll=st.integers(*INT32), data=st.data())
def test_tail_rejects_bad_requests(fx: Fixture, from_offset: int, chunk: int, poll: int,
                                   data: st.DataObject) -> None:
    max_offset = snapshot(fx.server)[1]
    if data.draw(st.booleans(), label="inside a record"):
        record = data.draw(st.sampled_from(fx.records))
        from_offset = record.commitlog_offset + data.draw(st.integers(1, record.wrote_bytes - 1))
    boundaries = {r.commitlog_offset for r in fx.records} | {max_offset}
    if chunk < 0 or chunk > 64 * MIB or poll < 0 or poll > 60_000 or from_offset < 0:
        code = INVALID
    elif from_offset > max_offset:
        code = OUT_OF_RANGE
    else:
        assume(from_offset not in boundaries)  # a valid start would tail, not fail
        code = INVALID
    request = pb.TailRequest(from_offset=from_offset, max_chunk_bytes=chunk, poll_wait_ms=poll)
    detail = str(from_offset) if code == OUT_OF_RANGE else None
    assert_rejected(fx.server, first_chunk(fx.server, request), code, detail)


# -- topics ----------------------------------------------------------------------------------------

queue_nums = st.integers(1, 1024)
bad_queue_nums = st.integers(INT32[0], 0) | st.integers(1025, INT32[1])
bad_perms = st.integers(*INT32).filter(lambda p: p not in (2, 4, 6)) | st.sampled_from([0, 1, 3, 5, 7, 8, 9])


def _config(topic: str = TOPIC, read: int = 4, write: int = 4, perm: int = 6) -> common_pb2.TopicConfig:
    return common_pb2.TopicConfig(topic=topic, read_queue_nums=read, write_queue_nums=write, perm=perm)


bad_configs = st.one_of(
    st.just(_config(topic="")),
    long_topics.map(lambda t: _config(topic=t)),
    illegal_topics.map(lambda t: _config(topic=t)),
    st.builds(_config, topic=legal_topics, read=bad_queue_nums, write=queue_nums),
    st.builds(_config, topic=legal_topics, read=queue_nums, write=bad_queue_nums),
    st.builds(_config, topic=legal_topics, perm=bad_perms),
    st.builds(_config, topic=st.just(TOPIC), perm=bad_perms),
)


@FUZZ
@given(config=bad_configs)
def test_create_topic_rejects_bad_configs(fx: Fixture, config: common_pb2.TopicConfig) -> None:
    assert_rejected(fx.server, lambda: fx.server.stub.CreateTopic(pb.TopicRequest(topic=config), timeout=10),
                    INVALID)


@FUZZ
@given(config=bad_configs)
def test_update_topic_rejects_bad_configs(fx: Fixture, config: common_pb2.TopicConfig) -> None:
    assert_rejected(fx.server, lambda: fx.server.stub.UpdateTopic(pb.TopicRequest(topic=config), timeout=10),
                    INVALID)


@FUZZ
@given(topic=legal_topics, read=queue_nums, write=queue_nums, perm=st.sampled_from([2, 4, 6]))
def test_update_of_an_unknown_topic_is_not_found(fx: Fixture, topic: str, read: int, write: int, perm: int) -> None:
    config = _config(topic, read, write, perm)
    assert_rejected(fx.server, lambda: fx.server.stub.UpdateTopic(pb.TopicRequest(topic=config), timeout=10),
                    NOT_FOUND, topic)


def test_create_existing_topic_and_missing_config(fx: Fixture) -> None:
    stub = fx.server.stub
    assert_rejected(fx.server, lambda: stub.CreateTopic(pb.TopicRequest(topic=_config()), timeout=10),
                    grpc.StatusCode.ALREADY_EXISTS, TOPIC)
    for call in (stub.CreateTopic, stub.UpdateTopic):
        assert_rejected(fx.server, lambda c=call: c(pb.TopicRequest(), timeout=10), INVALID, "missing")


def test_info_and_topics_answer_and_match(fx: Fixture) -> None:
    info = fx.server.stub.GetStoreInfo(pb.GetStoreInfoRequest(), timeout=10)
    last = fx.records[-1]
    assert info.max_offset >= last.commitlog_offset + last.wrote_bytes
    assert info.mapped_file_size == MIB and info.incarnation and info.store_host == "127.0.0.1:10911"
    assert 0 < info.disk_used_ratio < 1
    topics = fx.server.stub.ListTopics(pb.ListTopicsRequest(), timeout=10).topics
    assert [(t.topic, t.perm) for t in topics] == [(TOPIC, 6), (READ_ONLY_TOPIC, 4)]
