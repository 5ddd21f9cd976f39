"""The two id formats (services/store/formats/message_id.py, services/store/formats/uniq_key.py) and the gateway's
UNIQ_KEY generator: round trips at every length RocketMQ 4.9.8 makes, and what is refused."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.uniq_key_maker import UniqKeyGenerator
from services.store.errors import InvalidArgumentError
from services.store.formats.message_id import (
    MessageIdError,
    MessageIdKind,
    check_message_id,
    decode_message_id,
    encode_message_id,
    make_message_id,
    message_id_kind,
    parse_message_id,
)
from services.store.formats.socket_address import encode_address
from services.store.formats.uniq_key import UniqKeyError, decode_uniq_key, encode_uniq_key, packed_ip


def _not_mapped(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    return isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is None  # else 32 digits


ipv4 = st.ip_addresses(v=4)
ipv6 = st.ip_addresses(v=6).filter(_not_mapped)
ips = st.one_of(ipv4, ipv6)
ports = st.integers(0, 65535)
offsets = st.integers(0, 2**63 - 1)


def host_text(ip: ipaddress.IPv4Address | ipaddress.IPv6Address, port: int) -> str:
    return f"{ip}:{port}" if ip.version == 4 else f"[{ip}]:{port}"


@given(ip=ips, port=ports, offset=offsets)
def test_offset_ids_round_trip_for_ipv4_and_ipv6_store_hosts(ip: ipaddress.IPv4Address | ipaddress.IPv6Address,
                                                             port: int, offset: int) -> None:
    host = host_text(ip, port)
    msg_id = make_message_id(host, offset)
    assert len(msg_id) == (32 if ip.version == 4 else 56) and msg_id == msg_id.upper()
    assert decode_message_id(msg_id) == decode_message_id(msg_id.lower()) == (host, offset)
    parsed = parse_message_id(msg_id)
    assert parsed.store_host_bytes == encode_address(host) and str(parsed) == msg_id
    check_message_id(msg_id, MessageIdKind.OFFSET)


def test_offset_id_layout_matches_rocketmq() -> None:
    # MessageDecoder.createMessageId: ip, port (int), offset (long); 127.0.0.1:10911 at 161.
    assert make_message_id("127.0.0.1:10911", 161) == "7F00000100002A9F00000000000000A1"
    assert encode_message_id(encode_address("[::1]:10911"), 1) == "0" * 30 + "01" + "00002A9F" + "0" * 15 + "1"


@pytest.mark.parametrize("msg_id", [
    "7F00000100002A9F00000000000000A",  # 31 digits
    "7F00000100002A9F00000000000000A1" + "00",  # 34
    "7F00000100002A9F00000000000000AG",
    "７F00000100002A9F00000000000000A",  # a full-width digit: str.isalnum says yes
    "7F000001" + "0001869F" + "00000000000000A1",  # port 99999
    "7F000001" + "FFFFFFFF" + "00000000000000A1",  # port -1
    "7F00000100002A9F" + "8000000000000000",  # a negative offset
])
def test_what_is_no_offset_id(msg_id: str) -> None:
    with pytest.raises(MessageIdError):
        parse_message_id(msg_id)


@given(ip=ips, pid=st.integers(0, 0xFFFF), class_loader_hash=st.integers(-2**31, 2**31 - 1),
       month_ms=st.integers(-2**31, 2**31 - 1), counter=st.integers(0, 0xFFFF))
def test_uniq_keys_round_trip_at_32_and_56_digits(ip: ipaddress.IPv4Address | ipaddress.IPv6Address, pid: int,
                                                  class_loader_hash: int, month_ms: int, counter: int) -> None:
    key = encode_uniq_key(ip.packed, pid, class_loader_hash, month_ms, counter)
    # MessageClientIDSetter: LEN = ip.length + 2 + 4 + 4 + 2 bytes, as hex.
    assert len(key) == 2 * (len(ip.packed) + 12) == (32 if ip.version == 4 else 56) and key == key.upper()
    decoded = decode_uniq_key(key)
    assert (decoded.ip, decoded.pid, decoded.class_loader_hash, decoded.month_ms, decoded.counter) == \
        (str(ip), pid, class_loader_hash, month_ms, counter)
    check_message_id(key, MessageIdKind.UNIQ_KEY)
    check_message_id(key, MessageIdKind.UNSPECIFIED)


def test_a_4_9_8_ipv6_client_key_decodes() -> None:
    # An IPv6 producer (2001:db8::5), pid 0x1F40, hash 0x12345678, 1000 ms into the month, counter 7.
    key = "20010DB8000000000000000000000005" + "1F40" + "12345678" + "000003E8" + "0007"
    decoded = decode_uniq_key(key)
    assert (decoded.ip, decoded.pid, decoded.class_loader_hash, decoded.month_ms, decoded.counter) == \
        ("2001:db8::5", 0x1F40, 0x12345678, 1000, 7)


@pytest.mark.parametrize("key", ["", "0A00000100002A9F1B6D3586000000", "0A00000100002A9F1B6D35860000000G",
                                 "0A00000100002A9F1B6D3586000000010A00000100002A9F1B6D",  # 52: no client makes it
                                 "0A000001 0002A9F1B6D358600000001", "０A00000100002A9F1B6D358600000001"])
def test_what_is_no_uniq_key(key: str) -> None:
    with pytest.raises(UniqKeyError):
        decode_uniq_key(key)


@pytest.mark.parametrize("kind", list(MessageIdKind))
@pytest.mark.parametrize("length", [0, 16, 31, 33, 52, 55, 57, 64])
def test_ids_of_other_lengths_are_invalid_for_every_kind(kind: MessageIdKind, length: int) -> None:
    with pytest.raises(InvalidArgumentError, match="32 or 56 hex digits"):
        check_message_id("A" * length, kind)


def test_an_unknown_kind_is_invalid() -> None:
    assert message_id_kind(2) is MessageIdKind.UNIQ_KEY
    with pytest.raises(InvalidArgumentError, match="kind 7"):
        message_id_kind(7)


def test_an_ipv4_mapped_address_is_an_ipv4_producer() -> None:
    assert packed_ip("::ffff:10.1.2.3") == bytes([10, 1, 2, 3])
    assert len(packed_ip("fe80::1")) == 16


def test_the_gateway_makes_keys_with_the_born_host_ip() -> None:
    generator = UniqKeyGenerator(pid=0x1234)
    v4, v6, mapped, unknown, default = (generator.next("10.1.2.3:5000"), generator.next("[2001:db8::7]:5000"),
                                        generator.next("[::ffff:10.1.2.3]:1"), generator.next("not-a-host:1"),
                                        generator.next())
    assert (len(v4), len(v6), len(mapped), len(unknown), len(default)) == (32, 56, 32, 32, 32)
    decoded = [decode_uniq_key(k) for k in (v4, v6, mapped, unknown, default)]
    assert [d.ip for d in decoded] == ["10.1.2.3", "2001:db8::7", "10.1.2.3", "127.0.0.1", "127.0.0.1"]
    assert [d.counter for d in decoded] == [decoded[0].counter + i for i in range(5)]
    assert {(d.pid, d.class_loader_hash) for d in decoded} == {(0x1234, decoded[0].class_loader_hash)}
    assert UniqKeyGenerator(ip="::1").next().startswith("0" * 31 + "1")  # not a fake IPv4 any more
