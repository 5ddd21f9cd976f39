"""A failed indexer call frees its state at once: no reference cycle per error.

The indexer runs a sync gRPC server, whose abort left nothing behind either; the guard keeps it so now
that its calls fail through the shared error path (services/server/status.py, RpcEdge).
"""

from __future__ import annotations

import time
from concurrent import futures

import grpc

from mqstore.v1 import indexer_pb2, indexer_pb2_grpc
from services.indexer.servicer import ArrivalHub, IndexerServicer
from tests.call_state import collector_off, live

CALLS = 200


def test_failed_calls_leave_no_call_state_behind() -> None:
    servicer = IndexerServicer(None, None, ArrivalHub(), lambda offset, size: -1)  # type: ignore[arg-type]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    indexer_pb2_grpc.add_IndexerServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    answers: list[tuple[grpc.StatusCode, str]] = []
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = indexer_pb2_grpc.IndexerServiceStub(channel)
            with collector_off():
                for i in range(CALLS):
                    try:
                        if i % 2:
                            stub.QueryByKey(indexer_pb2.QueryByKeyRequest(topic="t", key=""), timeout=10)
                        else:
                            stub.GetQueueEntries(indexer_pb2.GetQueueEntriesRequest(topic="t", from_offset=-1),
                                                 timeout=10)
                    except grpc.RpcError as exc:
                        answers.append((exc.code(), exc.details() or ""))
                time.sleep(0.1)  # the server's last call finishes
                left = live("_RPCState")
    finally:
        server.stop(None)
    # The answers are unchanged: each call's status and the detail that says what to fix.
    assert [code for code, _ in answers] == [grpc.StatusCode.INVALID_ARGUMENT] * CALLS
    assert "from_offset -1" in answers[0][1] and "key" in answers[1][1], answers[:2]
    assert left <= 2, f"{left} RPCStates of {CALLS} failed calls wait for the cyclic collector"
