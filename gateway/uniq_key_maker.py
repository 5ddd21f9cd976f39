"""UNIQ_KEYs the gateway makes for messages that come without one (services/store/formats/uniq_key.py's layout).

The gateway makes the id the producer's RocketMQ client would have made, so its IP part is the
producer's: the message's born host (4 bytes and 32 hex digits for IPv4, 16 bytes and 56 digits for
IPv6, as a 4.9.8 client on that address makes). The pid and the random int (the Java client's
class-loader hash) are the gateway process's, the counter is shared by all producers: ids are unique
per gateway process as long as it makes fewer than 65,536 in one millisecond.
"""

from __future__ import annotations

import datetime
import itertools
import os
import secrets
import threading
import time

from services.store.formats.uniq_key import packed_ip, uniq_key_prefix, uniq_key_suffix

# A clock stepped back by NTP less than this much gives 0 rather than a negative time, as the client does.
_NTP_STEP_MS = 1_000_000
_MAX_CACHED_PREFIXES = 4096


def _month_start_ms(now_ms: int) -> tuple[int, int]:
    """(start of this month, start of the next) in local time, as the Java client's Calendar does."""
    now = datetime.datetime.fromtimestamp(now_ms / 1000)
    start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    following = (start + datetime.timedelta(days=32)).replace(day=1)
    return int(start.timestamp() * 1000), int(following.timestamp() * 1000)


def _born_ip(born_host: str) -> str:
    """The ip of ``ip:port`` or ``[ip]:port``."""
    host = born_host.rpartition(":")[0]
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


class UniqKeyGenerator:
    def __init__(self, ip: str = "127.0.0.1", pid: int | None = None) -> None:
        """``ip`` is used for messages whose born host is no IP address."""
        self._pid = os.getpid() if pid is None else pid
        self._class_loader_hash = int.from_bytes(secrets.token_bytes(4), "big", signed=True)
        try:
            default_ip = packed_ip(ip)
        except ValueError:
            default_ip = secrets.token_bytes(4)  # the Java client's createFakeIP
        self._default_prefix = uniq_key_prefix(default_ip, self._pid, self._class_loader_hash)
        self._prefixes: dict[str, str] = {}
        self._counter = itertools.count()
        self._lock = threading.Lock()
        self._start_ms, self._next_start_ms = _month_start_ms(int(time.time() * 1000))

    def next(self, born_host: str = "") -> str:
        """A new UNIQ_KEY for a message born at ``born_host`` (``ip:port``; "" = the default ip)."""
        now_ms = int(time.time() * 1000)
        if now_ms >= self._next_start_ms:
            with self._lock:
                if now_ms >= self._next_start_ms:
                    self._start_ms, self._next_start_ms = _month_start_ms(now_ms)
        diff = ((now_ms - self._start_ms + 2**31) % 2**32) - 2**31  # the client's int cast
        if -_NTP_STEP_MS < diff < 0:
            diff = 0
        return self._prefix(born_host) + uniq_key_suffix(diff, next(self._counter))

    def _prefix(self, born_host: str) -> str:
        if not born_host:
            return self._default_prefix
        ip = _born_ip(born_host)
        prefix = self._prefixes.get(ip)
        if prefix is None:
            try:
                prefix = uniq_key_prefix(packed_ip(ip), self._pid, self._class_loader_hash)
            except ValueError:
                prefix = self._default_prefix
            if len(self._prefixes) >= _MAX_CACHED_PREFIXES:
                self._prefixes.clear()
            self._prefixes[ip] = prefix
        return prefix
