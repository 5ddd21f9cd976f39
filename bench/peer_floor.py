"""The floor of the stack mqstore is built on: a bare grpc.aio echo, server and clients (bench/peers.py).

No service can answer a gRPC call faster than a server that does nothing but hand the request's bytes
back, on the same library, event loop, machine and payload. The peer table holds every mqstore row
against this floor as well as against Redis and NATS, so a gap is split into "the stack" and "our work":

* ``unary``: one 1 KiB message each way per call (a Send's or a get's payload), 1 in flight or many;
* ``stream``: one bidirectional stream per client process, frames of ``batch`` 1 KiB messages echoed
  back, at most ``data[0]`` frames unanswered (the shape of SendBatchStream's 64-message blobs and of
  a pull's answer), counted in messages.

The server runs as its own process (``python -m bench.peer_floor --port N``), one event loop on the
default grpc.aio settings of mqstore's services (no interceptors, no handlers beyond the echo), with
raw-bytes methods so that no protobuf work is in the floor. The clients are the peer harness's
spawned client processes (bench/peer_runner.py), as for every other system.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import time
from collections.abc import AsyncIterator

import grpc

from bench.peer_runner import Job, Tally, windowed_stream
from bench.workload import BODY_SIZE

SERVICE = "mqstore.bench.Floor"
UNARY = f"/{SERVICE}/Echo"
STREAM = f"/{SERVICE}/EchoStream"
MIB = 1024 * 1024
OPTIONS = [("grpc.max_receive_message_length", 64 * MIB), ("grpc.max_send_message_length", 64 * MIB)]
CLIENT_OPTIONS = [*OPTIONS, ("grpc.use_local_subchannel_pool", 1)]


# -- the server ----------------------------------------------------------------------------------------
async def _echo(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
    return request


async def _echo_stream(requests: AsyncIterator[bytes],
                       context: grpc.aio.ServicerContext[bytes, bytes]) -> AsyncIterator[bytes]:
    async for request in requests:
        yield request


async def serve(port: int) -> None:
    server = grpc.aio.server(options=OPTIONS)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {
        "Echo": grpc.unary_unary_rpc_method_handler(_echo),
        "EchoStream": grpc.stream_stream_rpc_method_handler(_echo_stream),
    }),))
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    print(f"floor echo listening on 127.0.0.1:{bound}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    await server.stop(1)


# -- the clients (bench/peer_runner.py's Session) ---------------------------------------------------------
class FloorSession:
    def __init__(self, job: Job, channel: grpc.aio.Channel) -> None:
        self.job = job
        self.channel = channel
        self.payload = os.urandom(BODY_SIZE * max(job.batch, 1))

    async def close(self) -> None:
        await self.channel.close(None)

    async def worker(self, index: int, deadline_ns: int, tally: Tally) -> None:
        if self.job.op == "unary":
            await self._unary(deadline_ns, tally)
        elif self.job.op == "stream":
            await self._stream(deadline_ns, tally)
        else:
            raise ValueError(f"unknown floor op {self.job.op!r}")

    async def _unary(self, deadline_ns: int, tally: Tally) -> None:
        call = self.channel.unary_unary(UNARY, request_serializer=None, response_deserializer=None)
        payload, size = self.payload, len(self.payload)
        clock, now, append = time.perf_counter_ns, time.monotonic_ns, tally.latencies.append
        while now() < deadline_ns:
            t0 = clock()
            try:
                answer = await call(payload, timeout=60)
            except grpc.aio.AioRpcError as exc:
                tally.error(exc)
                continue
            append(clock() - t0)
            if len(answer) == size:
                tally.ok += 1
            else:
                tally.error(RuntimeError(f"echo answered {len(answer)} of {size} bytes"))

    async def _stream(self, deadline_ns: int, tally: Tally) -> None:
        """One stream, at most ``data[0]`` frames unanswered; latency per frame, written to echoed."""
        payload, batch = self.payload, max(self.job.batch, 1)
        call = self.channel.stream_stream(STREAM, request_serializer=None,
                                          response_deserializer=None)(None, timeout=self.job.duration_s + 120)

        def answered(answer: bytes) -> None:
            if len(answer) == len(payload):
                tally.ok += batch
            else:
                tally.error(RuntimeError(f"echo answered {len(answer)} of {len(payload)} bytes"), batch)

        await windowed_stream(call, lambda: payload, int(self.job.data[0]), deadline_ns, tally, answered, batch)


async def prepare(job: Job) -> FloorSession:
    channel = grpc.aio.insecure_channel(job.target, options=CLIENT_OPTIONS)
    await channel.channel_ready()
    return FloorSession(job, channel)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.peer_floor", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, required=True, help="loopback port to listen on")
    args = parser.parse_args(argv)
    asyncio.run(serve(args.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
