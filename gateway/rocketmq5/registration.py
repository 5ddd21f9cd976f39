"""Registering apache.rocketmq.v2.MessagingService on the gateway's server (beside mqstore.v1), on unless
MQSTORE_RMQ5=0 (or false/off) is set for the gateway. MQSTORE_RMQ5_MAX_DELIVERY_ATTEMPTS (default 16,
RocketMQ's) is how often a message is delivered to a consumer group before it goes to %DLQ%<group>."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import grpc

from mqstore.apache.rocketmq.v2 import service_pb2_grpc
from mqstore.gateway.rocketmq5.inflight import DEFAULT_MAX_DELIVERY_ATTEMPTS
from mqstore.gateway.rocketmq5.servicer import RocketMQ5Servicer

if TYPE_CHECKING:
    from mqstore.gateway.servicer import MessagingServicer

SERVICE_NAME = "apache.rocketmq.v2.MessagingService"
ENV_FLAG = "MQSTORE_RMQ5"
ENV_MAX_DELIVERY_ATTEMPTS = "MQSTORE_RMQ5_MAX_DELIVERY_ATTEMPTS"


def enabled() -> bool:
    return os.environ.get(ENV_FLAG, "1").strip().lower() not in ("0", "false", "off", "no")


def max_delivery_attempts() -> int:
    """MQSTORE_RMQ5_MAX_DELIVERY_ATTEMPTS, or RocketMQ's 16; ValueError naming the variable when it is
    not a whole number of at least 1."""
    attempts = os.environ.get(ENV_MAX_DELIVERY_ATTEMPTS, "").strip()
    if not attempts:
        return DEFAULT_MAX_DELIVERY_ATTEMPTS
    if not (attempts.isdigit() and int(attempts) >= 1):
        raise ValueError(f"{ENV_MAX_DELIVERY_ATTEMPTS}={attempts!r}: give a whole number of at least 1")
    return int(attempts)


def add_to_server(mq: MessagingServicer, server: grpc.aio.Server) -> RocketMQ5Servicer | None:
    """Serve RocketMQ 5's protocol over ``mq`` on ``server`` (when enabled); the servicer, or None."""
    if not enabled():
        return None
    servicer = RocketMQ5Servicer(mq, max_delivery_attempts=max_delivery_attempts())
    service_pb2_grpc.add_MessagingServiceServicer_to_server(servicer, server)
    return servicer
