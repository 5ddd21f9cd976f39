"""A failed query call frees its state at once: no reference cycle per error (issue 17, item 8).

Lookups of expired or unknown messages answer NOT_FOUND all day long. With ``context.abort()`` each
such call left a cycle (grpc.aio's RPCState -> AbortError -> traceback -> frames -> RPCState) holding
the request, freed only by the cyclic collector; the query service's RSS grew between collections.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc

from mqstore.v1 import query_pb2, query_pb2_grpc
from services.query.arrivals import ArrivalWatcher
from services.query.backends import CommitLogClient, IndexerClient
from services.query.consumer_offsets import ConsumerOffsetTable
from services.query.lookup import MessageLookup
from services.query.pull import Puller
from services.query.queue_offset_lookup import QueueOffsets
from services.query.servicer import QueryServicer
from services.query.store_view import StoreView
from tests.call_state import collector_off, in_process_server, live

CALLS = 200
# Calls refused before any backend is asked: the backends' addresses are never dialled.
NOWHERE = "127.0.0.1:1"


async def _failed_calls(config_dir: Path) -> tuple[list[tuple[grpc.StatusCode, str]], int]:
    indexer, commitlog = IndexerClient(NOWHERE), CommitLogClient(NOWHERE)
    store = StoreView(commitlog)
    servicer = QueryServicer(Puller(indexer, commitlog, store, ArrivalWatcher(indexer), 6_000_000),
                             MessageLookup(indexer, commitlog, store), QueueOffsets(indexer, commitlog),
                             ConsumerOffsetTable(config_dir), max_long_poll_ms=30_000)
    answers: list[tuple[grpc.StatusCode, str]] = []
    try:
        async with in_process_server(lambda s: query_pb2_grpc.add_QueryServiceServicer_to_server(servicer, s)) \
                as channel:
            stub = query_pb2_grpc.QueryServiceStub(channel)
            with collector_off():
                for i in range(CALLS):
                    try:
                        if i % 2:
                            await stub.ViewMessage(query_pb2.ViewMessageRequest(msg_id="not an id"), timeout=10)
                        else:
                            await stub.UpdateConsumerOffset(query_pb2.UpdateConsumerOffsetRequest(
                                consumer_group="", topic="t", queue_id=0, offset=1), timeout=10)
                    except grpc.aio.AioRpcError as exc:
                        answers.append((exc.code(), exc.details() or ""))
                await asyncio.sleep(0.1)  # the server's last call task finishes
                left = live("RPCState")
    finally:
        await indexer.close()
        await commitlog.close()
    return answers, left


def test_failed_calls_leave_no_call_state_behind(tmp_path: Path) -> None:
    answers, left = asyncio.run(_failed_calls(tmp_path))
    # The answers are unchanged: each call's status and the detail that says what to fix.
    assert [code for code, _ in answers] == [grpc.StatusCode.INVALID_ARGUMENT] * CALLS
    assert "group" in answers[0][1] and "not an id" in answers[1][1], answers[:2]
    assert left <= 2, f"{left} RPCStates of {CALLS} failed calls wait for the cyclic collector"
