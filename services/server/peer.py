"""The caller's address as gRPC reports it, turned into the ``ip:port`` a record stores as BORNHOST:
the commitlog service and the gateway both fill in a producer's born host from it."""

from __future__ import annotations

from urllib.parse import unquote

#: born_host of a message whose producer left it empty and whose peer is not an IP (a unix socket).
UNKNOWN_BORN_HOST = "127.0.0.1:0"


def peer_address(peer: str) -> str:
    """``context.peer()`` -> ``ip:port`` as a record stores it.

    ``"ipv4:127.0.0.1:5000"`` -> ``"127.0.0.1:5000"``; ``"ipv6:[::1]:5000"`` (or its URL-escaped form
    ``"ipv6:%5B::1%5D:5000"``, which some gRPC versions report) -> ``"[::1]:5000"``; anything else
    (``unix:``, empty) -> :data:`UNKNOWN_BORN_HOST`.
    """
    scheme, _, address = peer.partition(":")
    if scheme not in ("ipv4", "ipv6") or not address:
        return UNKNOWN_BORN_HOST
    address = unquote(address)
    if scheme == "ipv6" and not address.startswith("["):
        host, _, port = address.rpartition(":")
        address = f"[{host}]:{port}"
    return address
