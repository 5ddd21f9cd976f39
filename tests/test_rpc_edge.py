"""The one error path of every servicer (services/server/status.py, RpcEdge), on each kind of handler."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc
import pytest

from mqstore.v1 import indexer_pb2
from services.server.status import CallFailed, RefusedMessage, RpcEdge, status_trailer
from services.store.errors import InvalidArgumentError, NotFoundError

SERVICE = indexer_pb2.DESCRIPTOR.services_by_name["IndexerService"]


class Context:
    def __init__(self) -> None:
        self.code: grpc.StatusCode | None = None
        self.details = ""
        self.trailer: Any = ()

    def set_code(self, code: grpc.StatusCode) -> None:
        self.code = code

    def set_details(self, details: str) -> None:
        self.details = details

    def set_trailing_metadata(self, trailer: Any) -> None:
        self.trailer = trailer


observed: list[tuple[str, grpc.StatusCode]] = []
rpc = RpcEdge(SERVICE, lambda method, code, _: observed.append((method, code)))


class Servicer:
    @rpc
    def GetQueueOffsets(self, request: int, context: Context) -> indexer_pb2.QueueOffsets:
        if request < 0:
            raise NotFoundError(f"queue {request} does not exist")
        if request == 0:
            raise RuntimeError("a bug")
        return indexer_pb2.QueueOffsets(max_offset=request)

    @rpc
    def WatchArrivals(self, request: int, context: Context) -> Iterator[indexer_pb2.Arrival]:
        yield indexer_pb2.Arrival(max_offset=1)
        raise InvalidArgumentError.of_message(request, "flag -1 is negative")

    @rpc
    async def QueryByKey(self, request: int, context: Context) -> indexer_pb2.QueryByKeyResponse:
        raise CallFailed(grpc.StatusCode.DEADLINE_EXCEEDED, "the flush did not finish")

    @rpc
    async def ListQueues(self, request: int, context: Context) -> AsyncIterator[indexer_pb2.QueueOffsets]:
        yield indexer_pb2.QueueOffsets(max_offset=1)
        raise NotFoundError("gone")


def test_a_sync_unary_failure_answers_its_empty_response_with_the_status() -> None:
    observed.clear()
    context = Context()
    assert Servicer().GetQueueOffsets(-1, context) == indexer_pb2.QueueOffsets()
    assert (context.code, context.details) == (grpc.StatusCode.NOT_FOUND, "queue -1 does not exist")
    assert Servicer().GetQueueOffsets(5, Context()).max_offset == 5
    assert observed == [("GetQueueOffsets", grpc.StatusCode.NOT_FOUND), ("GetQueueOffsets", grpc.StatusCode.OK)]
    with pytest.raises(RuntimeError):  # not a domain error: a bug, left to grpc (UNKNOWN)
        Servicer().GetQueueOffsets(0, Context())


def test_a_stream_ends_after_what_it_sent_with_the_refused_message_as_a_detail() -> None:
    context = Context()
    assert [a.max_offset for a in Servicer().WatchArrivals(3, context)] == [1]
    assert (context.code, context.details) == (grpc.StatusCode.INVALID_ARGUMENT, "message #3: flag -1 is negative")
    assert tuple(context.trailer) == tuple(status_trailer(context.code, context.details,
                                                          RefusedMessage(3, "flag -1 is negative")))


def test_aio_handlers() -> None:
    async def run() -> None:
        context = Context()
        assert await Servicer().QueryByKey(1, context) is None
        assert (context.code, context.details) == (grpc.StatusCode.DEADLINE_EXCEEDED, "the flush did not finish")
        context = Context()
        assert [q.max_offset async for q in Servicer().ListQueues(1, context)] == [1]
        assert (context.code, context.details) == (grpc.StatusCode.NOT_FOUND, "gone")

    asyncio.run(run())
