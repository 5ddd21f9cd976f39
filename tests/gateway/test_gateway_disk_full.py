"""A full disk through the gateway (``mqstore up`` on a real small filesystem): sends fail with
RESOURCE_EXHAUSTED naming the disk and its use, no commitlog file is left half-created, and sends
succeed again once space is freed."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from mqstore.v1 import common_pb2, gateway_pb2
from tests.commitlog.small_disk import MIB, fill, small_filesystem, until_accepted
from tests.gateway.system_process import start_up

FILE_SIZE = 2 * MIB
ENV = {
    "MQSTORE_MAPPED_FILE_SIZE_COMMIT_LOG": str(FILE_SIZE),
    "MQSTORE_MAPPED_FILE_SIZE_CONSUME_QUEUE": "6000",
    "MQSTORE_MAX_HASH_SLOT_NUM": "100",
    "MQSTORE_MAX_INDEX_NUM": "400",
    "MQSTORE_FLUSH_INTERVAL_CONSUME_QUEUE": "200",  # the disk state is refreshed this often
    "MQSTORE_CLEAN_RESOURCE_INTERVAL": "3600000",  # no file deletion racing the test
}


def test_sends_on_a_full_disk_are_resource_exhausted_then_resume(tmp_path: Path) -> None:
    with small_filesystem(tmp_path, 40) as disk:
        # The store is the mount itself, so the system's log (next to the store) stays off the full disk.
        up = start_up(disk, ENV)
        try:
            batch = gateway_pb2.SendBatchRequest(messages=[common_pb2.Message(topic="full", body=b"f" * 30_000)] * 8)
            up.stub.SendBatch(batch, timeout=10)
            fill(disk / "ballast", leave_bytes=5 * FILE_SIZE)
            with pytest.raises(grpc.RpcError) as refused:
                for _ in range(1000):
                    up.stub.SendBatch(batch, timeout=10)
            details = refused.value.details() or ""
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, refused.value
            assert "disk full" in details and str(disk) in details and "% used" in details, details
            files = {p.name: p.stat().st_size for p in (disk / "commitlog").iterdir()}
            assert set(files.values()) == {FILE_SIZE}, f"no half-created file: {files}"
            (disk / "ballast").unlink()
            until_accepted(lambda: up.stub.SendBatch(batch, timeout=10), timeout_s=15)
            assert "Errno 28" not in up.logs() and "Traceback" not in up.logs(), up.logs()[-5000:]
            assert up.stop() == 0, up.logs()[-5000:]
        finally:
            up.kill_all()
