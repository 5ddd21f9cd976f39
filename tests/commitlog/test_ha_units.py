"""The replication modules without processes: the follower's whole-record appends, SYNC_MASTER's
wait, the handshake's checks and the replication settings (services/commitlog/ha/)."""

from __future__ import annotations

import random
import socket
import threading
import time
from pathlib import Path

import pytest
from prometheus_client import REGISTRY, generate_latest

from services.commitlog.ha import handshake
from services.commitlog.ha.epoch_file import EpochEntry
from services.commitlog.ha.group_transfer import GroupTransfer, ReplicaAckError
from services.commitlog.ha.ha_metrics import bind_followers
from services.commitlog.ha.ha_service import HAService, HAServiceError
from services.commitlog.ha.replica_append import ReplicaAppender, ReplicationError, whole_records
from services.commitlog.ha.wire import encode_report
from services.commitlog.message_store import MessageStore
from services.commitlog.put_result import PutMessageStatus
from services.store.config import ConfigError, load_config
from services.store.errors import FailedPreconditionError
from services.store.formats.message import Message
from services.store.formats.quarantine import QuarantinedRange, QuarantineTable

FILE_SIZE = 64 * 1024


def _engine(root: Path, **overrides: object) -> MessageStore:
    engine = MessageStore(load_config(environ={}, mapped_file_size_commit_log=FILE_SIZE, max_message_size=16 * 1024,
                                   **overrides), root)
    engine.start()
    return engine


def test_a_follower_fed_in_arbitrary_cuts_holds_the_leaders_log_and_queue_table(tmp_path: Path) -> None:
    leader = _engine(tmp_path / "leader")
    follower = _engine(tmp_path / "follower")
    try:
        rng = random.Random(7)
        for i in range(300):  # several files, each ending with a BLANK
            leader.put_messages([Message("T", i % 3, rng.randbytes(rng.randrange(1, 2000)), properties={"KEYS": str(i)})
                                 for _ in range(rng.randrange(1, 4))])
        appender = ReplicaAppender(follower.commit_log)
        offset = 0
        while offset < leader.max_offset:  # as the leader streams: never across a file, cut anywhere
            mapped = leader.commit_log.mfq.find_by_offset(offset)
            assert mapped is not None
            position = offset - mapped.file_from_offset
            size = min(rng.randrange(1, 5000), mapped.read_position - position)
            end = appender.append(offset, mapped.read(position, size))
            offset += size
            assert end <= offset and end == follower.max_offset
        assert follower.max_offset == leader.max_offset
        ours_files, theirs_files = leader.commit_log.mfq.files, follower.commit_log.mfq.files
        assert [m.path.name for m in theirs_files] == [m.path.name for m in ours_files]
        for ours, theirs in zip(ours_files, theirs_files, strict=True):
            assert ours.read(0, ours.read_position) == theirs.read(0, theirs.read_position)
        assert follower.commit_log.queue_table == leader.commit_log.queue_table
        with pytest.raises(ReplicationError, match="expects"):
            appender.append(offset + 8, b"x" * 8)
    finally:
        leader.shutdown()
        follower.shutdown()


def test_whole_records_refuses_bytes_that_are_no_record() -> None:
    with pytest.raises(ReplicationError, match="no record"):
        whole_records(b"\x00\x00\x00\x10garbage!" * 2, 0, FILE_SIZE)
    assert whole_records(b"\x00\x00", 0, FILE_SIZE) == (0, -1)


def test_a_slave_refuses_puts_naming_its_leader(tmp_path: Path) -> None:
    engine = _engine(tmp_path, broker_role="SLAVE", ha_master_address="10.0.0.9:10912")
    try:
        engine.commit_log.write_refusal = FailedPreconditionError("a replica: send to the leader 10.0.0.9:10912")
        with pytest.raises(FailedPreconditionError, match="10.0.0.9:10912"):
            engine.put_message(Message("T", 0, b"x"))
        assert engine.max_offset == 0
    finally:
        engine.shutdown()


def _transfer(timeout_s: float = 0.3, leader_max: int = 1000) -> GroupTransfer:
    return GroupTransfer("shard-x", lambda: leader_max, followers_needed=1, timeout_s=timeout_s,
                         fallbehind_max=500)


def test_sync_master_without_a_follower_in_sync_refuses_at_once_naming_them() -> None:
    transfer = _transfer()
    with pytest.raises(ReplicaAckError) as none:
        transfer.wait_for_replicas(1000)
    assert none.value.status is PutMessageStatus.SLAVE_NOT_AVAILABLE
    assert "shard shard-x" in str(none.value) and "none connected" in str(none.value)
    far = transfer.add("10.0.0.5:4000")
    transfer.acknowledge(far, 100)  # 900 bytes behind: more than haSlaveFallbehindMax
    started = time.monotonic()
    with pytest.raises(ReplicaAckError) as behind:
        transfer.wait_for_replicas(1000)
    assert time.monotonic() - started < 0.2
    assert behind.value.status is PutMessageStatus.SLAVE_NOT_AVAILABLE
    assert "10.0.0.5:4000 (at offset 100, lag 900 bytes)" in str(behind.value)
    transfer.remove(far)
    with pytest.raises(ReplicaAckError, match=r"gone: 10.0.0.5:4000 \(disconnected"):
        transfer.wait_for_replicas(1000)


def test_sync_master_waits_for_the_follower_then_times_out() -> None:
    transfer = _transfer()
    follower = transfer.add("10.0.0.6:4000")
    transfer.acknowledge(follower, 900)
    threading.Timer(0.05, transfer.acknowledge, (follower, 1000)).start()
    transfer.wait_for_replicas(1000)  # returns once the follower reports the put's end
    with pytest.raises(ReplicaAckError) as slow:
        transfer.wait_for_replicas(1100)
    assert slow.value.status is PutMessageStatus.FLUSH_SLAVE_TIMEOUT
    assert "10.0.0.6:4000 (at offset 1000" in str(slow.value)


def test_the_handshake_checks_token_shard_and_epoch() -> None:
    good = handshake.Hello("shard-x", 0, b"tok")
    handshake.check_hello(good, "shard-x", 0, "tok")
    for hello, why in ((handshake.Hello("shard-x", 0, b"tok2"), "service token"),
                       (handshake.Hello("shard-y", 0, b"tok"), "shard"),
                       (handshake.Hello("shard-x", 3, b"tok"), "epoch")):
        with pytest.raises(handshake.HandshakeRefused, match=why):
            handshake.check_hello(hello, "shard-x", 0, "tok")
    with pytest.raises(handshake.HandshakeRefused, match="service token"):
        handshake.check_hello(handshake.Hello("shard-x", 0, b"x"), "shard-x", 0, None)


@pytest.mark.parametrize(("settings", "why"), [
    ({"broker_role": "SLAVE"}, "haMasterAddress"),
    ({"broker_role": "SYNC_MASTER"}, "haListenPort"),
    ({"broker_role": "MASTER"}, "brokerRole"),
    ({"ha_protocol": "4.9.8"}, "haProtocol"),
    ({"broker_role": "SLAVE", "ha_master_address": "leader"}, "host:port"),
])
def test_bad_replication_settings_say_what_to_fix(settings: dict[str, object], why: str) -> None:
    with pytest.raises(ConfigError, match=why):
        load_config(environ={}, **settings)


def test_followers_lag_is_exported_when_scraped() -> None:
    transfer = _transfer(leader_max=1000)
    transfer.acknowledge(transfer.add("10.0.0.7:4000"), 600)
    bind_followers(transfer, lambda: 1000)
    text = generate_latest(REGISTRY).decode()
    assert ('mqstore_commitlog_ha_follower_lag_bytes{follower="10.0.0.7:4000",replica="10.0.0.7:4000",'
            'shard="shard-x"} 400.0') in text
    assert 'mqstore_commitlog_ha_connected_followers{shard="shard-x"} 1.0' in text
    assert 'mqstore_commitlog_ha_followers_needed{shard="shard-x"} 1.0' in text


def test_the_ha_listener_refuses_a_busy_port_and_a_public_address_without_a_token(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        engine = _engine(tmp_path / "a", ha_listen_port=port)
        try:
            with pytest.raises(HAServiceError, match=f"127.0.0.1:{port}"):
                HAService(engine.commit_log, None).start()
        finally:
            engine.shutdown()
    engine = _engine(tmp_path / "b", ha_listen_port=port, broker_ip="10.1.2.3")
    try:
        with pytest.raises(HAServiceError, match="MQSTORE_SERVICE_TOKEN"):
            HAService(engine.commit_log, None).start()
    finally:
        engine.shutdown()


def test_a_follower_copies_a_range_its_leader_quarantined_whole_and_never_parses_it(tmp_path: Path) -> None:
    """The leader's damaged bytes (a record garbled whole: no size, no magic code) are adopted as
    quarantined before the stream and copied as they are, whatever the cuts; the queue table is the
    leader's."""
    leader = _engine(tmp_path / "leader")
    follower = _engine(tmp_path / "follower")
    try:
        results = [leader.put_messages([Message("T", i % 2, b"m%d" % i * 30)])[0] for i in range(200)]
        lost = results[120]
        mapped = leader.commit_log.mfq.find_by_offset(lost.commitlog_offset)
        assert mapped is not None
        bad = QuarantinedRange(lost.commitlog_offset, lost.commitlog_offset + lost.wrote_bytes, "test")
        leader.quarantine.adopt([bad])
        at = bad.start - mapped.file_from_offset
        mapped.buffer[at:at + bad.size] = b"\xee" * bad.size  # its size and magic code too: no record at all
        appender = ReplicaAppender(follower.commit_log)
        appender.adopt_quarantine(leader.quarantine.ranges, "leader")
        assert follower.quarantine.ranges == (bad,)
        rng = random.Random(3)
        offset = 0
        while offset < leader.max_offset:
            mapped = leader.commit_log.mfq.find_by_offset(offset)
            assert mapped is not None
            position = offset - mapped.file_from_offset
            size = min(rng.randrange(1, 700), mapped.read_position - position)
            offset += size
            assert appender.append(offset - size, mapped.read(position, size)) <= offset
        assert follower.max_offset == leader.max_offset
        ours, theirs = leader.commit_log.mfq.files[0], follower.commit_log.mfq.files[0]
        assert ours.read(0, ours.read_position) == theirs.read(0, theirs.read_position)
        assert follower.commit_log.queue_table == leader.commit_log.queue_table
    finally:
        leader.shutdown()
        follower.shutdown()


def test_the_handshake_carries_the_leaders_quarantined_ranges_from_version_3() -> None:
    log = handshake.LeaderLog(9000, [EpochEntry(1, 0), EpochEntry(2, 4096)],
                              (QuarantinedRange(100, 340, "body CRC mismatch"), QuarantinedRange(5000, 5100, "")))
    for version, ranges in ((2, ()), (3, log.quarantined)):
        ours, theirs = socket.socketpair()
        try:
            ours.sendall(handshake.encode_answer(handshake.ACCEPTED, leader_log=log, version=version))
            handshake.read_answer(theirs)
            got = handshake.read_leader_log(theirs, version)
        finally:
            ours.close()
            theirs.close()
        assert (got.max_offset, got.epochs, got.quarantined) == (9000, log.epochs, ranges)


def test_a_quarantine_table_adopts_ranges_and_forgets_those_past_a_cut(tmp_path: Path) -> None:
    table = QuarantineTable(tmp_path)
    first, second = QuarantinedRange(100, 200, "a"), QuarantinedRange(500, 700, "b")
    assert table.adopt([first]) == [first]
    assert table.adopt([first, second]) == [second]  # what it knew is not new
    table.forget_from(600)  # a range across the cut ends there, one past it goes
    assert table.ranges == (first, QuarantinedRange(500, 600, "b"))
    table.forget_from(150)
    assert table.ranges == (QuarantinedRange(100, 150, "a"),)
    reloaded = QuarantineTable(tmp_path)
    reloaded.load()
    assert reloaded.ranges == table.ranges


def test_a_report_read_before_the_writer_recorded_its_send_counts_once_it_has(tmp_path: Path) -> None:
    """The leader counts a report only up to what its writer thread has recorded as sent, which it does
    once ``sendall`` returns; an honest follower's report of a frame can be read before that. Such a
    report used to be counted at the sent offset of the moment and then forgotten, so the put waited
    for the follower's next report (a heartbeat later: about one SYNC_MASTER put in a hundred waited
    500 ms under load). Here a report ahead of everything stands in for it: the put must be
    acknowledged as soon as its bytes are sent, not time out."""
    port = _free_port()
    engine = _engine(tmp_path / "leader", broker_role="SYNC_MASTER", ha_listen_port=port, ha_send_timeout=2000,
                     broker_name="shard-x")
    service = HAService(engine.commit_log, "tok")
    service.start()
    try:
        with socket.create_connection(("127.0.0.1", port)) as follower:
            follower.sendall(handshake.encode_hello(handshake.Hello("shard-x", 0, b"tok", "f1")))
            handshake.read_answer(follower)
            handshake.read_leader_log(follower)
            follower.sendall(encode_report(0))  # the stream starts at 0
            follower.sendall(encode_report(1 << 40))  # read by the leader before any byte is sent
            time.sleep(0.3)
            started = time.monotonic()
            result = engine.put_messages([Message("T", 0, b"x" * 100)])[0]
            assert result.status is PutMessageStatus.PUT_OK
            assert time.monotonic() - started < 1.0
    finally:
        service.stop()
        engine.shutdown()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
