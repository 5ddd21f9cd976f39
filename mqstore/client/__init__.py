"""The Python client of mqstore: Producer and PullConsumer over the gateway's MessagingService.

    from mqstore.client import Producer, PullConsumer

    with Producer() as producer:                       # $MQSTORE_GATEWAY or 127.0.0.1:9876
        receipt = producer.send("orders", b"hello", tags="new", keys=["order-1"])

    with PullConsumer("billing", "orders") as consumer:
        for message in consumer.poll(max_messages=100, timeout=5):
            print(message.queue_id, message.queue_offset, message.text)

Every failure is an :class:`MqstoreError` (``.code`` is the gRPC status name).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mqstore.client.client import Client
    from mqstore.client.connection import DEFAULT_ADDRESS, Connection, Tls
    from mqstore.client.consumer import PullConsumer
    from mqstore.client.errors import (
        AlreadyExistsError,
        DataLossError,
        DeadlineExceededError,
        FailedPreconditionError,
        InvalidArgumentError,
        MqstoreError,
        NotFoundError,
        OutOfRangeError,
        PermissionDeniedError,
        ResourceExhaustedError,
        UnauthenticatedError,
        UnavailableError,
    )
    from mqstore.client.models import (
        Message,
        OutgoingMessage,
        QueryResult,
        QueueOffsets,
        QueueRoute,
        SendReceipt,
        TopicConfig,
        TopicRoute,
    )
    from mqstore.client.producer import Producer
    from mqstore.client.transaction_producer import (
        TransactionCheck,
        TransactionProducer,
        TransactionResult,
        TransactionState,
    )

#: Each public name and the module (under mqstore.client) that defines it.
_MODULE_OF: dict[str, str] = {
    "Client": "client", "DEFAULT_ADDRESS": "connection", "Connection": "connection", "Tls": "connection",
    "PullConsumer": "consumer", "AlreadyExistsError": "errors", "DataLossError": "errors",
    "DeadlineExceededError": "errors", "FailedPreconditionError": "errors", "InvalidArgumentError": "errors",
    "MqstoreError": "errors", "NotFoundError": "errors", "OutOfRangeError": "errors",
    "PermissionDeniedError": "errors", "ResourceExhaustedError": "errors", "UnauthenticatedError": "errors",
    "UnavailableError": "errors", "Message": "models", "OutgoingMessage": "models", "QueryResult": "models",
    "QueueOffsets": "models", "QueueRoute": "models", "SendReceipt": "models", "TopicConfig": "models",
    "TopicRoute": "models", "Producer": "producer", "TransactionCheck": "transaction_producer",
    "TransactionProducer": "transaction_producer", "TransactionResult": "transaction_producer",
    "TransactionState": "transaction_producer",
}

__all__ = [
    "DEFAULT_ADDRESS", "AlreadyExistsError", "Client", "Connection", "DataLossError", "DeadlineExceededError",
    "FailedPreconditionError", "InvalidArgumentError", "Message", "MqstoreError", "NotFoundError",
    "OutOfRangeError", "OutgoingMessage", "PermissionDeniedError", "Producer", "PullConsumer", "QueryResult",
    "QueueOffsets", "QueueRoute", "ResourceExhaustedError", "SendReceipt", "Tls", "TopicConfig", "TopicRoute",
    "TransactionCheck", "TransactionProducer", "TransactionResult", "TransactionState", "UnauthenticatedError",
    "UnavailableError",
]


def __getattr__(name: str) -> Any:
    """The public names load their module on first use: a service that imports only ``limits`` or
    ``compression`` (every server does) does not pay for the gRPC client, the producer and the consumer
    at each start."""
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
