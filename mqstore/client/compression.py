"""The one rule for a body its producer compressed (sysflag 0x1), shared by every reader and the send check.

A body flagged compressed with compression type 0 (what 4.9.8 clients write) or ZLIB (RocketMQ 5's
type 3 in sysflag bits 8-10) inflates when it is one whole zlib stream - nothing missing, nothing
after it - of at most :data:`MAX_INFLATED_BODY_BYTES` inflated. Then a consumer gets the inflated
body; otherwise the stored bytes with their compressed flag, never an empty or partial body. Other
types (LZ4 1, ZSTD 2) have no codec here: they are handed over as stored, flag set. A producer's send
of a zlib-flagged body that does not inflate is refused, so the store holds such a body only when it
was written by something else (another broker, or before the send check).

The server imports this module too (the server's distribution depends on the client's): one rule for
the store's reads, the gateway's sends and the client's own decoding of raw records.
"""

from __future__ import annotations

import zlib

COMPRESSED_FLAG = 0x1
#: Compression type bits of a RocketMQ 5 sysflag; none (4.9.8) means zlib.
COMPRESSION_TYPE_MASK = 0x7 << 8
COMPRESSION_ZLIB_TYPE = 0x3 << 8
#: A body that would inflate beyond this is handed over still compressed (and refused at the send).
MAX_INFLATED_BODY_BYTES = 64 * 1024 * 1024


class NotInflatable(ValueError):
    """A zlib-flagged body that the rule does not inflate; the message says why ("the body ...")."""


def is_zlib(sys_flag: int) -> bool:
    """Whether a compressed body of this sysflag is zlib data (compression type none or ZLIB)."""
    return sys_flag & COMPRESSION_TYPE_MASK in (0, COMPRESSION_ZLIB_TYPE)


def inflate(body: bytes) -> bytes:
    """``body`` inflated, or NotInflatable: not zlib data, a stream cut short or followed by other
    bytes (their loss would be silent), or more than the bound inflated."""
    inflater = zlib.decompressobj()
    try:
        inflated = inflater.decompress(body, MAX_INFLATED_BODY_BYTES)
    except zlib.error as exc:
        raise NotInflatable(f"the body is not zlib data ({exc})") from None
    if not inflater.eof:
        if len(inflated) >= MAX_INFLATED_BODY_BYTES:
            raise NotInflatable(f"the body inflates to more than {MAX_INFLATED_BODY_BYTES} bytes "
                                f"({MAX_INFLATED_BODY_BYTES >> 20} MiB), the store's bound")
        raise NotInflatable("the body ends before its zlib stream does (truncated)")
    if inflater.unused_data:
        raise NotInflatable(f"the body has {len(inflater.unused_data)} bytes after the end of its zlib stream")
    return inflated


def consumer_body(body: bytes, sys_flag: int) -> tuple[bytes, bool]:
    """(the body a consumer gets, whether it is still compressed): inflated when the rule allows,
    otherwise as stored with the flag kept."""
    if not sys_flag & COMPRESSED_FLAG:
        return body, False
    if not is_zlib(sys_flag):
        return body, True
    try:
        return inflate(body), False
    except NotInflatable:
        return body, True
