"""Batches as one bytes blob (RocketMQ's batch encoding) through the gateway and the commitlog (real
processes): stored exactly as the same messages sent the old way, one receipt per batch, every bad
blob refused INVALID_ARGUMENT naming the message with nothing stored, and SendBatchStream."""

from __future__ import annotations

import dataclasses
import struct
import time
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqstore.client import Producer
from mqstore.client.batch_encoder import UniqKeys, encode_entry, properties_bytes
from mqstore.v1 import commitlog_pb2, commitlog_pb2_grpc, common_pb2, gateway_pb2, query_pb2
from services.store.formats.message_id import parse_message_id
from services.store.formats.record import decode_record
from tests.commitlog.commitlog_process import CHANNEL_OPTIONS
from tests.gateway.system_process import UpProcess
from tests.waiting import eventually_found

PUT_OK = commitlog_pb2.PUT_MESSAGE_STATUS_PUT_OK
KEYS = UniqKeys(bytes([10, 0, 0, 7]))
BORN = 1_700_000_000_123


def entry(body: bytes = b"payload", flag: int = 0, **properties: str) -> bytes:
    return encode_entry(body, flag, properties_bytes(properties))


def blob_request(topic: str, *entries: bytes, **fields: Any) -> gateway_pb2.SendBatchRequest:
    return gateway_pb2.SendBatchRequest(topic=topic, encoded_messages=b"".join(entries), **fields)


def record_at(up: UpProcess, offset_msg_id: str) -> Any:
    with grpc.insecure_channel(up.commitlog, options=CHANNEL_OPTIONS) as channel:
        stub = commitlog_pb2_grpc.CommitLogServiceStub(channel)
        offset = parse_message_id(offset_msg_id).commitlog_offset
        info = stub.GetStoreInfo(commitlog_pb2.GetStoreInfoRequest(), timeout=5)
        data = stub.Read(commitlog_pb2.ReadRequest(offset=offset, size=min(8192, info.max_offset - offset)),
                         timeout=5).data
    return decode_record(data, 0)


def receipt_ids(receipt: gateway_pb2.SendBatchReceipt) -> list[str]:
    return [f"{receipt.offset_msg_id_prefix}{offset:016X}" for offset in receipt.commitlog_offsets]


def test_a_blob_is_stored_as_the_same_messages_sent_one_by_one_as_objects(up: UpProcess) -> None:
    """Differential: record for record, every stored field equal but the ones the store assigns."""
    specs = [(f"body {i} ".encode() * (i + 1), i % 3,
              {"TAGS": f"t{i % 2}", "KEYS": f"k{i} shared", "UNIQ_KEY": KEYS.next(), "custom": "值"})
             for i in range(20)]
    old = up.stub.SendBatch(gateway_pb2.SendBatchRequest(queue_id=1, messages=[
        common_pb2.Message(topic="blob-diff", body=body, flag=flag, properties=props, born_timestamp=BORN,
                           born_host="10.0.0.7:4242", sys_flag=0x2) for body, flag, props in specs]), timeout=10)
    new = up.stub.SendBatch(blob_request("blob-diff", *(encode_entry(body, flag, properties_bytes(props))
                                                        for body, flag, props in specs),
                                         queue_id=1, born_timestamp=BORN, born_host="10.0.0.7:4242", sys_flag=0x2),
                            timeout=10)
    assert not new.results and new.receipt.status == PUT_OK and new.receipt.queue_id == 1
    assert new.receipt.first_queue_offset == old.results[-1].queue_offset + 1
    assert not new.receipt.msg_ids  # every message carried its UNIQ_KEY
    for result, offset_msg_id in zip(old.results, receipt_ids(new.receipt), strict=True):
        before, after = record_at(up, result.offset_msg_id), record_at(up, offset_msg_id)
        assigned = {"queue_offset": 0, "commitlog_offset": 0, "store_timestamp": 0}
        assert dataclasses.replace(before, **assigned) == dataclasses.replace(after, **assigned)
        assert after.queue_offset == before.queue_offset + 20


def test_the_receipt_finds_every_message(up: UpProcess) -> None:
    keys = [KEYS.next() for _ in range(50)]
    response = up.stub.SendBatch(blob_request("blob-receipt", *(entry(f"m{i}".encode(), UNIQ_KEY=k)
                                                                for i, k in enumerate(keys))), timeout=10)
    receipt = response.receipt
    assert receipt.topic == "blob-receipt" and receipt.shard and len(receipt.commitlog_offsets) == 50
    ids = receipt_ids(receipt)
    for i in (0, 49):
        by_offset = up.stub.GetMessage(query_pb2.ViewMessageRequest(msg_id=ids[i]), timeout=10).message
        assert by_offset.body == f"m{i}".encode() and by_offset.queue_offset == receipt.first_queue_offset + i
        request = query_pb2.ViewMessageRequest(msg_id=keys[i])
        by_key = eventually_found(lambda: up.stub.GetMessage(request, timeout=10)).message  # noqa: B023
        assert by_key.msg_id == ids[i] and by_key.queue_id == receipt.queue_id


def test_the_gateway_adds_missing_uniq_keys_and_lists_them(up: UpProcess) -> None:
    mine = KEYS.next()
    response = up.stub.SendBatch(blob_request("blob-keys", entry(b"a"), entry(b"b", UNIQ_KEY=mine),
                                              entry(b"c", TAGS="x")), timeout=10)
    ids = list(response.receipt.msg_ids)
    assert len(ids) == 3 and ids[1] == mine and len(set(ids)) == 3 and all(len(i) == 32 for i in ids)
    stored = [record_at(up, i) for i in receipt_ids(response.receipt)]
    assert [r.properties.get("UNIQ_KEY") for r in stored] == ids
    assert stored[2].properties == {"TAGS": "x", "UNIQ_KEY": ids[2]}


def test_delay_messages_get_a_result_each(up: UpProcess) -> None:
    """Stored under SCHEDULE_TOPIC_XXXX queues of their own: no receipt can describe them."""
    response = up.stub.SendBatch(blob_request("blob-delay", entry(b"now"), entry(b"later", DELAY="3")),
                                 timeout=10)
    assert not response.HasField("receipt") and len(response.results) == 2
    assert response.results[0].topic == "blob-delay" and response.results[1].topic == "SCHEDULE_TOPIC_XXXX"
    assert all(len(r.msg_id) == 32 for r in response.results)


def _frame(total: int, flag: int, body_length: int) -> bytes:
    return struct.pack(">iiiii", total, 0, 0, flag, body_length)


GOOD = entry(b"fine", KEYS="k")
BAD_BLOBS: list[tuple[str, bytes, str]] = [
    ("truncated frame", GOOD + GOOD[:10], "message #1: the blob ends 10 bytes into"),
    ("truncated body", GOOD + GOOD[:-3], "message #1: total size"),
    ("total size too small", _frame(5, 0, 0) + b"\x00\x00", "message #0: total size 5"),
    ("total size past the end", GOOD + _frame(10_000, 0, 4) + b"abcd\x00\x00", "message #1: total size 10000"),
    ("huge body length", _frame(26, 0, 2**31 - 1) + b"abcd\x00\x00", "message #0: body length 2147483647"),
    ("negative body length", _frame(26, 0, -4) + b"abcd\x00\x00", "message #0: body length -4"),
    ("properties length off", _frame(26, 0, 4) + b"abcd\x00\x05", "message #0: properties length 5"),
    ("negative properties length", _frame(26, 0, 4) + b"abcd\xff\xff", "message #0: properties length -1"),
    ("empty body", GOOD + entry(b""), "message #1: the message body is empty"),
    ("negative flag", entry(flag=-1), "message #0: flag -1 is negative"),
    ("bad uniq key", GOOD + GOOD + entry(UNIQ_KEY="nope"), "message #2: UNIQ_KEY 'nope'"),
    ("separator in a value", encode_entry(b"x", 0, b"A\x01b\x01c"), "message #0: properties must be"),
    ("empty name", encode_entry(b"x", 0, b"\x01b"), "message #0: properties must be"),
    ("empty value", encode_entry(b"x", 0, b"a\x01\x02b\x01c"), "message #0: properties must be"),
    ("no pair separator", encode_entry(b"x", 0, b"abc"), "message #0: properties must be"),
    ("double item separator", encode_entry(b"x", 0, b"a\x01b\x02\x02c\x01d"), "message #0: properties must be"),
    ("not utf-8", encode_entry(b"x", 0, b"a\x01\xff\xfe"), "message #0: properties are not UTF-8"),
    ("two uniq keys", encode_entry(b"x", 0, properties_bytes({"UNIQ_KEY": KEYS.next()}) + b"\x02" +
                                   properties_bytes({"UNIQ_KEY": KEYS.next()})), "message #0: the UNIQ_KEY"),
    ("too many", GOOD * 1025, "more than 1024 messages"),
]


@pytest.mark.parametrize("blob, fragment", [(b, f) for _, b, f in BAD_BLOBS], ids=[n for n, _, _ in BAD_BLOBS])
def test_a_bad_blob_is_refused_by_the_gateway_and_the_commitlog_and_nothing_is_stored(
        up: UpProcess, blob: bytes, fragment: str) -> None:
    before = up.store_state()
    with pytest.raises(grpc.RpcError) as gateway_error:
        up.stub.SendBatch(gateway_pb2.SendBatchRequest(topic="blob-bad", encoded_messages=blob), timeout=10)
    assert gateway_error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert fragment in (gateway_error.value.details() or ""), gateway_error.value.details()
    with grpc.insecure_channel(up.commitlog, options=CHANNEL_OPTIONS) as channel:
        stub = commitlog_pb2_grpc.CommitLogServiceStub(channel)
        with pytest.raises(grpc.RpcError) as commitlog_error:
            stub.AppendBatch(commitlog_pb2.AppendBatchRequest(topic="blob-bad", encoded_messages=blob), timeout=10)
    assert commitlog_error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = commitlog_error.value.details() or ""
    assert fragment.split(":")[0] in details, details
    assert up.store_state() == before


@pytest.mark.parametrize("fields, fragment", [
    ({"topic": "SCHEDULE_TOPIC_XXXX"}, "system topic"),
    ({"topic": "%DLQ%g"}, "retry or dead-letter"),
    ({"sys_flag": 0x4}, "transaction flow"),
    ({"born_timestamp": -1}, "born_timestamp -1 is negative"),
    ({"encoded_messages": b""}, "encoded_messages is empty"),
    ({"messages": [common_pb2.Message(topic="blob-bad", body=b"x")]}, "both messages and encoded_messages"),
    ({"topic": "", "encoded_messages": b"", "born_host": "1.2.3.4:5",
      "messages": [common_pb2.Message(topic="blob-bad", body=b"x")]}, "set them on each message"),
])
def test_request_wide_fields_follow_the_producer_rules(up: UpProcess, fields: dict[str, Any], fragment: str) -> None:
    before = up.store_state()
    values: dict[str, Any] = {"topic": "blob-bad", "encoded_messages": GOOD, **fields}
    with pytest.raises(grpc.RpcError) as error:
        up.stub.SendBatch(gateway_pb2.SendBatchRequest(**values), timeout=10)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert fragment in (error.value.details() or ""), error.value.details()
    assert up.store_state() == before


# Every rule the message form of SendBatch applies to a message, as (the message's fields, what the
# answer says). The blob form carries topic, sys_flag and born_timestamp in the request and the rest in
# the entry; reconsume_times and prepared_transaction_offset have no place in a blob (always 0).
MESSAGE_RULES: list[tuple[str, dict[str, Any], str]] = [
    ("transactional", {"properties": {"TRAN_MSG": "true", "PGROUP": "pg"}}, "cannot be sent in a batch"),
    ("transactional, any case", {"properties": {"TRAN_MSG": "TRUE", "PGROUP": "pg"}}, "cannot be sent in a batch"),
    ("empty body", {"body": b""}, "the message body is empty"),
    ("negative flag", {"flag": -1}, "flag -1 is negative"),
    ("bad uniq key", {"properties": {"UNIQ_KEY": "nope"}}, "UNIQ_KEY 'nope' must be 32"),
    ("transaction bits", {"sys_flag": 0x4}, "transaction flow"),
    ("unknown sys_flag bits", {"sys_flag": 0x40}, "may not set"),
    ("negative born timestamp", {"born_timestamp": -1}, "born_timestamp -1 is negative"),
    ("system topic", {"topic": "SCHEDULE_TOPIC_XXXX"}, "system topic"),
    ("retry topic", {"topic": "%RETRY%g"}, "retry or dead-letter"),
    ("compressed, not zlib", {"sys_flag": 0x1, "body": b"not zlib"}, "is not zlib data"),
    ("compressed, truncated", {"sys_flag": 0x101 | 0x200, "body": zlib.compress(b"abc" * 100)[:-6]},
     "ends before its zlib stream does"),
    ("compressed, then more", {"sys_flag": 0x1, "body": zlib.compress(b"abc") + b"tail"},
     "4 bytes after the end of its zlib stream"),
]


@pytest.mark.parametrize("fields, fragment", [(f, w) for _, f, w in MESSAGE_RULES],
                         ids=[n for n, _, _ in MESSAGE_RULES])
def test_a_blob_applies_every_rule_of_the_message_form(up: UpProcess, fields: dict[str, Any], fragment: str) -> None:
    """One rule set for both forms: what SendBatch refuses as a message it refuses as a blob entry,
    at the gateway and at the commitlog, and nothing is stored."""
    before = up.store_state()
    bad = common_pb2.Message(**{"topic": "blob-rules", "body": b"payload", **fields})
    request_wide = {"topic": bad.topic, "sys_flag": bad.sys_flag, "born_timestamp": bad.born_timestamp}
    blob = encode_entry(bad.body, bad.flag, properties_bytes(dict(bad.properties)))
    answers = []
    for request in (gateway_pb2.SendBatchRequest(messages=[bad]),
                    gateway_pb2.SendBatchRequest(encoded_messages=blob, **request_wide)):
        with pytest.raises(grpc.RpcError) as error:
            up.stub.SendBatch(request, timeout=10)
        answers.append(error.value)
    with grpc.insecure_channel(up.commitlog, options=CHANNEL_OPTIONS) as channel:
        stub = commitlog_pb2_grpc.CommitLogServiceStub(channel)
        with pytest.raises(grpc.RpcError) as commitlog_error:
            stub.AppendBatch(commitlog_pb2.AppendBatchRequest(encoded_messages=blob, **request_wide), timeout=10)
        answers.append(commitlog_error.value)
    for answer in answers:
        assert answer.code() == grpc.StatusCode.INVALID_ARGUMENT, answer
        assert fragment in (answer.details() or ""), answer.details()
    assert up.store_state() == before


def test_a_blob_of_zlib_bodies_is_stored(up: UpProcess) -> None:
    bodies = [zlib.compress(f"squeeze {i} ".encode() * 50) for i in range(3)]
    response = up.stub.SendBatch(blob_request("blob-zlib", *(entry(b) for b in bodies), sys_flag=0x1), timeout=10)
    assert [record_at(up, i).body for i in receipt_ids(response.receipt)] == bodies
    ok = up.stub.SendBatch(blob_request("blob-zlib", entry(b"x", TRAN_MSG="false")), timeout=10)
    assert ok.receipt.status == PUT_OK


def test_a_batch_stream_answers_every_batch_in_order(up: UpProcess) -> None:
    def requests() -> Iterator[gateway_pb2.SendBatchRequest]:
        for b in range(40):
            yield blob_request("blob-stream", *(entry(f"{b}:{i}".encode(), UNIQ_KEY=KEYS.next()) for i in range(25)),
                               sharding_key="one queue" if b % 2 else "")
    responses = list(up.stub.SendBatchStream(requests(), timeout=60))
    assert len(responses) == 40 and {r.receipt.status for r in responses} == {PUT_OK}
    keyed = [r.receipt for r in responses[1::2]]
    assert len({r.queue_id for r in keyed}) == 1
    offsets = [r.first_queue_offset for r in keyed]  # in stream order on the key's queue (others share it)
    assert offsets == sorted(offsets) and all(b - a >= 25 for a, b in zip(offsets, offsets[1:], strict=False))
    last = responses[-1].receipt
    assert record_at(up, receipt_ids(last)[-1]).body == b"39:24"


def test_a_bad_batch_ends_the_stream_naming_it_and_nothing_after_it_is_stored(up: UpProcess) -> None:
    sent: list[int] = []

    def requests() -> Iterator[gateway_pb2.SendBatchRequest]:
        for b in range(6):
            sent.append(b)
            yield blob_request("blob-stream-bad", entry(f"{b}".encode()), entry(flag=-1 if b == 3 else 0))
            time.sleep(0.01)
    answers: list[gateway_pb2.SendBatchResponse] = []
    with pytest.raises(grpc.RpcError) as error:
        answers.extend(up.stub.SendBatchStream(requests(), timeout=30))
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "batch #3 of the stream: message #1: flag -1" in (error.value.details() or "")
    assert len(answers) == 3
    offsets = up.stub.GetQueueOffsets(query_pb2.GetQueueOffsetRangeRequest(topic="blob-stream-bad", queue_id=0),
                                      timeout=10)
    del offsets  # dispatch may lag; the commitlog's records are what counts:
    stored = [record_at(up, i).body for a in answers for i in receipt_ids(a.receipt)]
    assert stored[::2] == [b"0", b"1", b"2"]


def test_the_client_sends_blobs_and_its_receipts_find_the_messages(up: UpProcess) -> None:
    with Producer(up.gateway) as producer:
        receipts = producer.send_batch("blob-client", [f"c{i}" for i in range(30)], tags="t", keys=["a", "b"])
        delayed = producer.send_batch("blob-client", [b"x"], properties={"DELAY": "2"})
    assert len(receipts) == 30 and all(r.ok for r in receipts)
    assert [r.queue_offset for r in receipts] == list(range(receipts[0].queue_offset, receipts[0].queue_offset + 30))
    record = record_at(up, receipts[7].offset_msg_id)
    assert record.body == b"c7" and record.properties == {"TAGS": "t", "KEYS": "a b", "UNIQ_KEY": receipts[7].msg_id}
    assert delayed[0].topic == "SCHEDULE_TOPIC_XXXX"
    found: Callable[[], Any] = lambda: up.stub.GetMessage(  # noqa: E731
        query_pb2.ViewMessageRequest(msg_id=receipts[29].msg_id), timeout=10)
    assert eventually_found(found).message.body == b"c29"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_randomly_damaged_blobs_are_refused_whole_or_stored_whole(up: UpProcess, data: st.DataObject) -> None:
    """Through the gateway: a damaged blob is INVALID_ARGUMENT naming a message with the store
    unchanged, or (a body byte changed) stored with every message accounted for."""
    count = data.draw(st.integers(1, 4))
    blob = bytearray(b"".join(entry(f"d{i}".encode() * 3, TAGS="t", UNIQ_KEY=KEYS.next()) for i in range(count)))
    how = data.draw(st.sampled_from(["cut", "flip", "append", "splice"]))
    if how == "cut":
        del blob[data.draw(st.integers(1, len(blob) - 1)):]
    elif how == "flip":
        blob[data.draw(st.integers(0, len(blob) - 1))] ^= data.draw(st.integers(1, 255))
    elif how == "append":
        blob += data.draw(st.binary(min_size=1, max_size=40))
    else:
        at = data.draw(st.integers(0, len(blob)))
        blob[at:at] = data.draw(st.binary(min_size=1, max_size=8))
    before = up.store_state()
    try:
        response = up.stub.SendBatch(blob_request("blob-fuzz", bytes(blob)), timeout=10)
    except grpc.RpcError as error:
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error
        assert "message #" in (error.details() or "") or "empty" in (error.details() or ""), error.details()
        assert up.store_state() == before
        return
    stored = len(response.receipt.commitlog_offsets) if response.HasField("receipt") else len(response.results)
    assert stored >= 1 and up.store_state()[0] > before[0]
