"""What a finished gRPC call leaves behind in a ``grpc.aio`` server process.

A call that ends must free its state (grpc's RPCState, its context, the request) by reference
counting alone: a reference cycle is freed only when the cyclic collector runs, and the services
run it rarely (services/server/gc_tuning.py), so per-call cycles pile up for minutes.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import AsyncIterator, Callable, Iterator

import grpc


def live(type_name: str) -> int:
    """Objects of that type (by class name) the collector tracks now."""
    return sum(1 for o in gc.get_objects() if type(o).__name__ == type_name)


@contextlib.contextmanager
def collector_off() -> Iterator[None]:
    """No cyclic collection while the calls run: what is left afterwards was not freed by reference
    counting (a collection first, so earlier tests' garbage does not count)."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@contextlib.asynccontextmanager
async def in_process_server(register: Callable[[grpc.aio.Server], None]) -> AsyncIterator[grpc.aio.Channel]:
    """A ``grpc.aio`` server on a free loopback port with the servicer ``register`` adds, and a
    channel to it."""
    server = grpc.aio.server()
    register(server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield channel
    finally:
        await server.stop(None)
