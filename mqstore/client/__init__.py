"""The Python client of mqstore: Producer and PullConsumer over the gateway's MessagingService.

    from mqstore.client import Producer, PullConsumer

    with Producer() as producer:                       # $MQSTORE_GATEWAY or 127.0.0.1:9876
        receipt = producer.send("orders", b"hello", tags="new", keys=["order-1"])

    with PullConsumer("billing", "orders") as consumer:
        for message in consumer.poll(max_messages=100, timeout=5):
            print(message.queue_id, message.queue_offset, message.text)

Every failure is an :class:`MqstoreError` (``.code`` is the gRPC status name).
"""

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

__all__ = [
    "DEFAULT_ADDRESS", "AlreadyExistsError", "Client", "Connection", "DataLossError", "DeadlineExceededError",
    "FailedPreconditionError", "InvalidArgumentError", "Message", "MqstoreError", "NotFoundError",
    "OutOfRangeError", "OutgoingMessage", "PermissionDeniedError", "Producer", "PullConsumer", "QueryResult",
    "QueueOffsets", "QueueRoute", "ResourceExhaustedError", "SendReceipt", "Tls", "TopicConfig", "TopicRoute",
    "TransactionCheck", "TransactionProducer", "TransactionResult", "TransactionState", "UnauthenticatedError",
    "UnavailableError",
]
