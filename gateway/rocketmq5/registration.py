"""Registering apache.rocketmq.v2.MessagingService on the gateway's server (beside mqstore.v1), on unless
MQSTORE_RMQ5=0 (or false/off) is set for the gateway."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import grpc
from apache.rocketmq.v2 import service_pb2_grpc

from gateway.rocketmq5.servicer import RocketMQ5Servicer

if TYPE_CHECKING:
    from gateway.servicer import MessagingServicer

SERVICE_NAME = "apache.rocketmq.v2.MessagingService"
ENV_FLAG = "MQSTORE_RMQ5"


def enabled() -> bool:
    return os.environ.get(ENV_FLAG, "1").strip().lower() not in ("0", "false", "off", "no")


def add_to_server(mq: MessagingServicer, server: grpc.aio.Server) -> RocketMQ5Servicer | None:
    """Serve RocketMQ 5's protocol over ``mq`` on ``server`` (when enabled); the servicer, or None."""
    if not enabled():
        return None
    servicer = RocketMQ5Servicer(mq)
    service_pb2_grpc.add_MessagingServiceServicer_to_server(servicer, server)
    return servicer
