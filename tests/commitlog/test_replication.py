"""Replication on RocketMQ 4.9.8's HA protocol, with real processes: a SYNC_MASTER leader and its
followers on loopback (services/commitlog/ha/, docs/replication.md).

At every stop point each follower's commitlog equals the leader's byte for byte up to the follower's
offset, and the indexers of leader and follower build the same ConsumeQueue and IndexFile bytes.
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import grpc
import pytest

from mqstore.v1 import admin_pb2, commitlog_pb2, common_pb2, indexer_pb2
from services.commitlog.ha import handshake
from services.commitlog.ha.wire import encode_report
from tests.commitlog.commitlog_process import CommitLogProcess, StartCommitLog, free_port
from tests.commitlog.replicas import (
    AUTH,
    BASE_ENV,
    FILE_SIZE,
    TOKEN,
    Producers,
    append,
    assert_same_commitlog,
    follower_env,
    index_replicas,
    leader_env,
    logic_files,
    max_offset,
    message,
    start_group,
    stop_indexers,
    wait_caught_up,
    wait_indexed,
)
from tests.indexer.indexer_process import IndexerProcess, start_indexer


def test_sync_master_followers_hold_every_acked_byte(start_commitlog: StartCommitLog, tmp_path: Path) -> None:
    group = start_group(start_commitlog, tmp_path, followers=2)
    leader = group.leader
    producers = Producers(leader).start()
    try:
        # A stop point while producers run: every follower equals the leader up to its own offset.
        deadline = time.monotonic() + 20
        for follower in group.followers:
            while (reached := max_offset(follower)) == 0:
                assert time.monotonic() < deadline, (producers.errors[:3], follower.logs()[-2000:])
                time.sleep(0.05)
            assert_same_commitlog(leader.store_dir, follower.store_dir, reached)
        while max_offset(leader) < 2 * FILE_SIZE + 1000:  # files rolled
            time.sleep(0.1)
    finally:
        producers.stop()
    assert not producers.errors, producers.errors[:3]
    assert producers.acked
    streamed = list(leader.stub.AppendStream(iter([commitlog_pb2.AppendRequest(message=message(i)) for i in range(40)]),
                                             timeout=30, metadata=AUTH))
    assert len(streamed) == 40
    for follower in group.followers:
        end = wait_caught_up(leader, follower)
        assert_same_commitlog(leader.store_dir, follower.store_dir, end)
        # Every acknowledged record was on this follower when it was acknowledged; it still is.
        assert max(o + s for o, s in producers.acked) <= end

    with pytest.raises(grpc.RpcError) as refused:
        append(group.followers[0], message(0))
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert f"127.0.0.1:{group.ha_port}" in (refused.value.details() or "")

    # The follower's own indexer builds what the leader's builds, byte for byte.
    end = max_offset(leader)
    # Each replica's indexer reads its own commitlog service's Tail.
    ours, theirs = index_replicas({tmp_path / "leader-indexer": leader,
                                   tmp_path / "follower-indexer": group.followers[0]}, end)
    assert any(name.startswith("index#") for name in ours) and len(ours) > 3
    assert sorted(ours) == sorted(theirs)
    assert [name for name in ours if ours[name] != theirs[name]] == []


def test_a_killed_follower_catches_up_from_its_own_offset(start_commitlog: StartCommitLog, tmp_path: Path) -> None:
    group = start_group(start_commitlog, tmp_path, followers=1)
    leader, follower = group.leader, group.followers[0]
    for i in range(100):
        append(leader, message(i))
    held = wait_caught_up(leader, follower)
    follower.kill9()
    assert_same_commitlog(leader.store_dir, follower.store_dir, held)  # a stop point: what it held stays
    deadline = time.monotonic() + 10
    while not any("closed" in r.get("msg", "") for r in leader.log_records()):  # the leader saw it go
        assert time.monotonic() < deadline, leader.logs()[-2000:]
        time.sleep(0.05)

    # The only follower is down: a SYNC_MASTER send is UNAVAILABLE, naming the shard and the follower.
    with pytest.raises(grpc.RpcError) as refused:
        append(leader, message(1000))
    detail = refused.value.details() or ""
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, detail
    assert "SLAVE_NOT_AVAILABLE" in detail and "shard shard-t" in detail
    assert f"at offset {held}" in detail and "disconnected" in detail, detail

    restarted = start_commitlog(follower.store_dir, follower_env(group.ha_port))
    for i in range(100, 200):
        assert append(leader, message(i)).status == commitlog_pb2.PUT_MESSAGE_STATUS_PUT_OK
    end = wait_caught_up(leader, restarted)
    assert_same_commitlog(leader.store_dir, restarted.store_dir, end)
    resumed = [r for r in restarted.log_records() if "following leader" in r.get("msg", "")]
    assert resumed and resumed[0]["msg"].endswith(f"from offset {held}"), resumed

    # The leader restarts: the follower dials it again and SYNC_MASTER acks resume.
    leader.stop()
    leader = start_commitlog(leader.store_dir, leader_env(group.ha_port), port=leader.port)
    deadline = time.monotonic() + 15
    while True:
        try:
            append(leader, message(500))
            break
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.UNAVAILABLE and time.monotonic() < deadline, exc.details()
            time.sleep(0.2)
    assert_same_commitlog(leader.store_dir, restarted.store_dir, wait_caught_up(leader, restarted))


def test_plain_rocketmq_mode_streams_a_fresh_slave_the_last_file(start_commitlog: StartCommitLog,
                                                                  tmp_path: Path) -> None:
    """haProtocol=rocketmq on both sides: 4.9.8's bare wire, no handshake; a slave with an empty log
    reports 0 and gets the leader's last file from its start, as a 4.9.8 master does."""
    ha_port = free_port()
    plain = {"MQSTORE_HA_PROTOCOL": "rocketmq"}
    leader = start_commitlog(tmp_path / "leader", {**BASE_ENV, **plain, "MQSTORE_HA_LISTEN_PORT": str(ha_port)})
    batch = commitlog_pb2.AppendBatchRequest(messages=[message(i) for i in range(100)])
    while max_offset(leader) < 2 * FILE_SIZE + 1000:
        leader.stub.AppendBatch(batch, timeout=10, metadata=AUTH)
    follower = start_commitlog(tmp_path / "follower", follower_env(ha_port, **plain))
    end = wait_caught_up(leader, follower)
    assert assert_same_commitlog(leader.store_dir, follower.store_dir, end) == end - end % FILE_SIZE
    leader.stub.AppendBatch(batch, timeout=10, metadata=AUTH)  # ASYNC_MASTER: acked without waiting
    end = wait_caught_up(leader, follower)
    assert_same_commitlog(leader.store_dir, follower.store_dir, end)


def _forge_follower(port: int, hello: bytes | None, stop: threading.Event) -> None:
    """What apache/rocketmq#3015 allowed: connect to the HA port, claim to hold everything, and drain
    whatever the leader streams."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        if hello is not None:
            sock.sendall(hello)
        try:
            sock.sendall(encode_report(0))
            sock.sendall(encode_report(1 << 40))
            sock.settimeout(0.2)
            while not stop.is_set():
                try:
                    if not sock.recv(1 << 16):
                        return
                    sock.sendall(encode_report(1 << 40))
                except TimeoutError:
                    sock.sendall(encode_report(1 << 40))
        except OSError:
            return


@pytest.mark.parametrize("hello", [
    None,
    handshake.encode_hello(handshake.Hello("shard-t", handshake.CURRENT_EPOCH, b"not-the-token")),
    handshake.encode_hello(handshake.Hello("other-shard", handshake.CURRENT_EPOCH, TOKEN.encode())),
], ids=["no-handshake", "wrong-token", "wrong-shard"])
def test_rocketmq_3015_an_unauthenticated_connection_never_makes_sync_master_ack(
        start_commitlog: StartCommitLog, tmp_path: Path, hello: bytes | None) -> None:
    group = start_group(start_commitlog, tmp_path, followers=0)
    stop = threading.Event()
    forger = threading.Thread(target=_forge_follower, args=(group.ha_port, hello, stop), daemon=True)
    forger.start()
    try:
        time.sleep(0.5)
        with pytest.raises(grpc.RpcError) as refused:
            append(group.leader, message(0))
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, refused.value.details()
    finally:
        stop.set()
        forger.join(5)
    assert any("REFUSED" in r.get("msg", "") for r in group.leader.log_records())


def _gone(i: int, queue_id: int) -> common_pb2.Message:
    return common_pb2.Message(topic="Gone", queue_id=queue_id, body=b"g%d" % i, properties={"KEYS": f"g{i}"})


def _kept(i: int) -> common_pb2.Message:
    return common_pb2.Message(topic="Kept", queue_id=i % 3, body=b"k%d" % i, properties={"KEYS": f"k{i}"})


def _append_all(handle: CommitLogProcess, messages: list[common_pb2.Message]) -> None:
    for start in range(0, len(messages), 40):
        request = commitlog_pb2.AppendBatchRequest(messages=messages[start:start + 40])
        handle.stub.AppendBatch(request, timeout=30, metadata=AUTH)


def _consume_queue_root(indexer_store: Path) -> Path:
    return next(p for p in indexer_store.rglob("consumequeue") if p.is_dir())


def test_every_replicas_indexer_drops_a_deleted_topic_where_its_deletion_record_is(
        start_commitlog: StartCommitLog, tmp_path: Path) -> None:
    """DeleteTopic reaches the followers as the topic-deletion metadata record, but the gateway asks only
    the leader's indexer to drop the topic's ConsumeQueues: the followers' indexers kept them (a
    promoted follower served the deleted topic, and its ConsumeQueue files differed from the leader's).
    Each replica's dispatch drops them at the record; the leader's DeleteTopic answers what its own
    dispatch removed there. The topic written again starts its queue where its offsets stopped, on
    every replica, and an indexer rebuilt from offset 0 ends in the same files."""
    group = start_group(start_commitlog, tmp_path, followers=2)
    leader = group.leader
    replicas = [leader, *group.followers]
    stores = [tmp_path / "leader-indexer", tmp_path / "follower0-indexer", tmp_path / "follower1-indexer"]
    sources = ["auto", "tail", "auto"]  # the commitlog's files, its Tail
    indexers: list[IndexerProcess] = []
    try:
        for store, handle, source in zip(stores, replicas, sources, strict=True):
            indexers.append(start_indexer(store, handle.address, {**BASE_ENV, "MQSTORE_INDEXER_REPUT_SOURCE": source}))
        # Gone/0 over two ConsumeQueue files (64 units each), Gone/1 in one; Kept in three queues.
        _append_all(leader, [_gone(i, 0) for i in range(80)] + [_gone(i, 1) for i in range(10)]
                    + [_kept(i) for i in range(30)])
        end = max_offset(leader)
        for indexer in indexers:
            wait_indexed(indexer, end)
        for store in stores:  # every replica's indexer built the topic's queues
            assert sorted(p.name for p in (_consume_queue_root(store) / "Gone").iterdir()) == ["0", "1"]

        # As the gateway deletes a topic (gateway/admin.py): the leader's commitlog, then its indexer.
        deleted = leader.stub.DeleteTopic(admin_pb2.DeleteTopicRequest(topic="Gone"), timeout=10, metadata=AUTH)
        answer = indexers[0].stub.DeleteTopic(
            admin_pb2.DeleteTopicRequest(topic="Gone", commitlog_offset=deleted.commitlog_offset), timeout=10,
            metadata=AUTH)
        assert answer.deleted_queues == 2
        for indexer in indexers:
            wait_indexed(indexer, deleted.commitlog_offset)
        for store in stores:
            assert not (_consume_queue_root(store) / "Gone").exists(), \
                f"{store.name} kept the deleted topic's ConsumeQueues past its deletion record"

        # Writes go on, the deleted topic among them: its queue 1 starts again at queue offset 10.
        _append_all(leader, [_kept(i) for i in range(30, 60)] + [_gone(i, 1) for i in range(90, 95)])
        end = max_offset(leader)
        indexers.append(start_indexer(tmp_path / "rebuilt-indexer", group.followers[1].address,
                                      {**BASE_ENV, "MQSTORE_INDEXER_REPUT_SOURCE": "tail"}))
        stores.append(tmp_path / "rebuilt-indexer")
        for indexer in indexers:
            wait_indexed(indexer, end)
        queue = indexers[0].stub.GetQueueOffsets(indexer_pb2.GetQueueOffsetsRequest(topic="Gone", queue_id=1),
                                                 timeout=5, metadata=AUTH)
        assert queue.max_offset == 15
    finally:
        stop_indexers(indexers)
    files = [logic_files(store) for store in stores]
    assert not [name for name in files[0] if name.startswith("consumequeue/Gone/0/")]
    assert [name for name in files[0] if name.startswith("consumequeue/Gone/1/")]
    for store, other in zip(stores[1:], files[1:], strict=True):
        differ = sorted(k for k in other.keys() | files[0].keys() if other.get(k) != files[0].get(k))
        assert differ == [], f"{store.name}'s ConsumeQueue/IndexFile differ from the leader's: {differ[:10]}"

