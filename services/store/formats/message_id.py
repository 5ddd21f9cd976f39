"""Offset message ids: where a message is stored, as RocketMQ's broker writes them (MessageDecoder).

Store host address (IPv4 4 bytes or IPv6 16), its port (4) and the commitlog offset (8), as upper-case
hex: 32 digits for an IPv4 store host, 56 for IPv6. The producer's UNIQ_KEY (uniq_key.py) has the same
two lengths, so an id's length never says which kind it is: a lookup tries it as an offset id first
and keeps the record there only if that record's own STOREHOST and offset spell the same id.

The store host in an id is the host that wrote the record, not the one a store has now: a broker whose
``brokerIP`` changed (a rescheduled pod) still holds records of its old address, so a shard answers an
id by the STOREHOST its record carries, never by comparing with its current configuration.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

from services.store.errors import InvalidArgumentError
from services.store.formats.socket_address import decode_address, encode_address
from services.store.formats.uniq_key import UNIQ_KEY_LENGTHS

_OFFSET = struct.Struct(">q")
_PORT = struct.Struct(">i")
IPV4_ID_LENGTH = 32
IPV6_ID_LENGTH = 56
#: Hex digits of an offset msg id: IPv4 store host, IPv6 store host.
OFFSET_ID_LENGTHS = (IPV4_ID_LENGTH, IPV6_ID_LENGTH)
_HEX = frozenset("0123456789abcdefABCDEF")


class MessageIdError(ValueError):
    """A string that is not an offset message id."""


class MessageIdKind(enum.Enum):
    """What a caller says an id is (proto MessageIdKind's numbers)."""

    UNSPECIFIED = 0
    OFFSET = 1
    UNIQ_KEY = 2


def message_id_kind(value: int) -> MessageIdKind:
    try:
        return MessageIdKind(value)
    except ValueError:
        raise InvalidArgumentError(f"message id kind {value} is not one of "
                                   f"{', '.join(f'{k.value} ({k.name})' for k in MessageIdKind)}") from None


def check_message_id(msg_id: str, kind: MessageIdKind) -> None:
    """Hex digits of a length an id of that kind can have: an offset msg id has 32 (IPv4 store host) or
    56 (IPv6), a UNIQ_KEY 32 (IPv4 producer) or 56 (IPv6). Raises InvalidArgumentError."""
    lengths = {MessageIdKind.OFFSET: OFFSET_ID_LENGTHS, MessageIdKind.UNIQ_KEY: UNIQ_KEY_LENGTHS}.get(
        kind, tuple(sorted({*OFFSET_ID_LENGTHS, *UNIQ_KEY_LENGTHS})))
    if len(msg_id) not in lengths or not is_hex_digits(msg_id):
        what = {MessageIdKind.OFFSET: "an offset msg id", MessageIdKind.UNIQ_KEY: "a UNIQ_KEY"}.get(
            kind, "a message id (an offset msg id or a UNIQ_KEY)")
        raise InvalidArgumentError(f"message id {msg_id[:80]!r} must be {' or '.join(map(str, lengths))} hex digits "
                                   f"to be {what}")


def is_hex_digits(text: str) -> bool:
    """ASCII hex digits only (``str.isalnum`` and ``int(x, 16)`` also take full-width digits). Checked
    for every produced message's UNIQ_KEY: one C-level set operation, not a loop over the characters."""
    return _HEX.issuperset(text)


@dataclass(frozen=True, slots=True)
class OffsetMessageId:
    """A decoded offset msg id; ``store_host_bytes`` is the 8- or 20-byte STOREHOST as a record holds it."""

    store_host_bytes: bytes
    commitlog_offset: int

    @property
    def store_host(self) -> str:
        """``ip:port``, IPv6 in brackets: the form record decoders print."""
        return decode_address(self.store_host_bytes)

    def __str__(self) -> str:
        return encode_message_id(self.store_host_bytes, self.commitlog_offset)


def encode_message_id(store_host: bytes, commitlog_offset: int) -> str:
    """``store_host`` is the 8- (IPv4) or 20-byte (IPv6) stored address."""
    return (store_host + _OFFSET.pack(commitlog_offset)).hex().upper()


def make_message_id(store_host: str, commitlog_offset: int) -> str:
    return encode_message_id(encode_address(store_host), commitlog_offset)


def parse_message_id(msg_id: str) -> OffsetMessageId:
    """32 hex digits (IPv4 store host) or 56 (IPv6), either case. Raises MessageIdError when the text
    cannot be an offset id: another length, non-hex, a port outside 0..65535 or a negative offset (a
    broker writes neither; RocketMQ's decodeMessageId refuses such a port too)."""
    if len(msg_id) not in OFFSET_ID_LENGTHS:
        raise MessageIdError(f"message id {msg_id[:80]!r} must be 32 (IPv4 store host) or 56 (IPv6) hex digits "
                             "to be an offset msg id")
    if not is_hex_digits(msg_id):
        raise MessageIdError(f"message id {msg_id!r} must be hex digits only")
    raw = bytes.fromhex(msg_id)
    host = raw[:-8]
    port = _PORT.unpack_from(host, len(host) - 4)[0]
    offset = _OFFSET.unpack_from(raw, len(raw) - 8)[0]
    if not 0 <= port <= 65535:
        raise MessageIdError(f"message id {msg_id} is no offset msg id: its port field is {port}, not within "
                             "0..65535")
    if offset < 0:
        raise MessageIdError(f"message id {msg_id} is no offset msg id: its commitlog offset field is {offset}")
    return OffsetMessageId(host, offset)


def decode_message_id(msg_id: str) -> tuple[str, int]:
    """-> (``"ip:port"``, commitlog offset); see :func:`parse_message_id`."""
    parsed = parse_message_id(msg_id)
    return parsed.store_host, parsed.commitlog_offset
