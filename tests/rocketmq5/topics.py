"""Helpers of the RocketMQ 5 tests that go through mqstore.v1."""

from __future__ import annotations

import time

import grpc

from mqstore.v1 import commitlog_pb2, common_pb2, query_pb2
from tests.gateway.system_process import UpProcess


def create_topic(up: UpProcess, topic: str, queues: int) -> None:
    config = common_pb2.TopicConfig(topic=topic, read_queue_nums=queues, write_queue_nums=queues, perm=6)
    up.stub.CreateTopic(commitlog_pb2.TopicRequest(topic=config), timeout=10)


def stored(up: UpProcess, msg_id: str, topic: str = "") -> query_pb2.StoredMessage:
    """A message by id through mqstore.v1 GetMessage, once the indexer has it."""
    deadline = time.monotonic() + 10
    while True:
        try:
            return up.stub.GetMessage(query_pb2.ViewMessageRequest(msg_id=msg_id, topic=topic), timeout=5).message
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.NOT_FOUND or time.monotonic() > deadline:
                raise
            time.sleep(0.1)
