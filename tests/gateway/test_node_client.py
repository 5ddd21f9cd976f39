"""The gateway contract from another language: the Node.js client in clients/node (@grpc/grpc-js and
@grpc/proto-loader over proto/ alone) against a real ``mqstore up`` system, checked from Python.

Node's answers are compared field for field with Python's view of the same messages in proto3's JSON
mapping (int64 as decimal strings, enums as names, bytes as base64), which is what the Node client
prints. Needs ``node`` and clients/node/node_modules (``make node-deps``; ``make test`` runs it).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message as ProtoMessage

from mqstore.v1 import common_pb2, gateway_pb2, query_pb2
from tests.gateway.system_process import GATEWAY_SERVICE, UpProcess

REPO = Path(__file__).resolve().parents[2]
CLIENT_DIR = REPO / "clients" / "node"
DEMO = CLIENT_DIR / "demo.js"
BIG_INT64 = 2**53 + 1  # not representable as a JS number: must cross as the string "9007199254740993"
WAIT_S = 10.0


@pytest.fixture(scope="module")
def node() -> str:
    path = shutil.which("node")
    if path is None:
        pytest.fail("node is not on PATH: the Node.js client test needs Node 18+")
    if not (CLIENT_DIR / "node_modules" / ".package-lock.json").exists():
        pytest.fail("clients/node/node_modules is missing: run `make node-deps`")
    return path


def run_node(node: str, address: str, *args: str, expect_code: int = 0) -> list[dict[str, Any]]:
    """``node demo.js ARGS --address ADDRESS``: its JSON lines, after checking its exit code."""
    env = {k: v for k, v in os.environ.items() if k not in ("MQSTORE_TOKEN", "MQSTORE_GATEWAY")}
    proc = subprocess.run([node, str(DEMO), *args, "--address", address], capture_output=True, text=True,
                          timeout=60, check=False, cwd=CLIENT_DIR, env=env)
    assert proc.returncode == expect_code, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]


def only(events: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [e for e in events if e["event"] == name]


def as_json(message: ProtoMessage) -> dict[str, Any]:
    """A message as the Node client prints it: proto field names, every field, proto3 JSON values."""
    return MessageToDict(message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)


def eventually(what: str, attempt: Callable[[], Any]) -> Any:
    """Polls ``attempt`` until it returns something truthy (the indexer builds indexes just after a send)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            result = attempt()
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.NOT_FOUND:
                raise
            result = None
        if result:
            return result
        assert time.monotonic() < deadline, f"{what} did not happen within {WAIT_S}s"
        time.sleep(0.05)


def pull_one(up: UpProcess, topic: str, queue_id: int, queue_offset: int) -> query_pb2.StoredMessage:
    response = up.stub.Pull(query_pb2.PullMessageRequest(topic=topic, queue_id=queue_id, queue_offset=queue_offset,
                                                         max_messages=1, long_poll_ms=3000), timeout=10)
    assert len(response.messages) == 1, response
    return response.messages[0]


def test_node_sends_pulls_gets_and_queries(up: UpProcess, node: str) -> None:
    events = run_node(node, up.gateway, "demo", "--topic", "node-demo", "--count", "4", "--key-prefix", "node-rt")
    assert only(events, "summary") == [{"event": "summary", "ok": True, "topic": "node-demo", "sent": 4, "pulled": 4,
                                        "found_by_id": True, "found_by_key": True}]
    sends = [e["response"] for e in only(events, "send")]
    assert len(sends) == 4
    node_pulled = {m["uniq_key"]: m for e in only(events, "pull") for m in e["response"]["messages"]}
    for i, sent in enumerate(sends):
        assert sent["status"] == "PUT_MESSAGE_STATUS_PUT_OK" and len(sent["msg_id"]) == 32
        # int64 fields arrive in Node as decimal strings; int32 fields as numbers.
        assert isinstance(sent["queue_offset"], str) and isinstance(sent["store_timestamp"], str)
        assert isinstance(sent["queue_id"], int)
        stored = pull_one(up, "node-demo", sent["queue_id"], int(sent["queue_offset"]))
        # What Node sent, as Python reads it back.
        assert stored.body == f"hello from node #{i} (node-rt)".encode()
        assert (stored.keys, stored.tags, stored.uniq_key) == (f"node-rt-{i}", "TagNode", sent["msg_id"])
        assert stored.msg_id == sent["offset_msg_id"]
        assert str(stored.store_timestamp) == sent["store_timestamp"]
        assert str(stored.queue_offset) == sent["queue_offset"]
        # What Node pulled is exactly what Python pulls.
        assert node_pulled[sent["msg_id"]] == as_json(stored)
    first = sends[0]
    [got] = only(events, "get")
    assert got["response"]["found_by"] == "MESSAGE_ID_KIND_UNIQ_KEY"
    assert got["response"]["message"]["uniq_key"] == first["msg_id"]
    [queried] = only(events, "query")
    assert [m["keys"] for m in queried["response"]["messages"]] == ["node-rt-0"]


def test_node_names_uniq_key_and_offset_msg_id_as_send_returned_them(up: UpProcess, node: str) -> None:
    [sent] = run_node(node, up.gateway, "send", "--topic", "node-ids", "--body", "ids", "--keys", "node-ids-1",
                      "--queue-id", "0")
    ids = (sent["response"]["uniq_key"], sent["response"]["offset_msg_id"])
    assert len(ids[0]) == 32 and len(ids[1]) == 32
    assert sent["response"]["msg_id"] == ids[0], "SendResult.msg_id: the deprecated alias of uniq_key"
    [pulled] = run_node(node, up.gateway, "pull", "--topic", "node-ids", "--queue-id", "0", "--long-poll-ms", "3000")
    [by_uniq_key] = run_node(node, up.gateway, "get", "--msg-id", ids[0], "--wait-ms", "5000")
    [by_offset_id] = run_node(node, up.gateway, "get", "--msg-id", ids[1])
    [keyed] = run_node(node, up.gateway, "query", "--topic", "node-ids", "--key", "node-ids-1", "--wait-ms", "5000")
    messages = [*pulled["response"]["messages"], by_uniq_key["response"]["message"],
                by_offset_id["response"]["message"], *keyed["response"]["messages"]]
    assert len(messages) == 4
    for message in messages:
        assert (message["uniq_key"], message["offset_msg_id"]) == ids, message
        assert message["msg_id"] == ids[1], "StoredMessage.msg_id: the deprecated alias of offset_msg_id"

@pytest.fixture(scope="module")
def python_sent(up: UpProcess) -> list[gateway_pb2.SendResult]:
    """Three messages Python sent to queue 1 of topic py-to-node, once the indexer has indexed them."""
    bodies = [bytes(range(256)), "héllo, wörld ✓".encode(), b"\x00"]
    results = []
    for i, body in enumerate(bodies):
        message = common_pb2.Message(topic="py-to-node", body=body, born_timestamp=BIG_INT64 + i, flag=7,
                                     properties={"KEYS": f"py-key-{i} shared-key", "TAGS": f"Tag{i}", "color": "blue"})
        results.append(up.stub.Send(gateway_pb2.SendRequest(message=message, queue_id=1), timeout=10))
    for i, result in enumerate(results):
        eventually("the UNIQ_KEY index", lambda r=result: up.stub.GetMessage(
            query_pb2.ViewMessageRequest(msg_id=r.msg_id, topic="py-to-node"), timeout=10))
        eventually("the KEYS index", lambda i=i: up.stub.QueryByKey(
            query_pb2.QueryMessageRequest(topic="py-to-node", key=f"py-key-{i}"), timeout=10).messages)
    return results


def test_node_pulls_what_python_sent(up: UpProcess, node: str, python_sent: list[gateway_pb2.SendResult]) -> None:
    [pulled] = run_node(node, up.gateway, "pull", "--topic", "py-to-node", "--queue-id", "1", "--offset", "0")
    expected = up.stub.Pull(query_pb2.PullMessageRequest(topic="py-to-node", queue_id=1, queue_offset=0), timeout=10)
    assert pulled["response"] == as_json(expected)
    messages = pulled["response"]["messages"]
    assert [m["uniq_key"] for m in messages] == [r.msg_id for r in python_sent]
    assert base64.b64decode(messages[0]["body"]) == bytes(range(256))
    assert base64.b64decode(messages[1]["body"]).decode() == "héllo, wörld ✓"
    assert messages[2]["body"] == "AA=="
    # int64 beyond 2^53 is exact in Node because it stays a string.
    assert [m["born_timestamp"] for m in messages] == [str(BIG_INT64 + i) for i in range(3)]
    assert pulled["response"]["next_begin_offset"] == "3" and pulled["response"]["max_offset"] == "3"
    assert pulled["response"]["status"] == "GET_MESSAGE_STATUS_FOUND"


def test_node_gets_python_messages_by_msg_id(up: UpProcess, node: str,
                                             python_sent: list[gateway_pb2.SendResult]) -> None:
    for result in python_sent:
        [by_uniq_key] = run_node(node, up.gateway, "get", "--msg-id", result.msg_id)
        expected = up.stub.GetMessage(query_pb2.ViewMessageRequest(msg_id=result.msg_id), timeout=10)
        assert by_uniq_key["response"] == as_json(expected)
        assert by_uniq_key["response"]["found_by"] == "MESSAGE_ID_KIND_UNIQ_KEY"
        [by_offset_id] = run_node(node, up.gateway, "get", "--msg-id", result.offset_msg_id, "--topic", "py-to-node")
        assert by_offset_id["response"]["found_by"] == "MESSAGE_ID_KIND_OFFSET"
        assert by_offset_id["response"]["message"] == by_uniq_key["response"]["message"]


def test_node_queries_python_messages_by_key(up: UpProcess, node: str,
                                             python_sent: list[gateway_pb2.SendResult]) -> None:
    [one] = run_node(node, up.gateway, "query", "--topic", "py-to-node", "--key", "py-key-1")
    assert [m["uniq_key"] for m in one["response"]["messages"]] == [python_sent[1].msg_id]
    expected = up.stub.QueryByKey(query_pb2.QueryMessageRequest(topic="py-to-node", key="py-key-1"), timeout=10)
    assert one["response"] == as_json(expected)
    [shared] = run_node(node, up.gateway, "query", "--topic", "py-to-node", "--key", "shared-key")
    assert [m["uniq_key"] for m in shared["response"]["messages"]] == [r.msg_id for r in python_sent]


@pytest.mark.parametrize(("args", "code", "call", "mentions"), [
    (["send", "--topic", "", "--body", "x"], grpc.StatusCode.INVALID_ARGUMENT,
     lambda s: s.Send(gateway_pb2.SendRequest(message=common_pb2.Message(topic="", body=b"x")), timeout=10), "topic"),
    (["send", "--topic", "bad/topic", "--body", "x"], grpc.StatusCode.INVALID_ARGUMENT,
     lambda s: s.Send(gateway_pb2.SendRequest(message=common_pb2.Message(topic="bad/topic", body=b"x")), timeout=10),
     "bad/topic"),
    (["query", "--topic", "py-to-node", "--key", ""], grpc.StatusCode.INVALID_ARGUMENT,
     lambda s: s.QueryByKey(query_pb2.QueryMessageRequest(topic="py-to-node", key=""), timeout=10), "key"),
    (["pull", "--topic", "py-to-node", "--queue-id", "999"], grpc.StatusCode.OUT_OF_RANGE,
     lambda s: s.Pull(query_pb2.PullMessageRequest(topic="py-to-node", queue_id=999), timeout=10), "999"),
    (["route", "--topic", "no-such-topic"], grpc.StatusCode.NOT_FOUND,
     lambda s: s.GetRoute(gateway_pb2.GetRouteRequest(topic="no-such-topic"), timeout=10), "no-such-topic"),
], ids=["empty-topic", "illegal-topic", "empty-key", "queue-out-of-range", "unknown-topic"])
def test_node_sees_the_gateways_status_and_message(up: UpProcess, node: str, python_sent: list[gateway_pb2.SendResult],
                                                   args: list[str], code: grpc.StatusCode,
                                                   call: Callable[[Any], Any], mentions: str) -> None:
    with pytest.raises(grpc.RpcError) as raised:
        call(up.stub)
    assert raised.value.code() == code
    [error] = run_node(node, up.gateway, *args, expect_code=1)
    assert error["event"] == "error"
    assert (error["code"], error["status"]) == (code.value[0], code.name)
    assert error["details"] == raised.value.details()
    assert mentions in error["details"]


class _RecordingRoutes:
    """A stand-in MessagingService whose GetRoute records the metadata of each call."""

    def __init__(self) -> None:
        self.metadata: list[dict[str, str]] = []

    def get_route(self, request: gateway_pb2.GetRouteRequest, context: grpc.ServicerContext) -> gateway_pb2.TopicRoute:
        self.metadata.append({k: str(v) for k, v in context.invocation_metadata()})
        return gateway_pb2.TopicRoute(topic=request.topic, queues=[gateway_pb2.QueueRoute(queue_id=0, shard="s")])


@pytest.fixture
def recording_gateway() -> Iterator[tuple[str, _RecordingRoutes]]:
    routes = _RecordingRoutes()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    handler = grpc.unary_unary_rpc_method_handler(routes.get_route,
                                                  request_deserializer=gateway_pb2.GetRouteRequest.FromString,
                                                  response_serializer=gateway_pb2.TopicRoute.SerializeToString)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(GATEWAY_SERVICE, {"GetRoute": handler}),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}", routes
    finally:
        server.stop(None)


def test_node_sends_the_bearer_token(node: str, recording_gateway: tuple[str, _RecordingRoutes]) -> None:
    address, routes = recording_gateway
    [with_token] = run_node(node, address, "route", "--topic", "t", "--token", "s3cret")
    assert with_token["response"]["topic"] == "t"
    [_] = run_node(node, address, "route", "--topic", "t")
    assert routes.metadata[0]["authorization"] == "Bearer s3cret"
    assert "authorization" not in routes.metadata[1]
