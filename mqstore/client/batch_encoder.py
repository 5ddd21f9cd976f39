"""The client side of RocketMQ's batch encoding: a batch of messages as one bytes blob.

A SendBatch whose messages travel as ``encoded_messages`` costs the gateway one pass over bytes
instead of a protobuf object per message (see SendBatchRequest in gateway.proto for the layout). The
client gives every message its own UNIQ_KEY here, as RocketMQ's producer does (MessageClientIDSetter's
layout), so the gateway forwards the blob untouched. Kept apart from the server's codec: the client
imports no server code.
"""

from __future__ import annotations

import datetime
import ipaddress
import itertools
import os
import secrets
import socket
import struct
import threading
import time
from collections.abc import Mapping

HEAD = struct.Struct(">iiiii")  # total size, magic (0), body CRC (0), flag, body length
PROPERTIES_LENGTH = struct.Struct(">h")
ENTRY_OVERHEAD = HEAD.size + PROPERTIES_LENGTH.size
MAX_PROPERTIES_BYTES = 32767
UNIQ_KEY = "UNIQ_KEY"
_FIXED = struct.Struct(">Hi")  # pid, class-loader hash
_TAIL = struct.Struct(">iH")  # ms since the month's start, counter


def properties_bytes(properties: Mapping[str, str]) -> bytes:
    """RocketMQ's messageProperties2String as UTF-8: name \\x01 value, pairs separated by \\x02."""
    text = "\x02".join([f"{k}\x01{v}" for k, v in properties.items()])
    for name, value in properties.items():
        if not name or not value or any(c in name or c in value for c in "\x01\x02"):
            raise ValueError(f"property {name!r}={value!r}: names and values must be non-empty and free of "
                             "\\x01 and \\x02")
    data = text.encode("utf-8")
    if len(data) > MAX_PROPERTIES_BYTES:
        raise ValueError(f"properties are {len(data)} bytes encoded, more than {MAX_PROPERTIES_BYTES}")
    return data


def encode_entry(body: bytes, flag: int, properties: bytes) -> bytes:
    """One message of a blob (MessageDecoder.encodeMessage)."""
    return b"".join((HEAD.pack(ENTRY_OVERHEAD + len(body) + len(properties), 0, 0, flag, len(body)), body,
                     PROPERTIES_LENGTH.pack(len(properties)), properties))


def decode_entries(blob: bytes) -> list[tuple[bytes, int, dict[str, str]]]:
    """``(body, flag, properties)`` of every entry (for tests and tools; the gateway checks blobs itself)."""
    out: list[tuple[bytes, int, dict[str, str]]] = []
    pos = 0
    while pos < len(blob):
        total, _, _, flag, body_length = HEAD.unpack_from(blob, pos)
        body_at = pos + HEAD.size
        (props_length,) = PROPERTIES_LENGTH.unpack_from(blob, body_at + body_length)
        props_at = body_at + body_length + PROPERTIES_LENGTH.size
        text = blob[props_at:props_at + props_length].decode("utf-8")
        properties = dict(item.split("\x01", 1) for item in text.split("\x02") if item)
        out.append((blob[body_at:body_at + body_length], flag, properties))
        pos += total
    return out


def _local_ip() -> bytes:
    """The host's address as RocketMQ's client takes it (UtilAll.getIP); loopback when there is none."""
    try:
        address = ipaddress.ip_address(socket.gethostbyname(socket.gethostname()))
    except (OSError, ValueError):
        address = ipaddress.ip_address("127.0.0.1")
    return address.packed


def _month_start_ms(now_ms: int) -> tuple[int, int]:
    now = datetime.datetime.fromtimestamp(now_ms / 1000)
    start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    following = (start + datetime.timedelta(days=32)).replace(day=1)
    return int(start.timestamp() * 1000), int(following.timestamp() * 1000)


class UniqKeys:
    """UNIQ_KEYs in RocketMQ 4.9.8's client layout (ip, pid, class-loader hash, ms since the month's
    start, counter; 32 upper-case hex digits for IPv4): unique per process below 65,536 per ms."""

    def __init__(self, ip: bytes | None = None) -> None:
        packed = _local_ip() if ip is None else ip
        self._prefix = (packed + _FIXED.pack(os.getpid() & 0xFFFF,
                                             int.from_bytes(secrets.token_bytes(4), "big", signed=True))).hex().upper()
        self._counter = itertools.count()
        self._lock = threading.Lock()
        self._start_ms, self._next_start_ms = _month_start_ms(int(time.time() * 1000))

    def next(self) -> str:
        now_ms = int(time.time() * 1000)
        if now_ms >= self._next_start_ms:
            with self._lock:
                if now_ms >= self._next_start_ms:
                    self._start_ms, self._next_start_ms = _month_start_ms(now_ms)
        diff = ((now_ms - self._start_ms + 2**31) % 2**32) - 2**31
        return self._prefix + _TAIL.pack(max(diff, 0), next(self._counter) & 0xFFFF).hex().upper()


UNIQ_KEYS = UniqKeys()
