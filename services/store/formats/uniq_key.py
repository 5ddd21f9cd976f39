"""UNIQ_KEY: the client message id RocketMQ 4.9.8's producer adds (MessageClientIDSetter).

Producer IP (4 bytes for IPv4, 16 for IPv6), pid (2), the client's class-loader hash (4),
milliseconds since the start of the current month (4, a Java int) and a counter (2), as upper-case
hex: 32 digits from an IPv4 producer, 56 from an IPv6 one (the client reads a 28-byte id as IPv6).
The store treats the property as an opaque indexed string; this layout matters to whoever makes one
(the gateway) and to lookups, which must accept both lengths.
"""

from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass

IPV4_KEY_LENGTH = 32
IPV6_KEY_LENGTH = 56
#: Hex digits of a UNIQ_KEY: IPv4 producer, IPv6 producer.
UNIQ_KEY_LENGTHS = (IPV4_KEY_LENGTH, IPV6_KEY_LENGTH)
_FIXED = struct.Struct(">Hi")  # pid, class-loader hash
_TAIL = struct.Struct(">iH")  # ms since the month's start, counter


class UniqKeyError(ValueError):
    """A string that is not a UNIQ_KEY in the client's layout."""


@dataclass(frozen=True, slots=True)
class UniqKey:
    ip: str
    pid: int
    class_loader_hash: int
    month_ms: int
    counter: int


def packed_ip(ip: str) -> bytes:
    """4 bytes for IPv4 (also for an IPv4-mapped IPv6 address, which is an IPv4 producer), 16 for IPv6.
    Raises ValueError for text that is no IP address."""
    address = ipaddress.ip_address(ip)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.packed


def uniq_key_prefix(ip: bytes, pid: int, class_loader_hash: int) -> str:
    """The part fixed for a producer process (the Java client's FIX_STRING)."""
    if len(ip) not in (4, 16):
        raise UniqKeyError(f"a UNIQ_KEY's ip is 4 or 16 bytes, not {len(ip)}")
    return (ip + _FIXED.pack(pid & 0xFFFF, class_loader_hash)).hex().upper()


def uniq_key_suffix(month_ms: int, counter: int) -> str:
    """The per-message part; ``month_ms`` wraps to a Java int and ``counter`` to 16 bits, as the client's
    casts do."""
    return _TAIL.pack(((month_ms + 2**31) % 2**32) - 2**31, counter & 0xFFFF).hex().upper()


def encode_uniq_key(ip: bytes, pid: int, class_loader_hash: int, month_ms: int, counter: int) -> str:
    return uniq_key_prefix(ip, pid, class_loader_hash) + uniq_key_suffix(month_ms, counter)


def decode_uniq_key(uniq_key: str) -> UniqKey:
    """The fields of a 32- or 56-digit UNIQ_KEY; UniqKeyError when it is not one."""
    try:
        raw = bytes.fromhex(uniq_key)
    except ValueError:
        raw = b""
    # Another length, a non-hex character, or whitespace (which fromhex skips).
    if len(uniq_key) not in UNIQ_KEY_LENGTHS or len(raw) * 2 != len(uniq_key):
        raise UniqKeyError(f"UNIQ_KEY {uniq_key[:80]!r} must be 32 (IPv4 producer) or 56 (IPv6) hex digits")
    ip_length = len(raw) - _FIXED.size - _TAIL.size
    pid, class_loader_hash = _FIXED.unpack_from(raw, ip_length)
    month_ms, counter = _TAIL.unpack_from(raw, ip_length + _FIXED.size)
    return UniqKey(str(ipaddress.ip_address(raw[:ip_length])), pid, class_loader_hash, month_ms, counter)
