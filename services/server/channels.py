"""Client channels between mqstore processes. Every internal hop is made here, so cross-cutting
concerns of the client side (trace context propagation) are added in one place."""

from __future__ import annotations

from collections.abc import Sequence

import grpc

ChannelOptions = Sequence[tuple[str, int | str]]


def aio_channel(address: str, options: ChannelOptions = ()) -> grpc.aio.Channel:
    """A ``grpc.aio`` channel to another mqstore service."""
    return grpc.aio.insecure_channel(address, options=list(options))


def sync_channel(address: str, options: ChannelOptions = ()) -> grpc.Channel:
    """A blocking channel to another mqstore service."""
    return grpc.insecure_channel(address, options=list(options))
