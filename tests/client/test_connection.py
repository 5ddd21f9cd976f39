"""Connection details without a system: the bearer token on every call, addresses, error translation.

A fake MessagingService in this process records each call's metadata and refuses calls without the
expected token, as the gateway does with auth on.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest

from mqstore.client import Client, UnauthenticatedError
from mqstore.client.connection import resolve_address
from mqstore.client.errors import DataLossError, DeadlineExceededError, MqstoreError, error_for
from mqstore.v1 import commitlog_pb2

TOKEN = "s3cr3t"


class FakeGateway:
    def __init__(self) -> None:
        self.seen: list[str | None] = []

    def list_topics(self, request: Any, context: grpc.ServicerContext) -> Any:
        authorization = dict(context.invocation_metadata()).get("authorization")
        self.seen.append(authorization)  # type: ignore[arg-type]
        if authorization != f"Bearer {TOKEN}":
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "no valid bearer token: give one")
        return commitlog_pb2.ListTopicsResponse(topics=[{"topic": "t", "read_queue_nums": 1,
                                                         "write_queue_nums": 1, "perm": 6}])


@pytest.fixture(scope="module")
def fake() -> Iterator[tuple[FakeGateway, str]]:
    gateway = FakeGateway()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    handler = grpc.unary_unary_rpc_method_handler(
        gateway.list_topics, request_deserializer=commitlog_pb2.ListTopicsRequest.FromString,
        response_serializer=commitlog_pb2.ListTopicsResponse.SerializeToString)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "mqstore.v1.MessagingService", {"ListTopics": handler}),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield gateway, f"127.0.0.1:{port}"
    finally:
        server.stop(None)


def test_the_token_goes_with_every_call(fake: tuple[FakeGateway, str], monkeypatch: pytest.MonkeyPatch) -> None:
    gateway, address = fake
    monkeypatch.delenv("MQSTORE_TOKEN", raising=False)
    with Client(address, token=TOKEN) as client:
        assert [t.topic for t in client.topics()] == ["t"]
        client.topics()
    monkeypatch.setenv("MQSTORE_TOKEN", TOKEN)
    monkeypatch.setenv("MQSTORE_GATEWAY", address)
    with Client() as client:
        assert client.connection.address == address
        client.topics()
    assert gateway.seen[-3:] == [f"Bearer {TOKEN}"] * 3


def test_a_missing_token_is_unauthenticated(fake: tuple[FakeGateway, str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MQSTORE_TOKEN", raising=False)
    with Client(fake[1]) as client, pytest.raises(UnauthenticatedError, match="bearer token") as refused:
        client.topics()
    assert refused.value.code == "UNAUTHENTICATED"


def test_addresses_default_to_the_gateway_port(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MQSTORE_GATEWAY", raising=False)
    assert resolve_address() == "127.0.0.1:9876"
    assert resolve_address("mq.example") == "mq.example:9876"
    assert resolve_address("[::1]") == "[::1]:9876"
    assert resolve_address("[::1]:1234") == "[::1]:1234"
    monkeypatch.setenv("MQSTORE_GATEWAY", "10.0.0.1:9000")
    assert resolve_address() == "10.0.0.1:9000"


def test_timeouts_name_the_gateway() -> None:
    error = error_for(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded", "h:1", 2.5)
    assert isinstance(error, DeadlineExceededError)
    assert error.message == "the gateway at h:1 did not answer within 2.5 s"
    other = error_for(grpc.StatusCode.INTERNAL, "oops")
    assert type(other) is MqstoreError and str(other) == "INTERNAL: oops"
    lost = error_for(grpc.StatusCode.DATA_LOSS, "crc mismatch")
    assert type(lost) is DataLossError and str(lost) == "DATA_LOSS: crc mismatch"
