"""A failed commitlog call frees its state at once: no reference cycle per error.

With ``context.abort()`` each refused call left a cycle (grpc.aio's RPCState -> AbortError -> traceback
-> frames -> RPCState) holding the request, freed only by the cyclic collector: a producer whose
batches are refused (too big, no messages) piled up its requests between collections.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import grpc

from mqstore.v1 import commitlog_pb2, commitlog_pb2_grpc
from services.commitlog.servicer import CommitLogServicer
from tests.call_state import collector_off, in_process_server, live

CALLS = 200


def _refusing_engine() -> SimpleNamespace:
    """Enough of an engine for calls refused before the engine is asked."""
    flags = {"sync_flush": False, "wait_for_replicas": None, "pool_enabled": False}
    return SimpleNamespace(**flags, commit_log=SimpleNamespace(**flags))


async def _failed_calls() -> tuple[list[tuple[grpc.StatusCode, str]], int]:
    servicer = CommitLogServicer(_refusing_engine())  # type: ignore[arg-type]
    answers: list[tuple[grpc.StatusCode, str]] = []
    async with in_process_server(lambda s: commitlog_pb2_grpc.add_CommitLogServiceServicer_to_server(servicer, s)) \
            as channel:
        stub = commitlog_pb2_grpc.CommitLogServiceStub(channel)
        with collector_off():
            for i in range(CALLS):
                try:
                    if i % 2:
                        await stub.AppendBatch(commitlog_pb2.AppendBatchRequest(), timeout=10)
                    else:
                        await stub.ReadBatch(commitlog_pb2.ReadBatchRequest(), timeout=10)
                except grpc.aio.AioRpcError as exc:
                    answers.append((exc.code(), exc.details() or ""))
            await asyncio.sleep(0.1)  # the server's last call task finishes
            left = live("RPCState")
    return answers, left


def test_failed_calls_leave_no_call_state_behind() -> None:
    answers, left = asyncio.run(_failed_calls())
    # The answers are unchanged: each call's status and the detail that says what to fix.
    assert [code for code, _ in answers] == [grpc.StatusCode.INVALID_ARGUMENT] * CALLS
    assert "no ranges" in answers[0][1] and "no messages" in answers[1][1], answers[:2]
    assert left <= 2, f"{left} RPCStates of {CALLS} failed calls wait for the cyclic collector"
