"""Bearer tokens at the gateway: UNAUTHENTICATED without a known token, PERMISSION_DENIED outside a
token's topics (a real system started with ``mqstore up --auth-file``)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from mqstore.v1 import commitlog_pb2, common_pb2, gateway_pb2, query_pb2
from tests.commitlog.commitlog_process import commitlog_env, free_port, mqstore_command
from tests.gateway.system_process import UpProcess, running_up

TOKENS = """
tokens:
  - name: orders-producer
    token: tok-orders-producer
    produce: ["orders", "orders-*"]
  - name: orders-consumer
    token: tok-orders-consumer
    consume: ["orders"]
  - name: ops
    token: tok-ops-admin-1
    admin: true
"""
PRODUCER = (("authorization", "Bearer tok-orders-producer"),)
CONSUMER = (("authorization", "Bearer tok-orders-consumer"),)
ADMIN = (("authorization", "bearer tok-ops-admin-1"),)


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpProcess]:
    root = tmp_path_factory.mktemp("auth")
    (root / "tokens.yaml").write_text(TOKENS)
    with running_up(root / "store", extra_args=["--auth-file", str(root / "tokens.yaml")]) as started:
        yield started


def message(topic: str) -> gateway_pb2.SendRequest:
    return gateway_pb2.SendRequest(message=common_pb2.Message(topic=topic, body=b"secret"))


def code_of(call: object, request: object, metadata: tuple[tuple[str, str], ...] | None) -> grpc.StatusCode:
    try:
        call(request, timeout=10, metadata=metadata)  # type: ignore[operator]
    except grpc.RpcError as error:
        return error.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


@pytest.mark.parametrize("metadata, fragment", [
    (None, "requires a token"),
    ((("authorization", "Bearer not-a-token"),), "unknown token"),
    ((("authorization", "Basic dXNlcjpwYXNz"),), "Bearer <token>"),
    ((("authorization", "Bearer tok-orders-producer "),), "whitespace"),  # not the producer's token
    ((("authorization", "Bearer  tok-orders-producer"),), "whitespace"),
])
def test_calls_without_a_known_token_are_unauthenticated(secured: UpProcess, metadata: tuple[tuple[str, str], ...],
                                                         fragment: str) -> None:
    for call, request in ((secured.stub.Send, message("orders")),
                          (secured.stub.Pull, query_pb2.PullMessageRequest(topic="orders")),
                          (secured.stub.ListTopics, commitlog_pb2.ListTopicsRequest())):
        with pytest.raises(grpc.RpcError) as error:
            call(request, timeout=10, metadata=metadata)  # type: ignore[operator]
        assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert fragment in (error.value.details() or "")
    with pytest.raises(grpc.RpcError) as error:
        list(secured.stub.SendStream(iter([message("orders")]), timeout=10, metadata=metadata))
    assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_tokens_may_do_what_their_lists_say_and_nothing_else(secured: UpProcess) -> None:
    stub = secured.stub
    assert code_of(stub.Send, message("orders"), PRODUCER) == grpc.StatusCode.OK
    assert code_of(stub.Send, message("orders-eu"), PRODUCER) == grpc.StatusCode.OK
    assert code_of(stub.Send, message("payments"), PRODUCER) == grpc.StatusCode.PERMISSION_DENIED
    assert code_of(stub.Send, message("orders"), CONSUMER) == grpc.StatusCode.PERMISSION_DENIED
    pull = query_pb2.PullMessageRequest(topic="orders", queue_id=0)
    assert code_of(stub.Pull, pull, CONSUMER) == grpc.StatusCode.OK
    assert code_of(stub.Pull, pull, PRODUCER) == grpc.StatusCode.PERMISSION_DENIED
    commit = query_pb2.UpdateConsumerOffsetRequest(consumer_group="g", topic="orders", queue_id=0, offset=0)
    assert code_of(stub.CommitOffset, commit, CONSUMER) == grpc.StatusCode.OK
    config = common_pb2.TopicConfig(topic="audit", read_queue_nums=1, write_queue_nums=1, perm=6)
    assert code_of(stub.CreateTopic, commitlog_pb2.TopicRequest(topic=config), PRODUCER) == \
        grpc.StatusCode.PERMISSION_DENIED
    assert code_of(stub.CreateTopic, commitlog_pb2.TopicRequest(topic=config), ADMIN) == grpc.StatusCode.OK
    listed = {t.topic for t in stub.ListTopics(commitlog_pb2.ListTopicsRequest(), timeout=10, metadata=CONSUMER).topics}
    assert listed == {"orders"}


def test_a_message_is_shown_only_to_tokens_that_may_consume_its_topic(secured: UpProcess) -> None:
    result = secured.stub.Send(message("payments"), timeout=10, metadata=ADMIN)
    view = query_pb2.ViewMessageRequest(msg_id=result.offset_msg_id)
    assert code_of(secured.stub.GetMessage, view, CONSUMER) == grpc.StatusCode.PERMISSION_DENIED
    assert code_of(secured.stub.GetMessage, view, ADMIN) == grpc.StatusCode.OK


def test_health_and_reflection_need_no_token(secured: UpProcess) -> None:
    health = health_pb2_grpc.HealthStub(secured.channel)
    assert health.Check(health_pb2.HealthCheckRequest(), timeout=10).status == health_pb2.HealthCheckResponse.SERVING


def _gateway_exit(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*mqstore_command(), "gateway", *args], env=commitlog_env(), capture_output=True,
                          text=True, timeout=60, cwd=tmp_path)


def test_a_gateway_refuses_to_start_without_tokens_off_loopback(tmp_path: Path) -> None:
    done = _gateway_exit(["--listen", f"0.0.0.0:{free_port()}"], tmp_path)
    assert done.returncode == 2
    assert "without tokens" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("content, fragment", [
    ("tokens: []\n", "at least one entry"),
    ("tokens:\n  - {name: a, token: short}\n", "at least 8 characters"),
    ("tokens:\n  - {name: a, token: long-enough-1, produce: orders}\n", "list of topic names"),
    ("tokens:\n  - {token: long-enough-1}\n  - {token: long-enough-1}\n", "repeats the token"),
    ("tokens:\n  - {token: 'long-enough-1 '}\n", "must not contain whitespace"),
])
def test_a_bad_token_file_stops_the_gateway_with_a_clear_error(tmp_path: Path, content: str, fragment: str) -> None:
    (tmp_path / "tokens.yaml").write_text(content)
    done = _gateway_exit(["--listen", f"127.0.0.1:{free_port()}", "--auth-file", str(tmp_path / "tokens.yaml")],
                         tmp_path)
    assert done.returncode == 2
    assert fragment in done.stderr and "Traceback" not in done.stderr
