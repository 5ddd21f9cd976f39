"""Offset message ids: store host (ip + port) and commitlog offset, as 32 (IPv4) upper-case hex digits."""

from __future__ import annotations

import struct

from services.store.socket_address import decode_address, encode_address

_OFFSET = struct.Struct(">q")


class MessageIdError(ValueError):
    """A string that is not an offset message id."""


def encode_message_id(store_host: bytes, commitlog_offset: int) -> str:
    """``store_host`` is the 8- (IPv4) or 20-byte (IPv6) stored address."""
    return (store_host + _OFFSET.pack(commitlog_offset)).hex().upper()


def make_message_id(store_host: str, commitlog_offset: int) -> str:
    return encode_message_id(encode_address(store_host), commitlog_offset)


def decode_message_id(msg_id: str) -> tuple[str, int]:
    """-> (``"ip:port"``, commitlog offset). Accepts 32 hex digits (IPv4) or 56 (IPv6)."""
    if len(msg_id) not in (32, 56):
        raise MessageIdError(f"message id {msg_id!r} must be 32 (IPv4) or 56 (IPv6) hex digits")
    try:
        raw = bytes.fromhex(msg_id)
    except ValueError:
        raise MessageIdError(f"message id {msg_id!r} must be hex digits only") from None
    return decode_address(raw[:-8]), _OFFSET.unpack_from(raw, len(raw) - 8)[0]
