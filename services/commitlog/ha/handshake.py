"""The mqstore handshake: what a follower proves before the leader accepts any offset from it.

4.9.8's HA port trusts whoever connects: any connection could report an offset, and SYNC_MASTER
counted it as a slave that holds the bytes. Between mqstore replicas the follower first sends the
shard it belongs to (brokerName), the epoch it follows and the deployment's service credential
(``MQSTORE_SERVICE_TOKEN``, services/server/service_auth.py); the leader compares the token in
constant time and answers OK, or a refusal and closes. Only then does the 4.9.8 stream begin.

Follower to leader: ``"MQHA" [version:1] [shard length:2][shard] [epoch:8] [token length:2][token]``,
and from version 2 on ``[replica length:2][replica]`` (the follower's name in the shard's in-sync set).
Leader to follower: ``"MQHA" [status:1] [reason length:2][reason]`` (status 0: accepted); to an
accepted version 2 hello it adds ``[max offset:8] [entries:2] ([epoch:8][start offset:8])*``: its epoch
file, from which the follower finds the point its log shares with the leader's (``epoch_file.py``); to
a version 3 hello also ``[ranges:2] ([start:8][end:8][reason length:2][reason])*``: its quarantined
ranges, which the follower adopts before it copies their bytes (``formats/quarantine.py``).
"""

from __future__ import annotations

import hmac
import socket
import struct
from dataclasses import dataclass

from services.commitlog.ha.epoch_file import EpochEntry
from services.commitlog.ha.wire import ConnectionClosed, recv_exact
from services.store.formats.quarantine import QuarantinedRange

MAGIC = b"MQHA"
VERSION = 3
VERSIONS = (1, 2, 3)
#: The epoch every replica follows until epochs are kept (docs/replication.md: not built yet).
CURRENT_EPOCH = 0
MAX_SHARD_BYTES = 255
MAX_TOKEN_BYTES = 4096
_LENGTH = struct.Struct(">H")
_EPOCH = struct.Struct(">q")
_ENTRY = struct.Struct(">qq")
MAX_EPOCH_ENTRIES = 65535
MAX_QUARANTINED_RANGES = 65535
MAX_REASON_BYTES = 1024
ACCEPTED = 0
REFUSED = 1


class HandshakeRefused(ConnectionError):
    """The peer did not pass the handshake; the message says why (never the token)."""


@dataclass(frozen=True, slots=True)
class Hello:
    shard: str
    epoch: int
    token: bytes
    replica: str = ""
    version: int = VERSION


@dataclass(frozen=True, slots=True)
class LeaderLog:
    """What an accepted follower learns: the leader's max offset and epoch entries (version 2 on), and
    its quarantined ranges (version 3 on)."""

    max_offset: int
    epochs: list[EpochEntry]
    quarantined: tuple[QuarantinedRange, ...] = ()


def encode_hello(hello: Hello) -> bytes:
    shard, replica = hello.shard.encode(), hello.replica.encode()
    if len(shard) > MAX_SHARD_BYTES or len(replica) > MAX_SHARD_BYTES or len(hello.token) > MAX_TOKEN_BYTES:
        raise ValueError(f"the shard or replica name (at most {MAX_SHARD_BYTES} bytes) or the service token "
                         f"(at most {MAX_TOKEN_BYTES} bytes) is too long for the HA handshake")
    return b"".join((MAGIC, bytes([VERSION]), _LENGTH.pack(len(shard)), shard, _EPOCH.pack(hello.epoch),
                     _LENGTH.pack(len(hello.token)), hello.token, _LENGTH.pack(len(replica)), replica))


def read_hello(sock: socket.socket) -> Hello:
    """The follower's hello; HandshakeRefused when what arrived is not one (a bare 4.9.8 slave's first
    8 bytes are its offset, never "MQHA" + version 1)."""
    head = recv_exact(sock, len(MAGIC) + 1)
    if head[:len(MAGIC)] != MAGIC or head[len(MAGIC)] not in VERSIONS:
        raise HandshakeRefused("no mqstore HA handshake (a bare RocketMQ 4.9.8 slave, or not a replica at all): "
                               "set haProtocol=rocketmq on the leader to accept 4.9.8 slaves")
    shard_length = _LENGTH.unpack(recv_exact(sock, _LENGTH.size))[0]
    if shard_length > MAX_SHARD_BYTES:
        raise HandshakeRefused(f"shard name of {shard_length} bytes, more than {MAX_SHARD_BYTES}")
    shard = recv_exact(sock, shard_length).decode(errors="replace")
    epoch = _EPOCH.unpack(recv_exact(sock, _EPOCH.size))[0]
    token_length = _LENGTH.unpack(recv_exact(sock, _LENGTH.size))[0]
    if token_length > MAX_TOKEN_BYTES:
        raise HandshakeRefused(f"service token of {token_length} bytes, more than {MAX_TOKEN_BYTES}")
    token = recv_exact(sock, token_length)
    version = head[len(MAGIC)]
    if version == 1:
        return Hello(shard, epoch, token, version=1)
    replica_length = _LENGTH.unpack(recv_exact(sock, _LENGTH.size))[0]
    if replica_length > MAX_SHARD_BYTES:
        raise HandshakeRefused(f"replica name of {replica_length} bytes, more than {MAX_SHARD_BYTES}")
    return Hello(shard, epoch, token, recv_exact(sock, replica_length).decode(errors="replace"), version)


def check_hello(hello: Hello, shard: str, epoch: int, token: str | None) -> None:
    """Raise HandshakeRefused unless ``hello`` names this shard and epoch and carries ``token`` (empty
    when the deployment has none: then the listener is on loopback only). Constant-time compare."""
    expected = (token or "").encode()
    token_ok = hmac.compare_digest(hello.token, expected)
    if not token_ok:
        raise HandshakeRefused("the service token does not match this deployment's (MQSTORE_SERVICE_TOKEN)")
    if hello.shard != shard:
        raise HandshakeRefused(f"the follower belongs to shard {hello.shard!r}, this leader is shard {shard!r} "
                               "(brokerName)")
    if hello.epoch != epoch:
        raise HandshakeRefused(f"the follower follows epoch {hello.epoch}, this leader's epoch is {epoch}")


def encode_answer(status: int, reason: str = "", leader_log: LeaderLog | None = None, version: int = VERSION) -> bytes:
    """``leader_log``: only in the acceptance of a hello of version 2 or more (``version``)."""
    text = reason.encode()[:MAX_REASON_BYTES]
    answer = MAGIC + bytes([status]) + _LENGTH.pack(len(text)) + text
    if leader_log is None:
        return answer
    entries = leader_log.epochs[-MAX_EPOCH_ENTRIES:]
    parts = [answer, _EPOCH.pack(leader_log.max_offset), _LENGTH.pack(len(entries)),
             *(_ENTRY.pack(e.epoch, e.start_offset) for e in entries)]
    if version >= 3:
        if len(leader_log.quarantined) > MAX_QUARANTINED_RANGES:  # never cut: a range left out is read
            raise ValueError(f"{len(leader_log.quarantined)} quarantined ranges, more than the handshake's "
                             f"{MAX_QUARANTINED_RANGES}")
        parts.append(_LENGTH.pack(len(leader_log.quarantined)))
        for bad in leader_log.quarantined:
            why = bad.reason.encode()[:MAX_REASON_BYTES]
            parts += [_ENTRY.pack(bad.start, bad.end), _LENGTH.pack(len(why)), why]
    return b"".join(parts)


def read_leader_log(sock: socket.socket, version: int = VERSION) -> LeaderLog:
    """What follows the acceptance of a hello of ``version`` (2 or more)."""
    max_offset = _EPOCH.unpack(recv_exact(sock, _EPOCH.size))[0]
    count = _LENGTH.unpack(recv_exact(sock, _LENGTH.size))[0]
    data = recv_exact(sock, count * _ENTRY.size)
    epochs = [EpochEntry(*_ENTRY.unpack_from(data, i * _ENTRY.size)) for i in range(count)]
    quarantined: list[QuarantinedRange] = []
    if version >= 3:
        for _ in range(_LENGTH.unpack(recv_exact(sock, _LENGTH.size))[0]):
            start, end = _ENTRY.unpack(recv_exact(sock, _ENTRY.size))
            why = recv_exact(sock, _LENGTH.unpack(recv_exact(sock, _LENGTH.size))[0]).decode(errors="replace")
            if not 0 <= start < end:
                raise ConnectionClosed(f"the leader sent a quarantined range [{start}, {end}) that is no range")
            quarantined.append(QuarantinedRange(start, end, why))
    return LeaderLog(max_offset, epochs, tuple(quarantined))


def read_answer(sock: socket.socket) -> None:
    """The leader's answer; HandshakeRefused with its reason unless accepted."""
    head = recv_exact(sock, len(MAGIC) + 1 + _LENGTH.size)
    if head[:len(MAGIC)] != MAGIC:
        raise ConnectionClosed("the leader answered no mqstore HA handshake: is it a RocketMQ 4.9.8 master? "
                               "(then set haProtocol=rocketmq)")
    reason = recv_exact(sock, _LENGTH.unpack_from(head, len(MAGIC) + 1)[0]).decode(errors="replace")
    if head[len(MAGIC)] != ACCEPTED:
        raise HandshakeRefused(f"the leader refused the handshake: {reason}")
