"""RocketMQ 4.9.8's HA framing (store/ha/HAConnection, HAService.HAClient).

The follower writes its max physical offset, 8 bytes big-endian, whenever it has something new to
report and at least every ``haSendHeartbeatInterval``. The leader writes frames
``[physical offset:8][size:4][size bytes of the commitlog]``; a frame of size 0 is a heartbeat that
says where the leader's stream is. A frame never crosses a commitlog file and holds at most
``haTransferBatchSize`` bytes, possibly ending inside a record.
"""

from __future__ import annotations

import socket
import struct

REPORT = struct.Struct(">q")
FRAME_HEADER = struct.Struct(">qi")


class ConnectionClosed(ConnectionError):
    """The peer closed the connection (or it broke) in the middle of what was being read."""


def recv_exact(sock: socket.socket, size: int) -> bytes:
    """Exactly ``size`` bytes from ``sock``; ConnectionClosed when it ends first."""
    if size == 0:
        return b""
    chunks = bytearray()
    while len(chunks) < size:
        chunk = sock.recv(min(size - len(chunks), 1 << 20))
        if not chunk:
            raise ConnectionClosed(f"the peer closed the connection after {len(chunks)} of {size} bytes")
        chunks += chunk
    return bytes(chunks)


def encode_frame_header(offset: int, size: int) -> bytes:
    return FRAME_HEADER.pack(offset, size)


def read_frame(sock: socket.socket, max_size: int) -> tuple[int, bytes]:
    """One leader frame: (physical offset, bytes); an empty body is a heartbeat."""
    offset, size = FRAME_HEADER.unpack(recv_exact(sock, FRAME_HEADER.size))
    if offset < 0 or not 0 <= size <= max_size:
        raise ConnectionClosed(f"bad HA frame header: offset {offset}, size {size} (at most {max_size})")
    return offset, recv_exact(sock, size)


def encode_report(max_offset: int) -> bytes:
    return REPORT.pack(max_offset)


def read_report(sock: socket.socket) -> int:
    offset: int = REPORT.unpack(recv_exact(sock, REPORT.size))[0]
    if offset < 0:
        raise ConnectionClosed(f"the follower reported a negative offset {offset}")
    return offset
