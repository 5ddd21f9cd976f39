"""A producer may send only what a producer may set: transaction bits, unknown sys_flag bits,
negative numbers, a garbage UNIQ_KEY and system topics are INVALID_ARGUMENT at the gateway and at
the commitlog service, and nothing is written (before, a prepared-transaction sys_flag answered
PUT_OK with a queue offset the next message was given too)."""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from mqstore.v1 import commitlog_pb2, commitlog_pb2_grpc, common_pb2, gateway_pb2
from tests.commitlog.commitlog_process import CHANNEL_OPTIONS
from tests.gateway.system_process import UpProcess, running_up

BAD: list[tuple[dict[str, Any], str]] = [
    ({"sys_flag": 0x4}, "transaction flow"),
    ({"sys_flag": 0xC}, "transaction flow"),
    ({"sys_flag": 0x8}, "transaction flow"),
    ({"sys_flag": -1}, "may not set"),
    ({"sys_flag": 0x7FFFFFFF}, "may not set"),
    ({"flag": -1}, "flag -1 is negative"),
    ({"reconsume_times": -3}, "reconsume_times -3 is negative"),
    ({"prepared_transaction_offset": -5}, "prepared_transaction_offset -5 is negative"),
    ({"born_timestamp": -1}, "born_timestamp -1 is negative"),
    ({"properties": {"UNIQ_KEY": "not-a-key"}}, "32 (IPv4 producer) or 56"),
    ({"properties": {"UNIQ_KEY": "A" * 10_000}}, "32 (IPv4 producer) or 56"),
    ({"topic": "SCHEDULE_TOPIC_XXXX"}, "system topic"),
    ({"topic": "TBW102"}, "system topic"),
    ({"topic": "RMQ_SYS_TRANS_HALF_TOPIC"}, "system topic"),
    ({"topic": "%RETRY%billing"}, "retry or dead-letter"),
    ({"topic": "%DLQ%billing"}, "retry or dead-letter"),
]


def message(**fields: Any) -> common_pb2.Message:
    values: dict[str, Any] = {"topic": "producer-rules", "body": b"payload"}
    values.update(fields)
    return common_pb2.Message(**values)


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpProcess]:
    with running_up(tmp_path_factory.mktemp("producer") / "store") as started:
        yield started


def _refused(call: Any, request: Any) -> str:
    with pytest.raises(grpc.RpcError) as info:
        call(request, timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value
    return str(info.value.details())


@pytest.mark.parametrize("fields, fragment", BAD, ids=[str(f) [:40] for f, _ in BAD])
def test_what_a_producer_may_not_send_is_refused_everywhere(system: UpProcess, fields: dict[str, Any],
                                                            fragment: str) -> None:
    before = system.store_state()
    bad = message(**fields)
    assert fragment in _refused(system.stub.Send, gateway_pb2.SendRequest(message=bad))
    batch = _refused(system.stub.SendBatch, gateway_pb2.SendBatchRequest(messages=[message(), bad]))
    assert "message #1" in batch and fragment in batch
    with grpc.insecure_channel(system.commitlog, options=CHANNEL_OPTIONS) as channel:
        commitlog = commitlog_pb2_grpc.CommitLogServiceStub(channel)
        assert fragment in _refused(commitlog.Append, commitlog_pb2.AppendRequest(message=bad))
        assert fragment in _refused(commitlog.AppendBatch, commitlog_pb2.AppendBatchRequest(messages=[message(), bad]))
        with pytest.raises(grpc.RpcError) as stream:
            list(commitlog.AppendStream(iter([commitlog_pb2.AppendRequest(message=bad)]), timeout=10))
        assert stream.value.code() == grpc.StatusCode.INVALID_ARGUMENT and fragment in str(stream.value.details())
    assert system.store_state() == before


def test_what_a_producer_may_set_is_kept(system: UpProcess) -> None:
    allowed = message(sys_flag=0x301, flag=7, properties={"UNIQ_KEY": "0A0B0C0D0000AAAA0000000000000001"},
                      body=zlib.compress(b"payload"))
    result = system.stub.Send(gateway_pb2.SendRequest(message=allowed), timeout=10)
    assert result.msg_id == "0A0B0C0D0000AAAA0000000000000001"
    lz4 = system.stub.Send(gateway_pb2.SendRequest(message=message(sys_flag=0x101, body=b"no codec here")), timeout=10)
    assert lz4.status == commitlog_pb2.PUT_MESSAGE_STATUS_PUT_OK  # stored as sent, read back flagged


@pytest.mark.parametrize("body, fragment", [
    (b"payload", "the body is not zlib data"),
    (b"x", "the body ends before its zlib stream does"),
    (zlib.compress(b"payload") + b"\x00", "the body has 1 bytes after the end of its zlib stream"),
])
def test_a_compressed_body_that_does_not_inflate_is_refused(system: UpProcess, body: bytes, fragment: str) -> None:
    """Acknowledged, it would read back as its stored bytes, still compressed: refused at the send instead."""
    before = system.store_state()
    bad = message(sys_flag=0x1, body=body)
    detail = _refused(system.stub.Send, gateway_pb2.SendRequest(message=bad))
    assert fragment in detail and "send it zlib-compressed whole" in detail and "clear the compressed flag" in detail
    with pytest.raises(grpc.RpcError) as stream:
        list(system.stub.SendStream(iter([gateway_pb2.SendRequest(message=bad)]), timeout=10))
    assert stream.value.code() == grpc.StatusCode.INVALID_ARGUMENT and fragment in str(stream.value.details())
    assert system.store_state() == before


def test_a_request_over_the_limit_is_invalid_not_busy(system: UpProcess) -> None:
    """RESOURCE_EXHAUSTED means "back off and retry": a client following it would resend forever."""
    huge = [message(body=b"x" * (24 * 1024 * 1024)) for _ in range(3)]  # 72 MiB in one SendBatch
    before = system.store_state()
    detail = _refused(system.stub.SendBatch, gateway_pb2.SendBatchRequest(messages=huge))
    assert "over the gateway's limit of 67108864 bytes (64 MiB)" in detail
    assert system.store_state() == before


def test_the_client_does_not_retry_a_size_limit() -> None:
    from mqstore.client.errors import MqstoreError

    assert not MqstoreError("RESOURCE_EXHAUSTED", "Received message larger than max (300 vs. 268435456)").retryable
    assert MqstoreError("RESOURCE_EXHAUSTED", "disk full: ...").retryable
