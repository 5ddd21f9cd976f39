"""Raw pulls against decoded pulls, in process: the same records (IPv4 and IPv6 hosts, v2 magic,
compressed bodies, tags) and the same damage (every field a unit or a CRC check can catch, an
undecodable topic or properties, a quarantined unit) must give the same outcome - the same messages
(the raw records, decoded by the client library, equal the decoded answer) and next begin offset,
or the same DATA_LOSS message. And the client decoder against the store's encoder, as a property."""

from __future__ import annotations

import asyncio
import contextlib
import struct
import zlib
from collections.abc import Callable, Sequence
from typing import Any, cast

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqstore.client.errors import DataLossError as ClientDataLossError
from mqstore.client.models import Message
from mqstore.client.records import decode_records
from mqstore.v1 import query_pb2
from services.query.backends import QueueUnit
from services.query.convert import add_messages
from services.query.errors import DataLossError
from services.query.pull import Puller, Selection, _collect, _collect_raw
from services.query.stored_message import StoredMessage, checked_raw, checked_run, stored_message, unit_table
from services.store.errors import InvalidArgumentError
from services.store.formats.message import (
    BORNHOST_V6_FLAG,
    COMPRESSED_FLAG,
    STOREHOSTADDRESS_V6_FLAG,
    properties_to_string,
)
from services.store.formats.record import MESSAGE_MAGIC_CODE_V2, SIZE_AND_MAGIC, encode_record
from services.store.formats.socket_address import encode_address
from services.store.rules.pull_request import PullQuery
from services.store.rules.subscription import parse_subscription

TOPIC = "RawTopic"
QUEUE = 3
V4_BORN, V6_BORN = "10.1.2.3:50000", "[2001:db8::7]:50001"
V4_STORE, V6_STORE = "127.0.0.1:10911", "[::1]:10911"


def record(queue_offset: int, commitlog_offset: int, body: bytes = b"body", topic: str = TOPIC, queue_id: int = QUEUE,
           properties: dict[str, str] | None = None, sys_flag: int = 0, born: str = V4_BORN, store: str = V4_STORE,
           raw_properties: bytes | None = None) -> bytes:
    born_raw, store_raw = encode_address(born), encode_address(store)
    sys_flag |= (BORNHOST_V6_FLAG if len(born_raw) > 8 else 0) | (STOREHOSTADDRESS_V6_FLAG if len(store_raw) > 8 else 0)
    props = raw_properties if raw_properties is not None else properties_to_string(properties or {}).encode()
    return encode_record(topic=topic.encode(), queue_id=queue_id, body=body, flag=7, properties=props,
                         sys_flag=sys_flag, born_timestamp=1_700_000_000_000 + queue_offset, born_host=born_raw,
                         store_host=store_raw, reconsume_times=2, prepared_transaction_offset=0,
                         queue_offset=queue_offset, commitlog_offset=commitlog_offset,
                         store_timestamp=1_700_000_000_500 + queue_offset)


def as_v2(data: bytes) -> bytes:
    """The same record in RocketMQ 5's v2 layout: a 2-byte TOPICLENGTH (one byte longer)."""
    size, _ = SIZE_AND_MAGIC.unpack_from(data)
    sys_flag = struct.unpack_from(">i", data, 36)[0]
    head = 88 + (12 if sys_flag & BORNHOST_V6_FLAG else 0) + (12 if sys_flag & STOREHOSTADDRESS_V6_FLAG else 0)
    body_end = head + struct.unpack_from(">i", data, head - 4)[0]
    return SIZE_AND_MAGIC.pack(size + 1, MESSAGE_MAGIC_CODE_V2) + data[8:body_end] + b"\x00" + data[body_end:]


Build = Callable[[int, int], bytes]


def store_of(builds: Sequence[Build]) -> tuple[list[QueueUnit], list[bytes]]:
    """Units and records for queue offsets 0.. (commitlog offsets as a log would place them)."""
    units, records = [], []
    offset = 4096
    for queue_offset, build in enumerate(builds):
        data = build(queue_offset, offset)
        units.append(QueueUnit(queue_offset, offset, len(data), 0))
        records.append(data)
        offset += len(data)
    return units, records


def outcome(decoded: bool, units: list[QueueUnit], data: Sequence[Any], subscription: str = "*") -> Any:
    query = PullQuery.checked(TOPIC, QUEUE, 0, 1024, 0, parse_subscription(subscription), 0, 0)
    selection = Selection(units, len(units), 0)
    try:
        if decoded:
            messages, next_offset = _collect(query, selection, data, 0)
            return client_messages(messages), next_offset
        records, next_offset = _collect_raw(query, selection, data, 0)
        for r in records:  # handed on untouched
            assert any(r is d for d in data)
        return decode_records(b"".join(records), QUEUE), next_offset
    except DataLossError as exc:
        return "DATA_LOSS", str(exc)


def client_messages(messages: Sequence[StoredMessage]) -> list[Message]:
    """What the client makes of a decoded pull answer."""
    response = query_pb2.PullMessageResponse()
    add_messages(response.messages, messages)
    wire = query_pb2.PullMessageResponse.FromString(response.SerializeToString())
    return [Message.from_proto(m) for m in wire.messages]


def compressed(text: bytes) -> Build:
    return lambda q, o: record(q, o, zlib.compress(text), sys_flag=COMPRESSED_FLAG)


GOOD: dict[str, Build] = {
    "plain": lambda q, o: record(q, o, b"hello", properties={"TAGS": "TagA", "KEYS": "k1 k2", "UNIQ_KEY": "U1"}),
    "empty body": lambda q, o: record(q, o, b""),
    "no properties": lambda q, o: record(q, o, b"x"),
    "other tag": lambda q, o: record(q, o, properties={"TAGS": "TagB", "a": "b\x01c"}),
    "utf8": lambda q, o: record(q, o, "zürich".encode(), properties={"TAGS": "TagA", "city": "zürich"}),
    "ipv6 born": lambda q, o: record(q, o, properties={"TAGS": "TagA"}, born=V6_BORN),
    "ipv6 store": lambda q, o: record(q, o, properties={"TAGS": "TagA"}, store=V6_STORE),
    "ipv6 both": lambda q, o: record(q, o, born=V6_BORN, store=V6_STORE),
    "zlib": compressed(b"squeeze me " * 50),
    "lz4 type": lambda q, o: record(q, o, b"\x04\x22\x4d\x18", sys_flag=COMPRESSED_FLAG | 0x100),
    "flagged not zlib": lambda q, o: record(q, o, b"plain", sys_flag=COMPRESSED_FLAG),
    "v2 magic": lambda q, o: as_v2(record(q, o, properties={"TAGS": "TagA"})),
    "v2 ipv6": lambda q, o: as_v2(record(q, o, born=V6_BORN, store=V6_STORE)),
    "odd properties": lambda q, o: record(q, o, raw_properties=b"\x01x\x02y\x01\x02TAGS\x01TagA\x02TAGS\x01TagB"),
}


def _flip(index: int) -> Callable[[bytes], bytes]:
    return lambda d: d[:index] + bytes([d[index] ^ 0x01]) + d[index + 1:]


DAMAGE: dict[str, Callable[[bytes], bytes]] = {
    "body byte": lambda d: d[:90] + bytes([d[90] ^ 0x40]) + d[91:],
    "crc": _flip(11),
    "queue id": _flip(15),
    "queue offset": _flip(27),
    "physical offset": _flip(35),
    "magic": _flip(7),
    "total size": _flip(3),
    "body length": _flip(87),
    "topic byte": lambda d: d.replace(TOPIC.encode(), b"RawTopiX"),
    "topic not utf8": lambda d: d.replace(TOPIC.encode(), b"RawTopi\xff"),
    "properties not utf8": lambda d: d.replace(b"TagA", b"Tag\xff"),
    "properties length": lambda d: d[:-len(b"TAGS\x01TagA") - 1] + bytes([d[-len(b"TAGS\x01TagA") - 1] ^ 0x01])
    + d[-len(b"TAGS\x01TagA"):],
    "cut short": lambda d: d[:-1],
    "too short": lambda d: d[:40],
}


@pytest.mark.parametrize("subscription", ["*", "TagA", "TagA || TagB"])
def test_raw_and_decoded_pulls_give_the_same_messages(subscription: str) -> None:
    units, records = store_of(list(GOOD.values()) * 2)
    raw = outcome(False, units, records, subscription)
    assert raw == outcome(True, units, records, subscription)
    messages, next_offset = raw
    assert next_offset == len(units) and messages
    if subscription == "*":
        assert len(messages) == len(units)
        by_name = dict(zip(GOOD, messages, strict=False))
        assert by_name["zlib"].body == b"squeeze me " * 50 and not by_name["zlib"].body_compressed
        assert by_name["lz4 type"].body_compressed and by_name["flagged not zlib"].body_compressed
        assert by_name["ipv6 both"].born_host == "[2001:db8::7]:50001"
        assert by_name["ipv6 store"].store_host == "[::1]:10911" and len(by_name["ipv6 store"].offset_msg_id) == 56
        assert by_name["v2 magic"].topic == TOPIC and by_name["odd properties"].tags == "TagB"


@pytest.mark.parametrize("where", [0, 2])
@pytest.mark.parametrize("damage", DAMAGE)
@pytest.mark.parametrize("subscription", ["*", "TagA"])
def test_a_damaged_record_ends_both_pulls_alike(damage: str, where: int, subscription: str) -> None:
    builds: list[Build] = [lambda q, o: record(q, o, b"y" * 40, properties={"TAGS": "TagA"})] * 4
    units, records = store_of(builds)
    records[where] = DAMAGE[damage](records[where])
    raw = outcome(False, units, records, subscription)
    assert raw == outcome(True, units, records, subscription)
    if where == 0:
        assert raw[0] == "DATA_LOSS" and "queue offset 0" in raw[1]
    else:
        assert raw[1] == where and len(raw[0]) == where


@pytest.mark.parametrize("where", [0, 1])
def test_a_unit_of_another_place_or_a_quarantined_unit_ends_both_alike(where: int) -> None:
    units, records = store_of([GOOD["plain"]] * 3)
    for bad_units, data in (
            ([*units[:where], units[where]._replace(size=units[where].size - 1), *units[where + 1:]], records),
            ([*units[:where], units[where]._replace(queue_offset=9), *units[where + 1:]], records),
            ([*units[:where], units[where]._replace(commitlog_offset=1), *units[where + 1:]], records),
            (units, [*records[:where], DataLossError("commitlog: quarantined range")])):
        raw = outcome(False, bad_units, data)
        assert raw == outcome(True, bad_units, data)
        assert raw[0] == "DATA_LOSS" if where == 0 else len(raw[0]) == where  # next: the bad unit's offset


def test_client_decoder_refuses_damaged_bytes() -> None:
    _, records = store_of([GOOD["plain"]] * 2)
    blob = b"".join(records)
    assert len(decode_records(blob)) == 2
    _, v6 = store_of([GOOD["ipv6 both"]])
    for bad in (blob[:-1], blob + b"\x00" * 5, DAMAGE["body byte"](blob), _flip(7)(blob), v6[0][:100],
                blob + b"\x00" * 100):
        with pytest.raises(ClientDataLossError):
            decode_records(bad)
    assert decode_records(b"") == []
    assert decode_records(blob)[0].queue_id == QUEUE and decode_records(blob, 5)[1].queue_id == 5


names = st.text(st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)), min_size=1, max_size=8)
hosts = st.sampled_from([V4_BORN, V6_BORN, "0.0.0.0:0", "[::]:65535", "255.255.255.255:1"])


@st.composite
def records(draw: st.DrawFn) -> tuple[bytes, int]:
    body = draw(st.binary(max_size=300))
    sys_flag = 0
    if draw(st.booleans()):
        sys_flag = COMPRESSED_FLAG | draw(st.sampled_from([0, 0x100, 0x200, 0x300]))
        if draw(st.booleans()):
            body = zlib.compress(body)
    offset = draw(st.integers(0, 2**62))
    data = record(draw(st.integers(0, 2**62)), offset, body, topic=draw(names.filter(lambda t: len(t.encode()) < 120)),
                  queue_id=draw(st.integers(0, 2**31 - 1)), properties=draw(st.dictionaries(names, names, max_size=5)),
                  sys_flag=sys_flag, born=draw(hosts), store=draw(hosts))
    return (as_v2(data) if draw(st.booleans()) else data), offset


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(records(), min_size=1, max_size=4))
def test_client_decoder_matches_the_store(encoded: list[tuple[bytes, int]]) -> None:
    expected = client_messages([stored_message(data, offset) for data, offset in encoded])
    assert decode_records(b"".join(data for data, _ in encoded)) == expected


def test_the_common_layout_takes_the_cheap_check() -> None:
    """IPv4 hosts and v1 magic are checked from the fixed header, properties decoded only for tags."""
    units, records = store_of([GOOD["plain"], GOOD["utf8"], GOOD["zlib"], GOOD["ipv6 born"]])
    cheap = [checked_raw(r, u.commitlog_offset, TOPIC.encode(), QUEUE, u.queue_offset, False)
             for u, r in zip(units, records, strict=True)]
    tags = [checked_raw(r, u.commitlog_offset, TOPIC.encode(), QUEUE, u.queue_offset, True)
            for u, r in zip(units, records, strict=True)]
    assert (cheap, tags) == (["", "", "", None], ["TagA", "TagA", "", None])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=4), st.integers(0, 400))
def test_client_decoder_fails_only_with_data_loss(flips: list[tuple[int, int]], cut: int) -> None:
    """Damaged bytes (flipped anywhere, cut anywhere) decode or raise DataLossError, nothing else."""
    _, good = store_of([GOOD["plain"], GOOD["ipv6 both"], GOOD["zlib"], GOOD["v2 ipv6"]])
    blob = bytearray(b"".join(good))
    for index, value in flips:
        blob[index % len(blob)] ^= value
    with contextlib.suppress(ClientDataLossError):
        decode_records(bytes(blob[:len(blob) - cut]))


def run_of(units: Sequence[QueueUnit], records: Sequence[bytes]) -> bool:
    """checked_run over the records laid back to back, as the units place them."""
    return checked_run(b"".join(records), unit_table(units), TOPIC.encode(), QUEUE)


COMMON = ["plain", "empty body", "no properties", "other tag", "zlib", "lz4 type", "flagged not zlib", "odd properties"]


def test_a_run_of_common_records_is_checked_at_once() -> None:
    units, records = store_of([GOOD[name] for name in COMMON] * 3)
    assert run_of(units, records)
    for rare in ("utf8", "ipv6 born", "ipv6 store", "v2 magic"):  # checked record by record instead
        units, records = store_of([GOOD["plain"], GOOD[rare], GOOD["plain"]])
        assert not run_of(units, records)


@pytest.mark.parametrize("where", [0, 2])
@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_record_fails_the_run_check(damage: str, where: int) -> None:
    units, records = store_of([lambda q, o: record(q, o, b"y" * 40, properties={"TAGS": "TagA"})] * 4)
    records[where] = DAMAGE[damage](records[where])
    if len(records[where]) != units[where].size:  # the log holds the record's bytes: the unit keeps its size
        units[where] = units[where]._replace(size=len(records[where]))
        for i in range(where + 1, len(units)):
            units[i] = units[i]._replace(commitlog_offset=units[i - 1].commitlog_offset + units[i - 1].size)
    assert not run_of(units, records)


@pytest.mark.parametrize("where", [0, 1])
def test_a_unit_of_another_place_fails_the_run_check(where: int) -> None:
    units, records = store_of([GOOD["plain"]] * 3)
    for bad in (units[where]._replace(queue_offset=9), units[where]._replace(commitlog_offset=1)):
        assert not run_of([*units[:where], bad, *units[where + 1:]], records)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=3))
def test_the_run_check_passes_only_what_the_record_check_passes(flips: list[tuple[int, int]]) -> None:
    units, records = store_of([GOOD[name] for name in COMMON])
    blob = bytearray(b"".join(records))
    for index, value in flips:
        blob[index % len(blob)] ^= value
    base = units[0].commitlog_offset
    damaged = [bytes(blob[u.commitlog_offset - base:u.commitlog_offset - base + u.size]) for u in units]
    if run_of(units, damaged):  # a flipped FLAG or timestamp is no damage a check can see
        query = PullQuery.checked(TOPIC, QUEUE, 0, 1024, 0, parse_subscription("*"), 0, 0)
        assert _collect_raw(query, Selection(units, len(units), 0), damaged, 0) == (damaged, len(units))


class RunLog:
    """A commitlog of 4 KiB files for Puller._read_run: read() slices it and counts its calls."""

    FILE = 4096

    def __init__(self) -> None:
        self.data = bytearray()
        self.reads = 0

    def put(self, data: bytes) -> int:
        if len(self.data) // self.FILE != (len(self.data) + len(data) - 1) // self.FILE:
            self.data += b"\x00" * (-len(self.data) % self.FILE)  # the file's BLANK: records never cross files
        self.data += data
        return len(self.data) - len(data)

    async def read(self, offset: int, size: int) -> bytes:
        self.reads += 1
        if offset // self.FILE != (offset + size - 1) // self.FILE:
            raise InvalidArgumentError(f"[{offset}, {offset + size}) crosses the end of a commitlog file")
        return bytes(self.data[offset:offset + size])


def read_run(log: RunLog, units: list[QueueUnit]) -> bytes | None:
    query = PullQuery.checked(TOPIC, QUEUE, 0, 1024, 0, parse_subscription("*"), 0, 0)
    puller = Puller(cast(Any, None), cast(Any, log), cast(Any, None), cast(Any, None), 0)
    return asyncio.run(puller._read_run(query, units))


def queue_in_runs(log: RunLog, runs: Sequence[int], body: bytes = b"x" * 200) -> tuple[list[QueueUnit], list[bytes]]:
    """Runs of the queue's records, another queue's record between runs; files roll on the way."""
    units, records = [], []
    for count in runs:
        for _ in range(count):
            queue_offset = len(units)
            data = record(queue_offset, 0, body)
            offset = log.put(b"\x00" * len(data))  # where it goes, then the record that says so
            data = record(queue_offset, offset, body)
            log.data[offset:offset + len(data)] = data
            units.append(QueueUnit(queue_offset, offset, len(data), 0))
            records.append(data)
        log.put(record(0, len(log.data), queue_id=QUEUE + 1))
    return units, records


def test_a_pull_reads_each_run_of_its_records_once() -> None:
    log = RunLog()
    units, records = queue_in_runs(log, [12, 9, 30])
    files = {u.commitlog_offset // RunLog.FILE for u in units}
    assert len(files) > 1
    assert read_run(log, units) == b"".join(records)
    assert 3 <= log.reads <= 3 + len(files)  # one per run, one more where a file ends inside a run


def test_scattered_or_damaged_records_are_not_read_as_runs() -> None:
    log = RunLog()
    units, _ = queue_in_runs(log, [2, 1, 3, 2])
    assert read_run(log, units) is None and log.reads == 0  # too few records per run
    log = RunLog()
    units, _ = queue_in_runs(log, [10, 10])
    last = units[-1].commitlog_offset
    log.data[last + 90] ^= 0x40  # a body byte of the last record
    assert read_run(log, units) is None
