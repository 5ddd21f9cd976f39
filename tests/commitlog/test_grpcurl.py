"""The real grpcurl against a real service: reflection is enough to discover and call every RPC."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from services.store.formats.message_id import decode_message_id
from tests.commitlog.commitlog_process import CommitLogProcess

GRPCURL = shutil.which("grpcurl", path=str(Path(sys.executable).parent)) or shutil.which("grpcurl")
pytestmark = pytest.mark.skipif(GRPCURL is None, reason="grpcurl is not installed (make setup installs it)")


def grpcurl(address: str, *command: str, data: object = None) -> str:
    """``grpcurl -plaintext [-d JSON] ADDRESS COMMAND...``; asserts success and returns stdout."""
    assert GRPCURL is not None
    flags = ["-d", json.dumps(data)] if data is not None else []
    done = subprocess.run([GRPCURL, "-plaintext", *flags, address, *command],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_reflection_lists_and_describes_the_services(module_commitlog: CommitLogProcess) -> None:
    services = grpcurl(module_commitlog.address, "list").split()
    assert {"mqstore.v1.CommitLogService", "grpc.health.v1.Health"} <= set(services)
    described = grpcurl(module_commitlog.address, "describe", "mqstore.v1.CommitLogService")
    for rpc in ("Append", "AppendBatch", "AppendStream", "Read", "ReadBatch", "Tail", "GetStoreInfo"):
        assert f"rpc {rpc}" in described


def test_append_and_read_back_with_grpcurl(module_commitlog: CommitLogProcess) -> None:
    body = base64.b64encode(b"hello from grpcurl").decode()
    request = {"message": {"topic": "CurlTopic", "queue_id": 0, "body": body, "properties": {"KEYS": "curl-1"}}}
    result = json.loads(grpcurl(module_commitlog.address, "mqstore.v1.CommitLogService/Append", data=request))
    assert result["status"] == "PUT_MESSAGE_STATUS_PUT_OK", result
    offset = int(result.get("commitlog_offset", 0))  # grpcurl prints proto field names, omits zeros
    assert decode_message_id(result["msg_id"])[1] == offset
    read = json.loads(grpcurl(module_commitlog.address, "mqstore.v1.CommitLogService/Read",
                              data={"offset": offset, "size": result["wrote_bytes"]}))
    assert b"hello from grpcurl" in base64.b64decode(read["data"])
    health = json.loads(grpcurl(module_commitlog.address, "grpc.health.v1.Health/Check",
                                data={"service": "mqstore.v1.CommitLogService"}))
    assert health["status"] == "SERVING"
