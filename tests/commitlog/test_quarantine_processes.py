"""One flipped byte in an acknowledged record, kill -9, restart: the records after it stay (issue 17, item 9).

Real processes (commitlog, indexer, query) over gRPC loopback, SYNC_FLUSH. 2,000 acknowledged messages,
a byte of record 1,000's body flipped on disk (a CRC mismatch), every service killed with SIGKILL and
started again. Under recoverCorruptionMode: quarantine (the default) records 1,001..2,000 are still
found by pull and by offset msg id, record 1,000 answers DATA_LOSS, new sends go after the end of the
log, and a restart keeps the quarantine. Under ``cut`` (RocketMQ's rule) the later records are gone.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import grpc
import pytest

from mqstore.v1 import commitlog_pb2, query_pb2
from tests.query.query_process import System, message

TOPIC = "QuarantineTopic"
COUNT = 2000
VICTIM = 999  # record 1,000
BODY = 84 + 4 + 10  # a byte inside a record's body
ENV = {
    "MQSTORE_FLUSH_DISK_TYPE": "SYNC_FLUSH",
    "MQSTORE_MAPPED_FILE_SIZE_COMMIT_LOG": str(1024 * 1024),  # one file: a kill -9 recovery walks all of it
    "MQSTORE_MAPPED_FILE_SIZE_CONSUME_QUEUE": str(300 * 20),
}


def pull_all(system: System, start: int, stop: int) -> tuple[list[bytes], int, grpc.RpcError | None]:
    """Bodies pulled from queue offset ``start`` until ``stop`` or an error: (bodies, next offset, error)."""
    bodies: list[bytes] = []
    offset = start
    while offset < stop:
        try:
            response = system.query.stub.PullMessage(query_pb2.PullMessageRequest(
                topic=TOPIC, queue_id=0, queue_offset=offset, max_messages=256), timeout=10)
        except grpc.RpcError as exc:
            return bodies, offset, exc
        bodies.extend(m.body for m in response.messages)
        if response.next_begin_offset == offset:
            break
        offset = response.next_begin_offset
    return bodies, offset, None


def view(system: System, msg_id: str) -> query_pb2.ViewMessageResponse:
    return system.query.stub.ViewMessage(query_pb2.ViewMessageRequest(
        msg_id=msg_id, kind=query_pb2.MESSAGE_ID_KIND_OFFSET), timeout=10)


def flip(store: Path, offset: int) -> None:
    with open(store / "commitlog" / f"{0:020d}", "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ 0x5A]))


@pytest.mark.parametrize("mode", ["quarantine", "quarantine-reindexed", "cut"])
def test_a_flipped_byte_costs_one_record_not_every_later_one(tmp_path: Path, mode: str) -> None:
    """``quarantine``: the indexer had dispatched everything, so its unit for record 1,000 is voided
    when it learns of the range. ``quarantine-reindexed``: the indexer's root is lost with the crash,
    so it rebuilds from the start across the quarantine skip and fills the lost queue offset."""
    reindexed = mode == "quarantine-reindexed"
    mode = mode.partition("-")[0]
    env = {**ENV, "MQSTORE_RECOVER_CORRUPTION_MODE": mode}
    bodies = [f"m{i:04d}-".encode() * 8 for i in range(COUNT)]
    system = System.start(tmp_path, env)
    try:
        acks: list[commitlog_pb2.AppendResult] = []
        for first in range(0, COUNT, 200):
            acks.extend(system.append([message(TOPIC, 0, body) for body in bodies[first:first + 200]]))
        assert all(a.status == commitlog_pb2.PUT_MESSAGE_STATUS_PUT_OK for a in acks)
        end = acks[-1].commitlog_offset + acks[-1].wrote_bytes
        system.kill_all()
        bad = acks[VICTIM]
        flip(system.commitlog.store_dir, bad.commitlog_offset + BODY)
        if reindexed:
            shutil.rmtree(system.indexer.store_dir)
        system = System.start(tmp_path, env)
        system.wait_dispatched()
        info = system.commitlog.stub.GetStoreInfo(commitlog_pb2.GetStoreInfoRequest(), timeout=5)
        if mode == "cut":  # RocketMQ's rule: the log ends at the damaged record
            assert info.max_offset == bad.commitlog_offset and not info.quarantined_ranges
            with pytest.raises(grpc.RpcError) as lost:
                view(system, acks[VICTIM + 1].msg_id)
            assert lost.value.code() == grpc.StatusCode.NOT_FOUND
            sent = system.append([message(TOPIC, 0, b"after")])[0]
            assert sent.commitlog_offset == bad.commitlog_offset  # written over the lost records
            return
        assert info.max_offset == end
        [bad_range] = info.quarantined_ranges
        assert (bad_range.start_offset, bad_range.end_offset) == \
            (bad.commitlog_offset, acks[VICTIM + 1].commitlog_offset)
        assert bad_range.reason.startswith("body CRC mismatch")
        # The lost record's queue offset holds a filler unit (the unit built before the crash was
        # voided; a rebuilding indexer fills the gap): a pull skips it, no unit points into the range.
        pulled, _, error = pull_all(system, 0, COUNT)
        assert error is None and pulled == bodies[:VICTIM] + bodies[VICTIM + 1:]
        # By offset msg id: every later record is found; the damaged one answers DATA_LOSS.
        for i in (VICTIM - 1, VICTIM + 1, VICTIM + 2, COUNT // 2 + 500, COUNT - 1):
            assert view(system, acks[i].msg_id).message.body == bodies[i]
        with pytest.raises(grpc.RpcError) as lost:
            view(system, bad.msg_id)
        assert lost.value.code() == grpc.StatusCode.DATA_LOSS and "QUARANTINED" in (lost.value.details() or "")
        # New sends go after the end of the log, not over the range.
        sent = system.append([message(TOPIC, 0, b"after")])[0]
        assert sent.commitlog_offset == end and sent.queue_offset == COUNT
        system.stop()
        # A clean restart keeps the quarantine.
        system = System.start(tmp_path, env)
        info = system.commitlog.stub.GetStoreInfo(commitlog_pb2.GetStoreInfoRequest(), timeout=5)
        assert [(r.start_offset, r.end_offset) for r in info.quarantined_ranges] == \
            [(bad_range.start_offset, bad_range.end_offset)]
        with pytest.raises(grpc.RpcError) as lost:
            view(system, bad.msg_id)
        assert lost.value.code() == grpc.StatusCode.DATA_LOSS
        assert view(system, acks[VICTIM + 1].msg_id).message.body == bodies[VICTIM + 1]
    finally:
        system.kill_all()
