"""RocketMQ 5 status codes (apache.rocketmq.v2.Code) for mqstore's gRPC statuses.

The v2 protocol answers failures inside the response (``Status{code, message}``, gRPC status OK), and
its clients decide from the code whether to retry. mqstore's details, which say what to fix, are the
message.
"""

from __future__ import annotations

import grpc

from apache.rocketmq.v2 import definition_pb2
from gateway.rocketmq5.local_call import MqstoreCallError

Code = definition_pb2.Code

_BY_GRPC: dict[grpc.StatusCode, int] = {
    grpc.StatusCode.INVALID_ARGUMENT: Code.BAD_REQUEST,
    grpc.StatusCode.NOT_FOUND: Code.TOPIC_NOT_FOUND,
    grpc.StatusCode.UNAUTHENTICATED: Code.UNAUTHORIZED,
    grpc.StatusCode.PERMISSION_DENIED: Code.FORBIDDEN,
    grpc.StatusCode.FAILED_PRECONDITION: Code.FORBIDDEN,
    grpc.StatusCode.OUT_OF_RANGE: Code.BAD_REQUEST,
    grpc.StatusCode.RESOURCE_EXHAUSTED: Code.TOO_MANY_REQUESTS,
    grpc.StatusCode.DEADLINE_EXCEEDED: Code.PROXY_TIMEOUT,
    grpc.StatusCode.UNAVAILABLE: Code.INTERNAL_SERVER_ERROR,
    grpc.StatusCode.DATA_LOSS: Code.INTERNAL_SERVER_ERROR,
}


def ok() -> definition_pb2.Status:
    return definition_pb2.Status(code=Code.OK, message="OK")


def status(code: int, message: str) -> definition_pb2.Status:
    return definition_pb2.Status(code=code, message=message)


def of_error(exc: MqstoreCallError, not_found: int = Code.TOPIC_NOT_FOUND) -> definition_pb2.Status:
    """The v2 status of a failed mqstore.v1 call; ``not_found`` is what NOT_FOUND means for this call
    (a topic for sends and routes, a message for lookups)."""
    if exc.code == grpc.StatusCode.NOT_FOUND:
        return status(not_found, exc.details)
    if exc.code == grpc.StatusCode.INVALID_ARGUMENT and "body" in exc.details and "large" in exc.details:
        return status(Code.MESSAGE_BODY_TOO_LARGE, exc.details)
    if exc.code == grpc.StatusCode.INVALID_ARGUMENT and "(timerMaxDelaySec)" in exc.details:
        return status(Code.ILLEGAL_DELIVERY_TIME, exc.details)
    return status(_BY_GRPC.get(exc.code, Code.INTERNAL_ERROR), exc.details)
