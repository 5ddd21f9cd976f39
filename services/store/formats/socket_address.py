"""Host addresses as RocketMQ stores them: IPv4 4 bytes or IPv6 16 bytes, then a 4-byte port."""

from __future__ import annotations

import ipaddress
import struct

_PORT = struct.Struct(">i")


class AddressError(ValueError):
    """An address string that is not ``ip:port`` (IPv6 as ``[ip]:port``)."""


def parse_address(text: str) -> tuple[bytes, int]:
    """``"ip:port"`` -> (packed ip, port). Raises AddressError with what to fix."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not host:
        raise AddressError(f"address {text!r} must look like ip:port")
    bracketed = host.startswith("[") and host.endswith("]")
    if host.startswith("[") != host.endswith("]") or ":" in host and not bracketed:
        raise AddressError(f"address {text!r} must look like ip:port, with an IPv6 ip in brackets ([::1]:80)")
    host = host[1:-1] if bracketed else host
    try:
        ip = ipaddress.ip_address(host)
        port = int(port_text)
    except ValueError as exc:
        raise AddressError(f"address {text!r} must look like ip:port ({exc})") from None
    if not 0 <= port <= 65535:
        raise AddressError(f"port {port} in {text!r} must be within 0..65535")
    return ip.packed, port


def encode_address(text: str) -> bytes:
    """``"ip:port"`` -> 8 bytes (IPv4) or 20 bytes (IPv6) as stored in a record."""
    ip, port = parse_address(text)
    return ip + _PORT.pack(port)


def decode_address(raw: bytes) -> str:
    """Inverse of :func:`encode_address`; the format of the fixture dumps (``127.0.0.1:10911``)."""
    ip = ipaddress.ip_address(bytes(raw[:-4]))
    port = _PORT.unpack_from(raw, len(raw) - 4)[0]
    return f"{ip}:{port}" if ip.version == 4 else f"[{ip}]:{port}"
