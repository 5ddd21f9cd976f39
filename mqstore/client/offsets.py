"""Queue offsets and a group's committed offsets, several queues a round trip: what both the
:class:`~mqstore.client.client.Client` and the pull consumers ask before reading."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from mqstore.client.connection import Connection
from mqstore.client.errors import MqstoreError, NotFoundError
from mqstore.client.models import QueueOffsets
from mqstore.v1 import query_pb2


def queue_offsets(connection: Connection, topic: str, queue_ids: Sequence[int],
                  timeout: float | None) -> list[QueueOffsets]:
    """The min and max offset of each queue, in one round trip."""
    answers = connection.call_many(
        "GetQueueOffsets", [query_pb2.GetQueueOffsetRangeRequest(topic=topic, queue_id=q) for q in queue_ids], timeout)
    return [QueueOffsets(topic=topic, queue_id=q, min_offset=r.min_offset, max_offset=r.max_offset)
            for q, r in zip(queue_ids, raise_first(answers), strict=True)]


def committed_offsets(connection: Connection, group: str, topic: str, queue_ids: Sequence[int],
                      timeout: float | None) -> dict[int, int | None]:
    """The next offset ``group`` consumes from each queue; None where it never committed one."""
    requests = [query_pb2.QueryConsumerOffsetRequest(consumer_group=group, topic=topic, queue_id=q)
                for q in queue_ids]
    found: dict[int, int | None] = {}
    for q, answer in zip(queue_ids, connection.call_many("QueryOffset", requests, timeout), strict=True):
        if isinstance(answer, NotFoundError):
            found[q] = None
        elif isinstance(answer, MqstoreError):
            raise answer
        else:
            found[q] = answer.offset
    return found


def start_offsets(connection: Connection, group: str | None, topic: str, queue_ids: Sequence[int],
                  explicit: Mapping[int, int], from_latest: bool,
                  timeout: float | None) -> dict[int, tuple[int, int | None]]:
    """Where each queue starts: an explicit offset, else the group's committed offset, else the queue's
    min offset (max with ``from_latest``)."""
    committed = committed_offsets(connection, group, topic, queue_ids, timeout) if group else {}
    missing = [q for q in queue_ids if q not in explicit and committed.get(q) is None]
    ranges = {r.queue_id: r for r in queue_offsets(connection, topic, missing, timeout)} if missing else {}
    starts: dict[int, tuple[int, int | None]] = {}
    for q in queue_ids:
        known = committed.get(q)
        if q in explicit:
            start = explicit[q]
        elif known is not None:
            start = known
        else:
            start = ranges[q].max_offset if from_latest else ranges[q].min_offset
        starts[q] = (start, known)
    return starts


def raise_first(answers: list[Any]) -> list[Any]:
    """``answers`` of a ``call_many``, after raising the first error among them."""
    for answer in answers:
        if isinstance(answer, MqstoreError):
            raise answer
    return answers
