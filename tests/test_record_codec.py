"""Property tests of the record codec: round trips over the whole field space (IPv4 and IPv6 hosts,
odd topics and properties), and garbage in gives RecordError, never any other exception."""

from __future__ import annotations

import base64
import contextlib
import struct
from collections.abc import Callable
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv6Address
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from services.store.formats.message import (
    BORNHOST_V6_FLAG,
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    SCHEDULE_TOPIC,
    STOREHOSTADDRESS_V6_FLAG,
    properties_to_string,
    string_to_properties,
    tags_code,
)
from services.store.formats.record import (
    BLANK_MAGIC_CODE,
    MESSAGE_MAGIC_CODE_V2,
    SIZE_AND_MAGIC,
    RecordError,
    body_crc,
    check_record,
    decode_record,
    encode_blank,
    encode_record,
    patch_offsets,
    record_length,
    store_timestamp_pos,
)
from services.store.formats.socket_address import decode_address, encode_address
from tests.conftest import DumpRows

INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)
OFFSET = st.integers(0, 2**63 - 1)
PORT = st.integers(0, 65535)

# Up to 31 characters is at most 124 UTF-8 bytes; the long ASCII branch reaches the v1 limit of 127.
UTF8_CHARS = st.characters(codec="utf-8")  # no lone surrogates: Python cannot encode them to UTF-8
TOPIC = st.one_of(
    st.text(UTF8_CHARS, min_size=1, max_size=31),
    st.text(alphabet="abcXYZ019-_.%|", min_size=100, max_size=127),
)
# Property names and values must be non-empty and free of the two separators to survive a round trip.
PROP_TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\x01\x02"), min_size=1, max_size=20)
PROPERTIES = st.dictionaries(PROP_TEXT, PROP_TEXT, max_size=8)
OTHER_SYS_FLAGS = st.sampled_from([0, 0x1, 0x2, 0x4, 0x8, 0xC, 0x301, 0x1 | 0x8])


def _host(v6: bool) -> st.SearchStrategy[str]:
    if v6:
        return st.builds(lambda ip, port: f"[{IPv6Address(ip)}]:{port}", st.integers(0, 2**128 - 1), PORT)
    return st.builds(lambda ip, port: f"{IPv4Address(ip)}:{port}", st.integers(0, 2**32 - 1), PORT)


@dataclass(frozen=True)
class Fields:
    """Every input of encode_record, with hosts as ``ip:port`` text."""

    topic: str
    queue_id: int
    body: bytes
    flag: int
    properties: dict[str, str]
    sys_flag: int
    born_timestamp: int
    born_host: str
    store_host: str
    reconsume_times: int
    prepared_transaction_offset: int
    queue_offset: int
    commitlog_offset: int
    store_timestamp: int

    def encode(self, **overrides: Any) -> bytes:
        args: dict[str, Any] = dict(
            topic=self.topic.encode(), queue_id=self.queue_id, body=self.body, flag=self.flag,
            properties=properties_to_string(self.properties).encode(), sys_flag=self.sys_flag,
            born_timestamp=self.born_timestamp, born_host=encode_address(self.born_host),
            store_host=encode_address(self.store_host), reconsume_times=self.reconsume_times,
            prepared_transaction_offset=self.prepared_transaction_offset, queue_offset=self.queue_offset,
            commitlog_offset=self.commitlog_offset, store_timestamp=self.store_timestamp,
        )
        args.update(overrides)
        return encode_record(**args)


@st.composite
def fields(draw: Callable[..., Any]) -> Fields:
    born_v6, store_v6 = draw(st.booleans()), draw(st.booleans())
    sys_flag = draw(OTHER_SYS_FLAGS) | (BORNHOST_V6_FLAG if born_v6 else 0) \
        | (STOREHOSTADDRESS_V6_FLAG if store_v6 else 0)
    return Fields(
        topic=draw(TOPIC), queue_id=draw(INT32), body=draw(st.binary(max_size=600)), flag=draw(INT32),
        properties=draw(PROPERTIES), sys_flag=sys_flag, born_timestamp=draw(INT64),
        born_host=draw(_host(born_v6)), store_host=draw(_host(store_v6)), reconsume_times=draw(INT32),
        prepared_transaction_offset=draw(INT64), queue_offset=draw(OFFSET), commitlog_offset=draw(OFFSET),
        store_timestamp=draw(INT64),
    )


@given(fields(), st.binary(max_size=40), st.binary(max_size=40))
def test_round_trip(f: Fields, before: bytes, after: bytes) -> None:
    encoded = f.encode()
    props = properties_to_string(f.properties).encode()
    assert len(encoded) == record_length(f.sys_flag, len(f.body), len(f.topic.encode()), len(props))
    record = decode_record(before + encoded + after, len(before))
    assert record.store_size == len(encoded)
    assert (record.topic, record.queue_id, record.body, record.flag, record.properties) == \
        (f.topic, f.queue_id, f.body, f.flag, f.properties)
    assert (record.sys_flag, record.born_timestamp, record.born_host, record.store_host) == \
        (f.sys_flag, f.born_timestamp, f.born_host, f.store_host)
    assert (record.reconsume_times, record.prepared_transaction_offset) == \
        (f.reconsume_times, f.prepared_transaction_offset)
    assert (record.queue_offset, record.commitlog_offset, record.store_timestamp) == \
        (f.queue_offset, f.commitlog_offset, f.store_timestamp)
    assert record.body_crc == body_crc(f.body)


@given(fields())
def test_check_record_reports_what_dispatch_needs(f: Fields) -> None:
    encoded = f.encode()
    dispatch = check_record(encoded, 0)
    assert dispatch.success and dispatch.msg_size == len(encoded)
    assert (dispatch.topic, dispatch.queue_id, dispatch.queue_offset, dispatch.commitlog_offset) == \
        (f.topic, f.queue_id, f.queue_offset, f.commitlog_offset)
    assert dispatch.keys == f.properties.get(PROPERTY_KEYS)
    assert dispatch.uniq_key == f.properties.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX)
    if f.topic != SCHEDULE_TOPIC:
        assert dispatch.tags_code == tags_code(f.properties.get(PROPERTY_TAGS))


@given(fields(), st.integers(0, 64), OFFSET, OFFSET, INT64)
def test_patch_offsets_equals_encoding_with_the_values(f: Fields, pos: int, queue_offset: int,
                                                       commitlog_offset: int, store_timestamp: int) -> None:
    """The engine encodes with zeros outside the put lock and patches the three fields inside it."""
    unpatched = f.encode(queue_offset=0, commitlog_offset=0, store_timestamp=0)
    buf = bytearray(b"\xee" * pos) + bytearray(unpatched)
    patch_offsets(buf, pos, queue_offset, commitlog_offset, store_timestamp, store_timestamp_pos(f.sys_flag))
    expected = f.encode(queue_offset=queue_offset, commitlog_offset=commitlog_offset,
                        store_timestamp=store_timestamp)
    assert bytes(buf[pos:]) == expected


def test_ipv6_hosts_widen_the_record_by_12_bytes_each() -> None:
    base = dict(topic=b"T", queue_id=0, body=b"x", flag=0, properties=b"", born_timestamp=0)
    v4, v6 = encode_address("10.0.0.1:1"), encode_address("[::1]:1")
    sizes = [len(encode_record(sys_flag=flags, born_host=born, store_host=store, **base))
             for flags, born, store in [(0, v4, v4), (BORNHOST_V6_FLAG, v6, v4),
                                        (STOREHOSTADDRESS_V6_FLAG, v4, v6),
                                        (BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG, v6, v6)]]
    assert sizes == [93, 105, 105, 117]  # 91 fixed bytes + 1 body + 1 topic, +12 per IPv6 host
    assert store_timestamp_pos(0) == 56 and store_timestamp_pos(BORNHOST_V6_FLAG) == 68


def _as_v2(v1: bytes) -> bytes:
    """Rewrite a v1 record as v2: the other magic code and a 2-byte topic length."""
    record = decode_record(v1)
    topic = record.topic.encode()
    topic_len_pos = len(v1) - (1 + len(topic) + 2 + len(properties_to_string(record.properties).encode()))
    v2 = bytearray(v1[:topic_len_pos]) + struct.pack(">H", len(topic)) + v1[topic_len_pos + 1:]
    SIZE_AND_MAGIC.pack_into(v2, 0, len(v2), MESSAGE_MAGIC_CODE_V2)
    return bytes(v2)


@given(fields())
def test_v2_records_decode_too(f: Fields) -> None:
    v2 = _as_v2(f.encode())
    props = properties_to_string(f.properties).encode()
    assert len(v2) == record_length(f.sys_flag, len(f.body), len(f.topic.encode()), len(props), v2=True)
    record = decode_record(v2)
    assert (record.topic, record.body, record.properties, record.store_size) == \
        (f.topic, f.body, f.properties, len(v2))


def test_v2_topic_may_be_longer_than_127_bytes() -> None:
    f = Fields(topic="t" * 300, queue_id=1, body=b"b", flag=0, properties={"a": "b"}, sys_flag=0,
               born_timestamp=1, born_host="1.2.3.4:5", store_host="1.2.3.4:6", reconsume_times=0,
               prepared_transaction_offset=0, queue_offset=0, commitlog_offset=0, store_timestamp=0)
    short = f.encode(topic=b"t")
    start = len(short) - (1 + 1 + 2 + 3)
    v2 = bytearray(short[:start]) + struct.pack(">H", 300) + b"t" * 300 + short[start + 2:]
    SIZE_AND_MAGIC.pack_into(v2, 0, len(v2), MESSAGE_MAGIC_CODE_V2)
    assert decode_record(bytes(v2)).topic == "t" * 300


def test_blank_is_a_file_end_not_a_record() -> None:
    blank = encode_blank(4096) + bytes(4088)
    assert SIZE_AND_MAGIC.unpack_from(blank) == (4096, BLANK_MAGIC_CODE)
    dispatch = check_record(blank, 0)
    assert dispatch.success and dispatch.msg_size == 0
    with pytest.raises(RecordError):
        decode_record(blank)


def test_body_crc_matches_rocketmq_for_every_fixture_body(dump_rows: DumpRows) -> None:
    rows = dump_rows("normal", "msg")
    for row in rows:
        body = base64.b64decode(row["body"]) if row["body"] is not None else b""
        assert body_crc(body) == row["bodyCRC"], row["commitLogOffset"]
    assert {r["sysFlag"] for r in rows} == {0, 0x301}  # compressed bodies: CRC is of the stored bytes


def test_body_crc_known_values() -> None:
    assert body_crc(b"") == 0
    assert body_crc(b"m") == 1627517544  # fixture row at commitLogOffset 161 (i = 1)


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=400), st.integers(0, 400))
@example(b"", 0)
@example(SIZE_AND_MAGIC.pack(91, 0xDAA320A7) + bytes(83), 0)
def test_random_bytes_raise_only_record_error(data: bytes, pos: int) -> None:
    with contextlib.suppress(RecordError):
        decode_record(data, pos)
    check_record(data, pos)  # never raises: it reports success False instead


@st.composite
def garbled(draw: Callable[..., Any]) -> bytes:
    """A valid record with some bytes overwritten and maybe cut short; the header may be kept
    consistent so the garbage reaches the field parsing instead of failing the first check."""
    data = bytearray(draw(fields()).encode())
    for _ in range(draw(st.integers(1, 6))):
        data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    if draw(st.booleans()):
        data = data[:draw(st.integers(0, len(data)))]
    if draw(st.booleans()) and len(data) >= 8:
        struct.pack_into(">i", data, 0, len(data))
    if draw(st.booleans()) and len(data) >= 40:  # force the sysFlag host bits to lie
        struct.pack_into(">i", data, 36, draw(st.sampled_from([0x10, 0x20, 0x30, -1])))
    return bytes(data)


@given(garbled())
def test_garbled_records_raise_only_record_error(data: bytes) -> None:
    try:
        record = decode_record(data)
    except RecordError:
        return
    assert record.store_size == len(data)  # a garble can still be a valid record, but a whole one
    check_record(data, 0)


@given(fields())
def test_every_truncation_is_rejected(f: Fields) -> None:
    encoded = f.encode()
    for cut in range(len(encoded)):
        with pytest.raises(RecordError):
            decode_record(encoded[:cut])
        assert not check_record(encoded[:cut], 0).success


@given(fields())
def test_wrong_crc_fails_the_check_only_when_checked(f: Fields) -> None:
    encoded = f.encode(crc=body_crc(f.body) ^ 1)
    assert not check_record(encoded, 0).success
    assert check_record(encoded, 0, check_crc=False).success


def _delay_record(delay: str) -> bytes:
    return Fields(topic=SCHEDULE_TOPIC, queue_id=2, body=b"", flag=0,
                  properties={PROPERTY_DELAY_TIME_LEVEL: delay, PROPERTY_TAGS: "TagA"}, sys_flag=0,
                  born_timestamp=0, born_host="127.0.0.1:1", store_host="127.0.0.1:2", reconsume_times=0,
                  prepared_transaction_offset=0, queue_offset=0, commitlog_offset=0,
                  store_timestamp=1_000_000).encode()


@pytest.mark.parametrize(("delay", "tags"), [
    ("3", 1_010_000),        # level 3 = 10 s after the store time, as in the fixtures
    ("+3", 1_010_000),       # parseInt accepts a sign
    ("99", 1_000_000 + 7_200_000),  # above the top level: clamped to level 18 (2 h)
    ("0", 2598919),          # level 0 and below: the tags hash stays
    ("-4", 2598919),
    ("", 2598919),           # an empty value is dropped by the properties parser: no DELAY at all
])
def test_delay_level_sets_the_deliver_time_as_tags_code(delay: str, tags: int) -> None:
    dispatch = check_record(_delay_record(delay), 0)
    assert dispatch.success and dispatch.tags_code == tags


@pytest.mark.parametrize("delay", ["abc", " 3", "3_0", "2147483648", "٣x"])
def test_a_delay_level_java_cannot_parse_makes_the_record_invalid(delay: str) -> None:
    assert not check_record(_delay_record(delay), 0).success


@pytest.mark.parametrize(("text", "expected"), [
    ("", {}),
    ("a\x01b", {"a": "b"}),
    ("a\x01b\x02", {"a": "b"}),
    ("a\x01b\x02c\x01d", {"a": "b", "c": "d"}),
    ("a\x01\x02c\x01d", {"c": "d"}),            # empty value: dropped
    ("\x01b\x02c\x01d", {"c": "d"}),            # empty name: dropped
    ("a\x01b\x01c\x02", {"a": "b\x01c"}),       # a value may hold the name/value separator
    ("ab\x02\x02c\x01d\x02", {"c": "d"}),       # items without a separator are skipped
])
def test_properties_string_parses_like_rocketmq(text: str, expected: dict[str, str]) -> None:
    assert string_to_properties(text) == expected


@given(PROPERTIES)
def test_properties_string_round_trip(props: dict[str, str]) -> None:
    text = properties_to_string(props)
    assert not text.endswith("\x02")  # 4.9.x writes no separator after the last pair
    assert string_to_properties(text) == props


@given(st.sampled_from(["127.0.0.1:10911", "[::1]:80", "[2001:db8::8:800:200c:417a]:65535", "0.0.0.0:0"]))
def test_address_round_trip(text: str) -> None:
    raw = encode_address(text)
    assert len(raw) == (20 if text.startswith("[") else 8)
    assert decode_address(raw) == text


def test_decode_rejects_a_non_message_magic() -> None:
    with pytest.raises(RecordError, match="magic"):
        decode_record(bytes(200))
