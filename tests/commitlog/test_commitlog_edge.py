"""The servicer's edge rules that a real process cannot be driven into cheaply: a flush timeout, the
peer address forms gRPC reports, the error-code table, and the JSON log format."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import Sequence
from types import SimpleNamespace

import grpc
import pytest

from mqstore.v1 import commitlog_pb2 as pb
from mqstore.v1 import common_pb2
from services.commitlog.put_result import PutMessageError, PutMessageResult, PutMessageStatus
from services.commitlog.servicer import CommitLogServicer
from services.server.logs import configure_logging
from services.server.peer import UNKNOWN_BORN_HOST, peer_address
from services.server.status import status_code_of
from services.store import errors
from services.store.formats.message import Message
from services.store.formats.socket_address import encode_address


class FakeContext:
    """A call's context: the status a handler ends it with."""

    code: grpc.StatusCode | None = None
    details = ""

    def peer(self) -> str:
        return "ipv4:127.0.0.1:5555"

    def set_code(self, code: grpc.StatusCode) -> None:
        self.code = code

    def set_details(self, details: str) -> None:
        self.details = details


class SlowFlushEngine:
    """Writes but never sees its group commit finish: every result is FLUSH_DISK_TIMEOUT."""

    config = SimpleNamespace(sync_flush_timeout=5000)
    commit_log = SimpleNamespace(sync_flush=True)
    max_offset = 0

    def put_messages(self, messages: Sequence[Message]) -> list[PutMessageResult]:
        host = encode_address("127.0.0.1:10911")
        return [PutMessageResult(PutMessageStatus.FLUSH_DISK_TIMEOUT, 100 * i, 100, i, 1, host, m.topic, m.queue_id)
                for i, m in enumerate(messages)]

    def put_each(self, messages: Sequence[Message]) -> list[PutMessageResult]:
        return self.put_messages(messages)


def test_flush_timeout_is_deadline_exceeded_for_append_and_a_status_in_a_batch() -> None:
    async def run() -> None:
        servicer = CommitLogServicer(SlowFlushEngine())  # type: ignore[arg-type]
        await servicer.start()
        message = common_pb2.Message(topic="T", body=b"x")
        try:
            context = FakeContext()
            assert await servicer.Append(pb.AppendRequest(message=message), context) is None
            assert context.code == grpc.StatusCode.DEADLINE_EXCEEDED
            assert "syncFlushTimeout" in context.details and "offset 0" in context.details
            response = await servicer.AppendBatch(pb.AppendBatchRequest(messages=[message, message]), FakeContext())
            assert [r.status for r in response.results] == [pb.PUT_MESSAGE_STATUS_FLUSH_DISK_TIMEOUT] * 2
        finally:
            await servicer.close()

    asyncio.run(run())


@pytest.mark.parametrize(("peer", "address"), [
    ("ipv4:127.0.0.1:12345", "127.0.0.1:12345"),
    ("ipv6:[::1]:123", "[::1]:123"),
    ("ipv6:%5B::1%5D:123", "[::1]:123"),
    ("unix:/tmp/socket", UNKNOWN_BORN_HOST),
    ("", UNKNOWN_BORN_HOST),
])
def test_peer_address(peer: str, address: str) -> None:
    assert peer_address(peer) == address


def test_every_domain_error_has_its_own_code() -> None:
    assert status_code_of(PutMessageError(PutMessageStatus.MESSAGE_ILLEGAL, "x")) == grpc.StatusCode.INVALID_ARGUMENT
    assert status_code_of(PutMessageError(PutMessageStatus.PROPERTIES_SIZE_EXCEEDED, "x")) == \
        grpc.StatusCode.INVALID_ARGUMENT
    expected = {
        errors.InvalidArgumentError: grpc.StatusCode.INVALID_ARGUMENT,
        errors.NotFoundError: grpc.StatusCode.NOT_FOUND,
        errors.OutOfRangeError: grpc.StatusCode.OUT_OF_RANGE,
        errors.UnavailableError: grpc.StatusCode.UNAVAILABLE,
        errors.ResourceExhaustedError: grpc.StatusCode.RESOURCE_EXHAUSTED,
        errors.AlreadyExistsError: grpc.StatusCode.ALREADY_EXISTS,
    }
    for kind, code in expected.items():
        assert status_code_of(kind("x")) == code


def test_logs_are_json_lines_with_extra_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MQSTORE_LOG_LEVEL", "warning")
    stream = io.StringIO()
    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    try:
        configure_logging(stream=stream)
        logging.getLogger("mqstore.test").info("hidden below WARNING")
        logging.getLogger("mqstore.test").warning("disk at %d%%", 91, extra={"store": "/data"})
    finally:
        root.handlers[:] = saved_handlers
        root.setLevel(saved_level)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1
    entry = json.loads(lines[0])
    assert entry["level"] == "WARNING" and entry["logger"] == "mqstore.test"
    assert entry["msg"] == "disk at 91%" and entry["store"] == "/data" and entry["ts"].endswith("+00:00")
