"""Raw pulls end to end: the consumers' default (stored record bytes, decoded by the client) and the
decoded mode give equal messages through the gateway, for varied messages - tags, keys, properties,
zlib and other compressed bodies, IPv6 born hosts, an empty body, 4 MiB bodies - in a small store
geometry (ConsumeQueue and commitlog files roll), with an IPv4 and an IPv6 store host."""

from __future__ import annotations

import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from mqstore.client import Client, Message, OutgoingMessage, Producer, PullConsumer
from mqstore.v1 import commitlog_pb2, commitlog_pb2_grpc, common_pb2, query_pb2
from tests.commitlog.commitlog_process import CHANNEL_OPTIONS
from tests.gateway.system_process import UpProcess, start_up
from tests.geometry import SMALL, drop_preallocated_files

MIB = 1024 * 1024
TOPIC = "RawPull"
BIG = bytes(range(256)) * (4 * MIB // 256)  # 4 MiB
# SMALL, with commitlog files that hold a 4 MiB body (two of them roll the log).
ENV = {**SMALL.env(), "MQSTORE_MAPPED_FILE_SIZE_COMMIT_LOG": str(8 * MIB), "MQSTORE_MAX_MESSAGE_SIZE": str(5 * MIB)}


@pytest.fixture(scope="module", params=["127.0.0.1", "::1"], ids=["ipv4-store", "ipv6-store"])
def up(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpProcess]:
    root: Path = tmp_path_factory.mktemp("raw-pull")
    started = start_up(root / "store", {**ENV, "MQSTORE_BROKER_IP": request.param})
    try:
        yield started
        assert started.stop() == 0, started.logs()[-3000:]
    finally:
        started.kill_all()
        drop_preallocated_files(root)


def append_direct(up: UpProcess, messages: list[common_pb2.Message]) -> None:
    """What the gateway's producers cannot send: a born host of choice, compressed bodies' flags."""
    with grpc.insecure_channel(up.commitlog, options=CHANNEL_OPTIONS) as channel:
        stub = commitlog_pb2_grpc.CommitLogServiceStub(channel)
        for m in messages:  # one by one: a 4 MiB body each
            stub.AppendBatch(commitlog_pb2.AppendBatchRequest(messages=[m]), timeout=30)


def pull_all(gateway: str, raw: bool, subscription: str = "*") -> list[Message]:
    with PullConsumer(None, TOPIC, gateway, subscription=subscription, batch_size=1024, raw_records=raw,
                      max_bytes=1 * MIB) as consumer:
        got: list[Message] = []
        while batch := consumer.poll(max_messages=1024, timeout=0):
            got += batch
    return sorted(got, key=lambda m: (m.queue_id, m.queue_offset))


SQUEEZED = b"compress me " * 200


@pytest.fixture(scope="module")
def seeded(up: UpProcess) -> int:
    """The topic, filled; returns how many messages it holds."""
    with Client(up.gateway) as client:
        client.create_topic(TOPIC, 2)
    with Producer(up.gateway) as producer:
        producer.send_batch(TOPIC, [OutgoingMessage(f"m{i}", tags=("TagA", "TagB", None)[i % 3],
                                                    keys=[f"k{i}", "shared"] if i % 2 else None,
                                                    properties={"n": str(i), "city": "zürich"} if i % 5 == 0 else None)
                                    for i in range(700)])
        producer.send(TOPIC, BIG, tags="TagB", keys="big")
    direct = [
        common_pb2.Message(topic=TOPIC, queue_id=0, body=zlib.compress(SQUEEZED), sys_flag=0x1, flag=3,
                           properties={"TAGS": "TagA"}, born_host="[2001:db8::5]:40000", reconsume_times=2),
        common_pb2.Message(topic=TOPIC, queue_id=1, body=zlib.compress(SQUEEZED), sys_flag=0x1 | 0x300,
                           born_host="10.0.0.9:1234", born_timestamp=1_600_000_000_000),
        common_pb2.Message(topic=TOPIC, queue_id=0, body=b"\x04\x22\x4d\x18lz4", sys_flag=0x1 | 0x100,
                           born_host="[::1]:1", properties={"TAGS": "TagB", "KEYS": "a b"}),
        common_pb2.Message(topic=TOPIC, queue_id=1, body=b"flagged, not zlib", sys_flag=0x1, born_host="[::1]:2"),
        common_pb2.Message(topic=TOPIC, queue_id=0, body=b"", born_host="[fe80::1]:3"),  # the gateway refuses it
        common_pb2.Message(topic=TOPIC, queue_id=1, body=BIG[::-1], born_host="[2001:db8::6]:4",
                           properties={"TAGS": "TagA"}),
    ]
    append_direct(up, direct)
    count = 700 + 1 + len(direct)
    deadline = time.monotonic() + 30
    with Client(up.gateway) as client:
        while sum(client.queue_offsets(TOPIC, q).max_offset for q in (0, 1)) < count:
            assert time.monotonic() < deadline, "the indexer did not dispatch every message in 30 s"
            time.sleep(0.05)
    return count


def test_raw_and_decoded_pulls_give_equal_messages(up: UpProcess, seeded: int) -> None:
    for subscription in ("*", "TagA", "TagB || TagA"):
        raw = pull_all(up.gateway, True, subscription)
        decoded = pull_all(up.gateway, False, subscription)
        assert raw == decoded
        if subscription == "*":
            assert len(raw) == seeded
    every = pull_all(up.gateway, True)
    bodies = {m.body for m in every}
    assert BIG in bodies and BIG[::-1] in bodies and b"" in bodies and SQUEEZED in bodies
    assert {m.born_host for m in every} >= {"[2001:db8::5]:40000", "10.0.0.9:1234", "[fe80::1]:3"}
    assert sum(m.body_compressed for m in every) == 2  # the LZ4-typed body and the flagged plain one
    assert all(len(m.offset_msg_id) == (56 if ":" in m.store_host.rsplit(":", 1)[0] else 32) for m in every)


def test_a_raw_answer_carries_records_not_messages(up: UpProcess, seeded: int) -> None:
    """The wire: records and record_count instead of messages; the other fields as in decoded mode."""
    with Client(up.gateway) as client:
        call = client.connection.call
        request = query_pb2.PullMessageRequest(topic=TOPIC, queue_id=0, queue_offset=0, max_messages=5)
        decoded = call("Pull", request)
        request.raw_records = True
        raw = call("Pull", request)
    assert (raw.status, raw.next_begin_offset, raw.min_offset, raw.max_offset) == \
        (decoded.status, decoded.next_begin_offset, decoded.min_offset, decoded.max_offset)
    assert not raw.messages and raw.record_count == len(decoded.messages) == 5
    assert len(raw.records) == sum(m.store_size for m in decoded.messages)
    assert not decoded.records and not decoded.record_count
