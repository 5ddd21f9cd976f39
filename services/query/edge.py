"""The query service's error path: every QueryService RPC (the servicer and its group and pop mixins)
fails through this one :class:`~services.server.status.RpcEdge`, with the service's own error kinds
(:func:`services.query.errors.query_status_code`) and its error counter."""

from __future__ import annotations

import functools

import grpc

from mqstore.v1 import query_pb2
from services.query import metrics
from services.query.errors import query_status_code
from services.server.status import RpcEdge, store_status


def _observe(method: str, code: grpc.StatusCode, _: float) -> None:
    if code is not grpc.StatusCode.OK:
        metrics.observe_error(method, code.name)


rpc = RpcEdge(query_pb2.DESCRIPTOR.services_by_name["QueryService"], _observe,
              functools.partial(store_status, code_of=query_status_code))
