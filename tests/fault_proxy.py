"""A fault-injecting TCP proxy the tests own: a loopback port in front of one service, whose traffic
the test can let pass, hold, drop or delay, in one direction or both.

It stands in for a network between two processes on one machine (no namespaces, no root):

* ``pass``: bytes flow;
* ``hold``: bytes stop flowing (a partition: the connections stay open, TCP would retransmit, and
  what was held arrives once the fault heals, unless a side gave up on the silent connection first);
* ``drop``: every connection is reset and new ones are reset at once (a peer that went away);
* ``delay``: each chunk is forwarded ``delay_s`` late (a slow link).

``up`` is client -> service, ``down`` service -> client. The proxy runs an asyncio loop on its own
thread; every method is safe to call from the test's threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

PASS, HOLD, DROP = "pass", "hold", "drop"
UP, DOWN = "up", "down"
CHUNK = 64 * 1024


@dataclass
class _Direction:
    mode: str = PASS
    delay_s: float = 0.0
    open: asyncio.Event | None = None  # set while not held


class FaultProxy:
    """``127.0.0.1:port`` forwarding to ``target`` (``host:port``)."""

    def __init__(self, target: str, port: int = 0) -> None:
        host, target_port = target.rsplit(":", 1)
        self.target = (host, int(target_port))
        self._loop = asyncio.new_event_loop()
        self._directions = {UP: _Direction(), DOWN: _Direction()}
        self._writers: set[asyncio.StreamWriter] = set()
        self._server: asyncio.AbstractServer | None = None
        self.connections = 0  # accepted so far
        sock = socket.create_server(("127.0.0.1", port))
        self.port = sock.getsockname()[1]
        self._thread = threading.Thread(target=self._run, args=(sock,), name=f"fault-proxy-{self.port}",
                                        daemon=True)
        ready = threading.Event()
        self._ready = ready
        self._thread.start()
        ready.wait(10)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    # -- faults ------------------------------------------------------------------------------------
    def set(self, mode: str, direction: str | None = None, delay_s: float = 0.0) -> None:
        """Put one direction (or both) in ``mode``; ``drop`` resets every connection now and later."""
        if mode not in (PASS, HOLD, DROP):
            raise ValueError(f"mode must be {PASS}, {HOLD} or {DROP}, not {mode!r}")
        names = [direction] if direction else [UP, DOWN]
        self._call(self._set, names, mode, delay_s)

    def heal(self) -> None:
        self.set(PASS)

    def delay(self, delay_s: float, direction: str | None = None) -> None:
        self.set(PASS, direction, delay_s)

    def describe(self) -> str:
        return ", ".join(f"{name} {d.mode}{f' +{d.delay_s:.2f}s' if d.delay_s else ''}"
                         for name, d in self._directions.items())

    def close(self) -> None:
        self._call(self._close)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    # -- the loop ----------------------------------------------------------------------------------
    def _call(self, fn: object, *args: object) -> None:
        async def run() -> None:
            fn(*args)  # type: ignore[operator]
        asyncio.run_coroutine_threadsafe(run(), self._loop).result(10)

    def _set(self, names: list[str], mode: str, delay_s: float) -> None:
        for name in names:
            direction = self._directions[name]
            direction.mode, direction.delay_s = mode, delay_s
            assert direction.open is not None
            if mode == HOLD:
                direction.open.clear()
            else:
                direction.open.set()
        if mode == DROP:
            for writer in list(self._writers):
                _reset(writer)

    def _close(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            _reset(writer)

    def _run(self, sock: socket.socket) -> None:
        asyncio.set_event_loop(self._loop)
        for direction in self._directions.values():
            direction.open = asyncio.Event()
            direction.open.set()
        self._server = self._loop.run_until_complete(asyncio.start_server(self._accept, sock=sock))
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            self._loop.close()

    def _dropping(self) -> bool:
        return any(d.mode == DROP for d in self._directions.values())

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        if self._dropping():
            _reset(writer)
            return
        try:
            target_reader, target_writer = await asyncio.open_connection(*self.target)
        except OSError:
            _reset(writer)
            return
        self._writers.update((writer, target_writer))
        pumps = [asyncio.ensure_future(self._pump(reader, target_writer, self._directions[UP])),
                 asyncio.ensure_future(self._pump(target_reader, writer, self._directions[DOWN]))]
        await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        for task in pumps:
            task.cancel()
        for w in (writer, target_writer):
            self._writers.discard(w)
            _reset(w) if self._dropping() else w.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, direction: _Direction) -> None:
        assert direction.open is not None
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while data := await reader.read(CHUNK):
                await direction.open.wait()  # held: stop reading, the sender's buffers fill (back-pressure)
                if direction.delay_s:
                    await asyncio.sleep(direction.delay_s)
                writer.write(data)
                await writer.drain()


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP reset (SO_LINGER 0), as a peer that vanished does."""
    sock = writer.get_extra_info("socket")
    with contextlib.suppress(OSError):
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    writer.transport.abort()


@contextmanager
def fault_proxy(target: str) -> Iterator[FaultProxy]:
    proxy = FaultProxy(target)
    try:
        yield proxy
    finally:
        proxy.close()
