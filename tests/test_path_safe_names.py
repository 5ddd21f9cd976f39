"""A topic or group name becomes a directory or a key of the store's files: ``.`` and ``..`` would
escape ``consumequeue/`` (the indexer wrote ``indexer/0/…``). Every edge refuses them, with the same
INVALID_ARGUMENT, and the store is left unchanged."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mqstore.v1 import (
    commitlog_pb2,
    commitlog_pb2_grpc,
    common_pb2,
    gateway_pb2,
    indexer_pb2,
    indexer_pb2_grpc,
    query_pb2,
    query_pb2_grpc,
)
from services.store.errors import InvalidArgumentError
from services.store.rules.names import check_group, check_producer_topic, check_topic_name
from tests.commitlog.commitlog_process import CHANNEL_OPTIONS
from tests.gateway.system_process import UpProcess, running_up

DOT_NAMES = (".", "..", "...")


@pytest.mark.parametrize("name", DOT_NAMES)
def test_dot_names_are_refused(name: str) -> None:
    for check in (check_topic_name, check_group):
        with pytest.raises(InvalidArgumentError, match="not a name"):
            check(name)


@given(st.text(alphabet="%|abcXYZ019_.-", min_size=1, max_size=127))
def test_a_legal_name_is_one_path_component(name: str) -> None:
    try:
        check_topic_name(name)
    except InvalidArgumentError:
        assert set(name) == {"."}
    else:
        assert "/" not in name and name not in (".", "..")
        assert Path("consumequeue", name).resolve().parent == Path("consumequeue").resolve()


@pytest.mark.parametrize("topic", ["SCHEDULE_TOPIC_XXXX", "TBW102", "RMQ_SYS_TRANS_HALF_TOPIC", "%RETRY%g", "%DLQ%g"])
def test_producers_may_not_send_to_system_topics(topic: str) -> None:
    with pytest.raises(InvalidArgumentError, match="producers may not send"):
        check_producer_topic(topic)


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpProcess]:
    with running_up(tmp_path_factory.mktemp("names") / "store") as started:
        yield started


def _invalid(call: object, request: object) -> str:
    with pytest.raises(grpc.RpcError) as info:
        call(request, timeout=10)  # type: ignore[operator]
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value
    return str(info.value.details())


@pytest.mark.parametrize("name", [".", ".."])
def test_every_edge_refuses_dot_names(system: UpProcess, name: str, tmp_path: Path) -> None:
    before = system.store_state()
    message = common_pb2.Message(topic=name, body=b"escape")
    assert "not a name" in _invalid(system.stub.Send, gateway_pb2.SendRequest(message=message))
    _invalid(system.stub.CreateTopic, commitlog_pb2.TopicRequest(
        topic=common_pb2.TopicConfig(topic=name, read_queue_nums=1, write_queue_nums=1, perm=6)))
    _invalid(system.stub.Pull, query_pb2.PullMessageRequest(topic=name))
    _invalid(system.stub.CommitOffset, query_pb2.UpdateConsumerOffsetRequest(consumer_group=name, topic="t"))
    with grpc.insecure_channel(system.commitlog, options=CHANNEL_OPTIONS) as channel:
        commitlog = commitlog_pb2_grpc.CommitLogServiceStub(channel)
        _invalid(commitlog.Append, commitlog_pb2.AppendRequest(message=message))
    with grpc.insecure_channel(system.indexer, options=CHANNEL_OPTIONS) as channel:
        indexer = indexer_pb2_grpc.IndexerServiceStub(channel)
        _invalid(indexer.GetQueueOffsets, indexer_pb2.GetQueueOffsetsRequest(topic=name, queue_id=0))
        _invalid(indexer.QueryByKey, indexer_pb2.QueryByKeyRequest(topic=name, key="k"))
    with grpc.insecure_channel(system.query, options=CHANNEL_OPTIONS) as channel:
        query = query_pb2_grpc.QueryServiceStub(channel)
        _invalid(query.PullMessage, query_pb2.PullMessageRequest(topic=name))
        _invalid(query.UpdateConsumerOffset, query_pb2.UpdateConsumerOffsetRequest(consumer_group=name, topic="t"))
    assert system.store_state() == before
    assert not (system.store / "indexer" / "0").exists()
