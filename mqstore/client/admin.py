"""Operator calls: the cluster's status and topic deletion (the gateway's GetClusterStatus and
DeleteTopic, see proto/mqstore/v1/admin.proto).

Answers are plain dicts (the proto's field names, numbers as numbers, every field present), the shape
``mqstore status --json`` prints, so scripts and the command see the same thing.
"""

from __future__ import annotations

from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from mqstore.client.client import Client
from mqstore.v1 import admin_pb2

SERVING = "SERVING"


def cluster_status(client: Client, *, timeout: float | None = None) -> dict[str, Any]:
    """Every shard's services (their health: SERVING, NOT_SERVING, UNREACHABLE...), store offsets, disk
    use against the cleaning and write-refusal watermarks, flush and dispatch lag, topic and group
    counts; ``healthy`` is False when any of it is down."""
    return plain(client.connection.call("GetClusterStatus", admin_pb2.GetClusterStatusRequest(), timeout))


def delete_topic(client: Client, topic: str, *, timeout: float | None = None) -> dict[str, Any]:
    """Deletes the topic's config and ConsumeQueues on every shard (admin token when auth is on); its
    commitlog records expire as usual. NOT_FOUND if no shard has it, INVALID_ARGUMENT for a system
    topic. Returns the shards it was deleted on and how many queues went."""
    response = client.connection.call("DeleteTopic", admin_pb2.DeleteTopicRequest(topic=topic), timeout)
    return {"topic": topic, "shards": list(response.shards), "deleted_queues": response.deleted_queues}


def plain(message: Message) -> dict[str, Any]:
    """A message as a dict of its fields (nested messages too), defaults included."""
    out: dict[str, Any] = {}
    for field in message.DESCRIPTOR.fields:
        value = getattr(message, field.name)
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            out[field.name] = [plain(v) for v in value] if field.is_repeated else plain(value)
        else:
            out[field.name] = list(value) if field.is_repeated else value
    return out
