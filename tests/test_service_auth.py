"""The internal services refuse callers without the deployment's service credential.

With ``MQSTORE_SERVICE_TOKEN`` set, a direct call to the commitlog, indexer or query service without
it answers UNAUTHENTICATED and changes nothing, while the system (which passes the token on every
internal hop) works end to end through the gateway. Without a token an internal service refuses to
listen beyond loopback.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

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
from services.server.service_auth import METADATA_KEY, ServiceTokenError, load_service_token
from tests.commitlog.commitlog_process import CHANNEL_OPTIONS, commitlog_env, free_port, mqstore_command
from tests.gateway.system_process import start_up

TOKEN = "s3cret-deployment-token"


def test_token_from_env_and_file(tmp_path: Path) -> None:
    assert load_service_token({}) is None
    assert load_service_token({"MQSTORE_SERVICE_TOKEN": TOKEN}) == TOKEN
    secret = tmp_path / "token"
    secret.write_text(TOKEN + "\n")  # a mounted Secret often ends with a newline
    assert load_service_token({"MQSTORE_SERVICE_TOKEN_FILE": str(secret)}) == TOKEN
    for bad in ({"MQSTORE_SERVICE_TOKEN": " "}, {"MQSTORE_SERVICE_TOKEN": TOKEN + " "},
                {"MQSTORE_SERVICE_TOKEN_FILE": str(tmp_path / "missing")}):
        with pytest.raises(ServiceTokenError):
            load_service_token(bad)


def _refused(call: grpc.UnaryUnaryMultiCallable, request: object, metadata: tuple[tuple[str, str], ...] = ()) -> str:
    with pytest.raises(grpc.RpcError) as info:
        call(request, timeout=10, metadata=metadata)
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED, info.value
    return str(info.value.details())


def test_internal_services_refuse_calls_without_the_token(tmp_path: Path) -> None:
    system = start_up(tmp_path / "store", env_overrides={"MQSTORE_SERVICE_TOKEN": TOKEN})
    try:
        # The system itself passes the token on every hop: a send and a pull through the gateway work.
        sent = system.stub.Send(gateway_pb2.SendRequest(message=common_pb2.Message(
            topic="secured", body=b"hello", properties={"KEYS": "k1"})), timeout=30)
        assert sent.msg_id
        with grpc.insecure_channel(system.commitlog, options=CHANNEL_OPTIONS) as channel:
            commitlog = commitlog_pb2_grpc.CommitLogServiceStub(channel)
            before = commitlog.GetStoreInfo(commitlog_pb2.GetStoreInfoRequest(), timeout=10,
                                            metadata=((METADATA_KEY, TOKEN),)).max_offset
            detail = _refused(commitlog.Append, commitlog_pb2.AppendRequest(
                message=common_pb2.Message(topic="intruder", body=b"x")))
            assert "service credential" in detail and "MQSTORE_SERVICE_TOKEN" in detail
            _refused(commitlog.CreateTopic, commitlog_pb2.TopicRequest())
            _refused(commitlog.GetStoreInfo, commitlog_pb2.GetStoreInfoRequest(),
                     metadata=((METADATA_KEY, "wrong"),))
            after = commitlog.GetStoreInfo(commitlog_pb2.GetStoreInfoRequest(), timeout=10,
                                           metadata=((METADATA_KEY, TOKEN),)).max_offset
            assert after == before, "a refused call must change nothing"
            # Health stays open for probes.
            health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
            assert health.status == health_pb2.HealthCheckResponse.SERVING
        with grpc.insecure_channel(system.query, options=CHANNEL_OPTIONS) as channel:
            query = query_pb2_grpc.QueryServiceStub(channel)
            _refused(query.PullMessage, query_pb2.PullMessageRequest(topic="secured", queue_id=0))
        with grpc.insecure_channel(system.indexer, options=CHANNEL_OPTIONS) as channel:
            indexer = indexer_pb2_grpc.IndexerServiceStub(channel)
            _refused(indexer.ListQueues, indexer_pb2.ListQueuesRequest())
    finally:
        code = system.stop()
        system.kill_all()
    assert code == 0, system.logs()[-3000:]


def test_an_internal_service_without_a_token_refuses_a_public_address(tmp_path: Path) -> None:
    port = free_port()
    result = subprocess.run([*mqstore_command(), "serve", "commitlog", "--store", str(tmp_path / "store"),
                             "--listen", f"0.0.0.0:{port}"],
                            env=commitlog_env(), capture_output=True, timeout=60, check=False)
    assert result.returncode == 2, result.stderr[-2000:]
    assert b"without a service credential" in result.stderr
    assert b"Traceback" not in result.stderr
