"""Metadata replicated as it changes: ``mqstore up --replicas 3`` (etcd, three replicas, the gateway).

A topic created and consumer offsets committed through the gateway are held by every replica before
the calls are answered (SYNC_MASTER), so a SIGKILLed leader's successor has the topic with its queue
counts, and the group resumes at exactly its committed offset (itboon/rocketmq-helm#33: topics created
on the master were missing on the slave after a switch). A follower refuses metadata writes, naming
the leader, as it refuses sends. A pop group's state survives too (neither its acknowledged messages nor
those in flight are handed out again), and the group's members
(every replica's query service takes each heartbeat). The scheduler, moved
to the new leader, delivers each delay-level message and each timer once: not again those the old
leader delivered.
"""

from __future__ import annotations

import os
import signal
import time

import grpc
import pytest

from mqstore.v1 import (
    commitlog_pb2,
    commitlog_pb2_grpc,
    common_pb2,
    gateway_pb2,
    groups_pb2,
    query_pb2,
    query_pb2_grpc,
)
from services.replica_set import ReplicaPorts
from tests.gateway.system_process import UpProcess
from tests.gateway.test_up_replicas import REPLICAS, _leader, _pid, replicated  # noqa: F401 - the fixture

TOPIC = "created-on-the-leader"
DELAYED = "delayed-once"
TIMED = "timed-once"
GROUP = "resumes-exactly"
POP_GROUP = "pops-and-acks"
QUEUES = 5
COMMITTED = {0: 3, 2: 7, 4: 1}
MEMBERS = ("consumer-a", "consumer-b")


def _commitlog(up: UpProcess, i: int) -> commitlog_pb2_grpc.CommitLogServiceStub:
    channel = grpc.insecure_channel(f"127.0.0.1:{ReplicaPorts.of(up.base_port).replica(i, 'commitlog')}")
    return commitlog_pb2_grpc.CommitLogServiceStub(channel)


def _query(up: UpProcess, i: int) -> query_pb2_grpc.QueryServiceStub:
    channel = grpc.insecure_channel(f"127.0.0.1:{ReplicaPorts.of(up.base_port).replica(i, 'query')}")
    return query_pb2_grpc.QueryServiceStub(channel)


def _topics(up: UpProcess, i: int) -> dict[str, tuple[int, int]]:
    listed = _commitlog(up, i).ListTopics(commitlog_pb2.ListTopicsRequest(), timeout=5, wait_for_ready=True)
    return {t.topic: (t.read_queue_nums, t.write_queue_nums) for t in listed.topics}


def _offsets(up: UpProcess, i: int | None) -> dict[int, int]:
    """The group's committed offsets as replica ``i``'s query service has them (None: the gateway's)."""
    found = {}
    for queue_id in COMMITTED:
        request = query_pb2.QueryConsumerOffsetRequest(consumer_group=GROUP, topic=TOPIC, queue_id=queue_id)
        if i is None:
            found[queue_id] = up.stub.QueryOffset(request, timeout=10).offset
        else:
            found[queue_id] = _query(up, i).QueryConsumerOffset(request, timeout=10, wait_for_ready=True).offset
    return found


def _members(up: UpProcess, i: int) -> list[str]:
    """The group's members as replica ``i``'s query service knows them."""
    described = _query(up, i).DescribeGroups(groups_pb2.DescribeGroupsRequest(group=GROUP), timeout=10,
                                             wait_for_ready=True)
    return sorted(m.client_id for g in described.groups if g.group == GROUP for m in g.members)


def _create_topic(up: UpProcess, topic: str, queues: int) -> None:
    """Through the gateway; the replica etcd names may refuse it for a moment after its campaign, until
    it has taken the leadership itself (FAILED_PRECONDITION: nothing was written)."""
    deadline = time.monotonic() + 15
    while True:
        try:
            up.stub.CreateTopic(commitlog_pb2.TopicRequest(topic=common_pb2.TopicConfig(
                topic=topic, read_queue_nums=queues, write_queue_nums=queues, perm=6)), timeout=15)
            return
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.FAILED_PRECONDITION or time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _pop_and_ack(up: UpProcess, replica: int, queue_id: int, count: int) -> int:
    """Pop ``count`` messages of TOPIC's queue on ``replica``'s query service and ack each; returns the
    group's offset after the last ack."""
    query = _query(up, replica)
    popped = query.PopMessage(query_pb2.PopMessageRequest(consumer_group=POP_GROUP, topic=TOPIC, queue_id=queue_id,
                                                          max_messages=count, invisible_ms=60_000), timeout=10)
    assert len(popped.messages) == count, popped
    committed = -1
    for m in popped.messages:
        ref = query_pb2.PoppedRef(consumer_group=POP_GROUP, topic=TOPIC, queue_id=queue_id,
                                  queue_offset=m.message.queue_offset, version=m.version)
        committed = query.AckPopped(query_pb2.AckPoppedRequest(ref=ref), timeout=10).committed_offset
    return int(committed)


def _pop(up: UpProcess, replica: int, queue_id: int, count: int) -> list[int]:
    """Pop up to ``count`` messages of TOPIC's queue on ``replica``'s query service (invisible for a
    minute, not acked); their queue offsets."""
    popped = _query(up, replica).PopMessage(query_pb2.PopMessageRequest(
        consumer_group=POP_GROUP, topic=TOPIC, queue_id=queue_id, max_messages=count, invisible_ms=60_000), timeout=10)
    return [m.message.queue_offset for m in popped.messages]


def _send_delayed(up: UpProcess, bodies: list[bytes]) -> None:
    """Delay level 1 (1 s), into DELAYED's one queue."""
    for body in bodies:
        up.stub.Send(gateway_pb2.SendRequest(message=common_pb2.Message(topic=DELAYED, body=body,
                                                                        properties={"DELAY": "1"})), timeout=15)


def _send_timers(up: UpProcess, bodies: list[bytes]) -> None:
    """Timers due in a second, into TIMED's one queue."""
    for body in bodies:
        due = str(int(time.time() * 1000) + 1000)
        up.stub.Send(gateway_pb2.SendRequest(message=common_pb2.Message(
            topic=TIMED, body=body, properties={"TIMER_DELIVER_MS": due})), timeout=15)


def _delivered(up: UpProcess, topic: str = DELAYED) -> list[bytes]:
    pulled = up.stub.Pull(query_pb2.PullMessageRequest(topic=topic, queue_id=0, queue_offset=0, max_messages=64),
                          timeout=10)
    return [m.body for m in pulled.messages]


def _wait_delivered(up: UpProcess, count: int, topic: str = DELAYED) -> None:
    deadline = time.monotonic() + 30
    while len(_delivered(up, topic)) < count:
        assert time.monotonic() < deadline, \
            f"{count} messages not delivered into {topic} within 30 s: {_delivered(up, topic)}"
        time.sleep(0.2)


def _wait_dispatched(up: UpProcess, queue_id: int, count: int) -> None:
    """A commit past what the indexer has dispatched is refused (OUT_OF_RANGE): wait for the queue."""
    deadline = time.monotonic() + 10
    request = query_pb2.GetQueueOffsetRangeRequest(topic=TOPIC, queue_id=queue_id)
    while up.stub.GetQueueOffsets(request, timeout=10).max_offset < count:
        assert time.monotonic() < deadline, f"queue {queue_id} not dispatched within 10 s"
        time.sleep(0.02)


def _replica_index(name: str) -> int:
    return int(name.rsplit("-", 1)[1])


def test_itboon_33_topics_and_offsets_survive_a_leader_kill(replicated: UpProcess) -> None:  # noqa: F811
    up = replicated
    etcd = f"127.0.0.1:{up.base_port + 1}"
    leader, epoch = _leader(etcd)
    _create_topic(up, TOPIC, QUEUES)
    _create_topic(up, DELAYED, 1)
    _create_topic(up, TIMED, 1)
    for queue_id in range(QUEUES):
        for i in range(8):
            up.stub.Send(gateway_pb2.SendRequest(message=common_pb2.Message(topic=TOPIC, body=b"m%d" % i),
                                                 queue_id=queue_id), timeout=15)
    took = []
    for queue_id, offset in COMMITTED.items():
        _wait_dispatched(up, queue_id, 8)
        began = time.monotonic()
        up.stub.CommitOffset(query_pb2.UpdateConsumerOffsetRequest(consumer_group=GROUP, topic=TOPIC,
                                                                   queue_id=queue_id, offset=offset), timeout=15)
        took.append(time.monotonic() - began)
    print(f"\nCommitOffset through the gateway, replicated through the log (SYNC_MASTER, 3 replicas): "
          f"{', '.join(f'{t * 1000:.1f}' for t in took)} ms")

    popped_to = _pop_and_ack(up, _replica_index(leader), queue_id=1, count=3)
    assert _pop(up, _replica_index(leader), queue_id=1, count=2) == [3, 4], "in flight, invisible for a minute"
    for member in MEMBERS:
        up.stub.Heartbeat(groups_pb2.HeartbeatRequest(group=GROUP, client_id=member, topics=[TOPIC],
                                                      rebalance_interval_ms=60_000), timeout=10)
    up.stub.Heartbeat(groups_pb2.HeartbeatRequest(group=GROUP, client_id="leaves", topics=[TOPIC]), timeout=10)
    up.stub.UnregisterConsumer(groups_pb2.UnregisterConsumerRequest(group=GROUP, client_id="leaves"), timeout=10)
    _send_delayed(up, [b"before-%d" % i for i in range(5)])
    _send_timers(up, [b"timer-before-%d" % i for i in range(5)])
    _wait_delivered(up, 5)
    _wait_delivered(up, 5, TIMED)
    time.sleep(1.5)  # the timer checkpoint (persisted every second) after the deliveries

    # Acknowledged means held: every follower has both before the leader dies.
    for i in range(REPLICAS):
        assert _topics(up, i).get(TOPIC) == (QUEUES, QUEUES), f"replica-{i} lacks the topic"
        assert _offsets(up, i) == COMMITTED, f"replica-{i}'s consumer offsets"
        assert _members(up, i) == sorted(MEMBERS), f"replica-{i}'s members of {GROUP}"

    follower = next(i for i in range(REPLICAS) if f"replica-{i}" != leader)
    with pytest.raises(grpc.RpcError) as refused:
        _commitlog(up, follower).CreateTopic(commitlog_pb2.TopicRequest(topic=common_pb2.TopicConfig(
            topic="on-a-follower", read_queue_nums=1, write_queue_nums=1, perm=6)), timeout=10)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "is not the leader of shard" in (refused.value.details() or ""), refused.value.details()
    with pytest.raises(grpc.RpcError) as refused:
        _query(up, follower).UpdateConsumerOffset(query_pb2.UpdateConsumerOffsetRequest(
            consumer_group=GROUP, topic=TOPIC, queue_id=0, offset=5), timeout=10)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION, refused.value.details()
    assert "is not the leader of shard" in (refused.value.details() or ""), refused.value.details()

    os.kill(_pid(up.store, leader), signal.SIGKILL)
    deadline = time.monotonic() + 30
    while True:
        try:
            new_leader, new_epoch = _leader(etcd)
            if new_epoch > epoch:
                break
        except AssertionError:
            pass
        assert time.monotonic() < deadline, "no next leader within 30 s"
        time.sleep(0.1)
    new = _replica_index(new_leader)
    assert _topics(up, new).get(TOPIC) == (QUEUES, QUEUES), f"the new leader {new_leader} lacks the topic"
    assert _offsets(up, new) == COMMITTED, f"the new leader {new_leader}'s consumer offsets"
    assert _offsets(up, None) == COMMITTED, "the group resumes at its commits through the gateway"
    popped = _query(up, new).QueryConsumerOffset(query_pb2.QueryConsumerOffsetRequest(
        consumer_group=POP_GROUP, topic=TOPIC, queue_id=1), timeout=10).offset
    assert popped == popped_to == 3, "the pop group's acknowledged offset"
    # Pop state is replicated: neither the acknowledged messages nor those in flight are handed out again.
    assert _pop(up, new, queue_id=1, count=8) == [5, 6, 7], "the new leader's pop of the queue"
    # The members are known at once, not after their next heartbeat (a minute away).
    assert _members(up, new) == sorted(MEMBERS), f"the new leader {new_leader}'s members of {GROUP}"

    # The scheduler moves to the new leader: what was delivered is not delivered again, what is due
    # now is delivered once.
    _send_delayed(up, [b"after-%d" % i for i in range(2)])
    _send_timers(up, [b"timer-after-%d" % i for i in range(2)])
    _wait_delivered(up, 7)
    _wait_delivered(up, 7, TIMED)
    time.sleep(2)
    bodies = _delivered(up)
    assert sorted(bodies) == sorted([b"before-%d" % i for i in range(5)] + [b"after-0", b"after-1"]), bodies
    # Timers too: the new leader's scheduler rebuilt its timer store from the log's copy of the progress.
    timed = _delivered(up, TIMED)
    assert sorted(timed) == sorted([b"timer-before-%d" % i for i in range(5)] + [b"timer-after-0", b"timer-after-1"]), \
        timed
