"""Pulls over a commitlog whose oldest files were deleted: MESSAGE_WAS_REMOVING while the indexer
still lists the units, OFFSET_TOO_SMALL once it corrected its min offset, OFFSET_OVERFLOW_BADLY to
the max offset when the min offset is not 0. ViewMessage and QueryMessage skip deleted records."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from mqstore.v1 import commitlog_pb2, query_pb2
from tests.query.query_process import System, message, running_system, wait_until

MIB = 1024 * 1024
# 1 MiB files deleted as soon as they are flushed: expired at once, "disk over 0% full", checked often.
DELETING_ENV = {
    "MQSTORE_MAPPED_FILE_SIZE_COMMIT_LOG": str(MIB),
    "MQSTORE_FILE_RESERVED_TIME": "0",
    "MQSTORE_DISK_MAX_USED_SPACE_RATIO": "0",
    "MQSTORE_CLEAN_RESOURCE_INTERVAL": "100",
    "MQSTORE_FLUSH_INTERVAL_CONSUME_QUEUE": "100",
    "MQSTORE_FLUSH_INTERVAL_COMMIT_LOG": "100",
    "MQSTORE_FLUSH_COMMIT_LOG_LEAST_PAGES": "0",
}
Status = query_pb2.GetMessageStatus


@pytest.fixture
def deleting(tmp_path: Path) -> Iterator[System]:
    with running_system(tmp_path, DELETING_ENV) as started:
        yield started


def pull(system: System, offset: int) -> tuple[str, int, int, int, int]:
    response = system.query.stub.PullMessage(query_pb2.PullMessageRequest(topic="Old", queue_id=0,
                                                                          queue_offset=offset), timeout=10)
    return (Status.Name(response.status), response.next_begin_offset, response.min_offset, response.max_offset,
            len(response.messages))


def test_pulls_over_deleted_commitlog_files(deleting: System) -> None:
    body = bytes(8 * 1024)
    results = []
    for _ in range(5):  # about 2.6 MiB: files 0 and 1 fill up and are deleted
        results += deleting.append([message("Old", 0, body, KEYS="old-key") for _ in range(64)])
    stub = deleting.commitlog.stub
    wait_until(lambda: stub.GetStoreInfo(commitlog_pb2.GetStoreInfoRequest()).min_offset >= 2 * MIB, timeout_s=30)
    first_alive = next(r.queue_offset for r in results if r.commitlog_offset >= 2 * MIB)
    total = len(results)

    # The indexer corrects its min offset only when it (re)connects: its first units point at nothing.
    assert pull(deleting, 0) == ("GET_MESSAGE_STATUS_MESSAGE_WAS_REMOVING", 32, 0, total, 0)
    assert pull(deleting, first_alive)[0] == "GET_MESSAGE_STATUS_FOUND"
    view = deleting.query.stub.ViewMessage
    with pytest.raises(grpc.RpcError) as info:
        view(query_pb2.ViewMessageRequest(msg_id=results[0].msg_id), timeout=5)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    assert view(query_pb2.ViewMessageRequest(msg_id=results[-1].msg_id), timeout=5).message.queue_offset == total - 1
    found = deleting.query.stub.QueryMessage(query_pb2.QueryMessageRequest(topic="Old", key="old-key", max_num=64))
    assert [m.queue_offset for m in found.messages] == list(range(total - 64, total))

    deleting.restart_indexer()
    deleting.wait_dispatched()
    wait_until(lambda: _status_or_unavailable(deleting) == "GET_MESSAGE_STATUS_OFFSET_TOO_SMALL")
    assert pull(deleting, 0) == ("GET_MESSAGE_STATUS_OFFSET_TOO_SMALL", first_alive, first_alive, total, 0)
    assert pull(deleting, total + 10) == ("GET_MESSAGE_STATUS_OFFSET_OVERFLOW_BADLY", total, first_alive, total, 0)
    status, next_offset, *_, count = pull(deleting, first_alive)
    assert (status, next_offset) == ("GET_MESSAGE_STATUS_FOUND", first_alive + count)
    assert count == 31  # 256 KiB of 8 KiB bodies


def _status_or_unavailable(system: System) -> str:
    """Right after the indexer's restart the query service may still be reconnecting (UNAVAILABLE: retry)."""
    try:
        return pull(system, 0)[0]
    except grpc.RpcError as exc:
        if exc.code() != grpc.StatusCode.UNAVAILABLE:
            raise
        return "UNAVAILABLE"
