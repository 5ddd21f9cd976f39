"""UNIQ_KEY generation in RocketMQ's client layout (MessageClientIDSetter.createUniqID).

32 upper-case hex digits: producer IPv4 (4 bytes), pid (2), a per-process random int (4, the Java
client's class-loader hash), milliseconds since the start of the current month (4), and a counter
(2). Unique per gateway process as long as it sends fewer than 65,536 messages in one millisecond.
"""

from __future__ import annotations

import datetime
import itertools
import os
import secrets
import socket
import struct
import threading
import time

_TAIL = struct.Struct(">iH")


def _month_start_ms(now_ms: int) -> tuple[int, int]:
    """(start of this month, start of the next) in local time, as the Java client's Calendar does."""
    now = datetime.datetime.fromtimestamp(now_ms / 1000)
    start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    following = (start + datetime.timedelta(days=32)).replace(day=1)
    return int(start.timestamp() * 1000), int(following.timestamp() * 1000)


class UniqKeyGenerator:
    def __init__(self, ip: str = "127.0.0.1", pid: int | None = None) -> None:
        try:
            packed_ip = socket.inet_aton(ip)
        except OSError:
            packed_ip = secrets.token_bytes(4)  # the Java client's createFakeIP
        fixed = packed_ip + struct.pack(">H", (os.getpid() if pid is None else pid) & 0xFFFF) + secrets.token_bytes(4)
        self._prefix = fixed.hex().upper()
        self._counter = itertools.count()
        self._lock = threading.Lock()
        self._start_ms, self._next_start_ms = _month_start_ms(int(time.time() * 1000))

    def next(self) -> str:
        now_ms = int(time.time() * 1000)
        if now_ms >= self._next_start_ms:
            with self._lock:
                if now_ms >= self._next_start_ms:
                    self._start_ms, self._next_start_ms = _month_start_ms(now_ms)
        diff = now_ms - self._start_ms
        # The Java int cast; a month is 2.7e9 ms at most, so wrap like the client does.
        diff = ((diff + 2**31) % 2**32) - 2**31
        return self._prefix + _TAIL.pack(diff, next(self._counter) & 0xFFFF).hex().upper()


def decode_uniq_key(uniq_key: str) -> tuple[str, int, int]:
    """(producer ip, pid, counter) of a 32-digit UNIQ_KEY; ValueError when it is not one."""
    raw = bytes.fromhex(uniq_key)
    if len(raw) != 16:
        raise ValueError(f"UNIQ_KEY {uniq_key!r} must be 32 hex digits")
    return socket.inet_ntoa(raw[:4]), struct.unpack_from(">H", raw, 4)[0], struct.unpack_from(">H", raw, 14)[0]
