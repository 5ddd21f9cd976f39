"""Lookups by key next to a quarantined commitlog range: an intact record that ends exactly where the
range starts is found by UNIQ_KEY and by key, and the index hit of the lost record is skipped, not
an error for the whole query.

Real processes: the indexer and query services stop cleanly (the index keeps the lost record's entries),
the commitlog is killed, a byte of the middle record's body is flipped, and recovery quarantines it.
"""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from mqstore.v1 import commitlog_pb2, query_pb2
from tests.query.query_process import System, message

TOPIC = "NearQuarantine"
ENV = {"MQSTORE_FLUSH_DISK_TYPE": "SYNC_FLUSH", "MQSTORE_MAPPED_FILE_SIZE_COMMIT_LOG": str(1024 * 1024)}
UNIQ = ["0A00000100002A9F1B6D3586000000A1", "0A00000100002A9F1B6D3586000000A2", "0A00000100002A9F1B6D3586000000A3"]
BODY_AT = 84 + 4 + 2  # a byte inside the body ("record 1")


def flip(commitlog_dir: Path, offset: int) -> None:
    with open(commitlog_dir / f"{0:020d}", "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ 0x5A]))


@pytest.fixture(scope="module")
def quarantined(tmp_path_factory: pytest.TempPathFactory) -> tuple[System, list[commitlog_pb2.AppendResult]]:
    root = tmp_path_factory.mktemp("near-quarantine")
    system = System.start(root, ENV)
    try:
        acks = system.append([message(TOPIC, 0, f"record {i}".encode(), UNIQ_KEY=UNIQ[i], KEYS="near")
                              for i in range(3)])
        for service in (system.query, system.indexer):
            assert service.stop() == 0
        system.commitlog.kill9()
        flip(system.commitlog.store_dir / "commitlog", acks[1].commitlog_offset + BODY_AT)
        system = System.start(root, ENV)
        system.wait_dispatched()
    except BaseException:
        system.kill_all()
        raise
    yield system, acks
    try:
        system.stop()
    finally:
        system.kill_all()


def test_a_record_ending_at_a_quarantined_range_is_found_by_key(
        quarantined: tuple[System, list[commitlog_pb2.AppendResult]]) -> None:
    system, acks = quarantined
    info = system.commitlog.stub.GetStoreInfo(commitlog_pb2.GetStoreInfoRequest(), timeout=5)
    [lost] = info.quarantined_ranges
    assert (lost.start_offset, lost.end_offset) == (acks[1].commitlog_offset, acks[2].commitlog_offset)
    assert acks[0].commitlog_offset + acks[0].wrote_bytes == lost.start_offset
    stub = system.query.stub
    for kind in (query_pb2.MESSAGE_ID_KIND_UNIQ_KEY, query_pb2.MESSAGE_ID_KIND_UNSPECIFIED):
        found = stub.ViewMessage(query_pb2.ViewMessageRequest(msg_id=UNIQ[0], kind=kind), timeout=10)
        assert (found.message.body, found.message.commitlog_offset) == (b"record 0", acks[0].commitlog_offset)
    # The lost record's index hit is skipped: the others are still answered.
    response = stub.QueryMessage(query_pb2.QueryMessageRequest(topic=TOPIC, key="near"), timeout=10)
    assert [m.body for m in response.messages] == [b"record 0", b"record 2"]
    assert response.index_hits == 3


def test_the_lost_record_by_uniq_key_answers_data_loss(
        quarantined: tuple[System, list[commitlog_pb2.AppendResult]]) -> None:
    system, acks = quarantined
    with pytest.raises(grpc.RpcError) as lost:
        system.query.stub.ViewMessage(query_pb2.ViewMessageRequest(
            msg_id=UNIQ[1], kind=query_pb2.MESSAGE_ID_KIND_UNIQ_KEY), timeout=10)
    assert lost.value.code() == grpc.StatusCode.DATA_LOSS
    details = lost.value.details() or ""
    assert UNIQ[1] in details and "QUARANTINED" in details
