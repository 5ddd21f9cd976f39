"""A refused gateway call frees its state at once: no reference cycle per error (issue 17, item 8).

With ``context.abort()`` every refused call left a cycle (grpc.aio's RPCState -> AbortError ->
traceback -> frames -> RPCState) holding the request, up to 64 MiB for a refused SendBatch, until
the cyclic collector ran: part of the gateway's RSS swing under load.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc

from gateway.auth import TokenTable
from gateway.queue_selector import FaultTable, QueueSelector
from gateway.registration import add_to_server
from gateway.route import RouteTable
from gateway.servicer import MessagingServicer
from gateway.settings import load_gateway_settings
from gateway.shard import ShardClient
from gateway.uniq_key_maker import UniqKeyGenerator
from mqstore.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc
from tests.call_state import collector_off, in_process_server, live

CALLS = 150
# Calls refused at the edge: the shard's addresses are never dialled.
NOWHERE = "127.0.0.1:1"
BIG = b"x" * 256 * 1024


async def _refused_calls() -> tuple[list[tuple[grpc.StatusCode, str]], int]:
    settings = load_gateway_settings(None, shards=[{"name": "shard-0", "commitlog": NOWHERE, "query": NOWHERE}])
    shards = [ShardClient(0, settings.shards[0])]
    servicer = MessagingServicer(settings, shards, RouteTable(shards, 30.0, 5.0),
                                 QueueSelector(False, FaultTable(1.0, 60.0)), TokenTable(), UniqKeyGenerator())
    answers: list[tuple[grpc.StatusCode, str]] = []

    async def stream() -> AsyncIterator[gateway_pb2.SendRequest]:
        yield gateway_pb2.SendRequest(message=common_pb2.Message(topic="t", body=b""))

    try:
        async with in_process_server(lambda s: add_to_server(servicer, s)) as channel:
            stub = gateway_pb2_grpc.MessagingServiceStub(channel)
            with collector_off():
                for i in range(CALLS):
                    try:
                        if i % 3 == 0:
                            await stub.GetRoute(gateway_pb2.GetRouteRequest(topic="no spaces"), timeout=10)
                        elif i % 3 == 1:  # a big batch with one empty body: refused whole
                            await stub.SendBatch(gateway_pb2.SendBatchRequest(messages=[
                                common_pb2.Message(topic="t", body=BIG), common_pb2.Message(topic="t", body=b"")]),
                                timeout=10)
                        else:
                            async for _ in stub.SendStream(stream(), timeout=10):
                                pass
                    except grpc.aio.AioRpcError as exc:
                        answers.append((exc.code(), exc.details() or ""))
                await asyncio.sleep(0.1)  # the server's last call task finishes
                left = live("RPCState")
    finally:
        await servicer.close()
        for shard in shards:
            await shard.close()
    return answers, left


def test_refused_calls_leave_no_call_state_behind() -> None:
    answers, left = asyncio.run(_refused_calls())
    # The answers are unchanged: each call's status and the detail that says what to fix.
    assert [code for code, _ in answers] == [grpc.StatusCode.INVALID_ARGUMENT] * CALLS
    assert "no spaces" in answers[0][1], answers[0]
    assert "message #1" in answers[1][1] and "body is empty" in answers[1][1], answers[1]
    assert "message #0 of the stream" in answers[2][1], answers[2]
    assert left <= 2, f"{left} RPCStates of {CALLS} refused calls wait for the cyclic collector"
