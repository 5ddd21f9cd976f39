"""A range the leader quarantined is quarantined on every replica (``services/store/formats/quarantine.py``).

Real processes: a leader whose store has one damaged acknowledged record (a flipped body byte: a CRC
mismatch; or a flipped magic code: no record at all) quarantines it when it starts again after a
kill -9; a fresh follower then copies the whole log. It takes the leader's ranges at the handshake, so
it copies the damaged bytes as they are (its log stays byte-identical) and never reads them as a
record: its reads of them answer DATA_LOSS as the leader's do, its indexer skips them as the leader's
does (the ConsumeQueue and IndexFile equal the leader's), and the records after the range replicate.
Without it a damaged magic code stopped replication there for good, and a damaged body was indexed
and served by the follower (and by any follower promoted later) as if it were a record.
"""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from mqstore.v1 import commitlog_pb2, common_pb2
from tests.commitlog.commitlog_process import StartCommitLog, free_port
from tests.commitlog.replicas import (
    AUTH,
    assert_same_commitlog,
    follower_env,
    index_replicas,
    leader_env,
    max_offset,
    wait_caught_up,
)

TOPIC = "QuarantinedHa"
COUNT = 300
VICTIM = 150
#: Where the damage goes, from the victim record's start: a byte of its body (the record has IPv4 hosts,
#: so its body starts at 88), or its magic code.
DAMAGE = {"body": 84 + 4 + 10, "magic": 4}


def _message(i: int) -> common_pb2.Message:
    return common_pb2.Message(topic=TOPIC, queue_id=i % 2, body=b"q%04d-" % i * 20, properties={"KEYS": f"q{i}"})


def _flip(store: Path, offset: int) -> None:
    with open(store / "commitlog" / f"{0:020d}", "r+b") as f:  # every record is in the first file
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ 0x5A]))


def _ranges(info: commitlog_pb2.GetStoreInfoResponse) -> list[tuple[int, int]]:
    return [(r.start_offset, r.end_offset) for r in info.quarantined_ranges]


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_follower_copies_a_quarantined_range_and_never_reads_it(start_commitlog: StartCommitLog, tmp_path: Path,
                                                                  damage: str) -> None:
    ha_port = free_port()
    env = leader_env(ha_port, MQSTORE_BROKER_ROLE="ASYNC_MASTER", MQSTORE_FLUSH_DISK_TYPE="SYNC_FLUSH")
    leader = start_commitlog(tmp_path / "leader", env)
    acks: list[commitlog_pb2.AppendResult] = []
    for first in range(0, COUNT, 50):
        batch = commitlog_pb2.AppendBatchRequest(messages=[_message(i) for i in range(first, first + 50)])
        acks.extend(leader.stub.AppendBatch(batch, timeout=30, metadata=AUTH).results)
    end = max_offset(leader)
    leader.kill9()
    bad = acks[VICTIM]
    _flip(tmp_path / "leader", bad.commitlog_offset + DAMAGE[damage])

    leader = start_commitlog(tmp_path / "leader", env)
    info = leader.stub.GetStoreInfo(commitlog_pb2.GetStoreInfoRequest(), timeout=10, metadata=AUTH)
    assert info.max_offset == end
    assert _ranges(info) == [(bad.commitlog_offset, acks[VICTIM + 1].commitlog_offset)]
    follower = start_commitlog(tmp_path / "follower", follower_env(ha_port))
    wait_caught_up(leader, follower)
    after = commitlog_pb2.AppendBatchRequest(messages=[_message(i) for i in range(COUNT, COUNT + 20)])
    leader.stub.AppendBatch(after, timeout=30, metadata=AUTH)  # the stream goes on past the range
    end = wait_caught_up(leader, follower)
    assert_same_commitlog(tmp_path / "leader", tmp_path / "follower", end)

    ours = follower.stub.GetStoreInfo(commitlog_pb2.GetStoreInfoRequest(), timeout=10, metadata=AUTH)
    assert _ranges(ours) == _ranges(info), "the follower does not know the range its leader quarantined"
    with pytest.raises(grpc.RpcError) as lost:
        follower.stub.Read(commitlog_pb2.ReadRequest(offset=bad.commitlog_offset, size=bad.wrote_bytes),
                           timeout=10, metadata=AUTH)
    assert lost.value.code() == grpc.StatusCode.DATA_LOSS and "QUARANTINED" in (lost.value.details() or "")
    next_record = acks[VICTIM + 1]
    read = follower.stub.Read(commitlog_pb2.ReadRequest(offset=next_record.commitlog_offset,
                                                        size=next_record.wrote_bytes), timeout=10, metadata=AUTH)
    assert _message(VICTIM + 1).body in read.data
    built = index_replicas({tmp_path / "leader-indexer": leader, tmp_path / "follower-indexer": follower}, end)
    differ = sorted(k for k in built[0].keys() | built[1].keys() if built[0].get(k) != built[1].get(k))
    assert differ == [], f"the follower's ConsumeQueue/IndexFile differ from the leader's: {differ[:10]}"

    # The follower keeps the range across a restart (its own quarantine file), as the leader does.
    assert follower.stop() == 0
    follower = start_commitlog(tmp_path / "follower", follower_env(ha_port))
    ours = follower.stub.GetStoreInfo(commitlog_pb2.GetStoreInfoRequest(), timeout=10, metadata=AUTH)
    assert _ranges(ours) == _ranges(info)
