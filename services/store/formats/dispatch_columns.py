"""A chunk of DispatchRequests as columns: one list or numpy array per field.

The dispatcher writes ConsumeQueue units and IndexFile entries for every record of a chunk; done
record by record in Python, the attribute lookups, tuples and per-unit struct calls cost more than
the indexer's whole budget at 120k msgs/s. A list comprehension reads one field of 4,000 requests
in a few nanoseconds a record, and numpy then handles the columns in C; both writers share the
columns (built once per chunk) instead of walking the requests twice.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, Generic, NamedTuple, TypeVar, overload

import numpy as np

from services.store.formats.message import TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE, TRANSACTION_TYPE_MASK
from services.store.formats.record import DispatchRequest

T = TypeVar("T")


class cached_column(Generic[T]):  # noqa: N801 (used as a decorator, like functools.cached_property)
    """functools.cached_property without its lock (Python 3.11 takes one on every first read, a few
    microseconds a column on every chunk): the value lands in the instance dict, which later reads hit."""

    def __init__(self, func: Callable[[Any], T]) -> None:
        self.func = func
        self.name = func.__name__

    @overload
    def __get__(self, obj: None, owner: type) -> cached_column[T]: ...

    @overload
    def __get__(self, obj: object, owner: type) -> T: ...

    def __get__(self, obj: object | None, owner: type) -> T | cached_column[T]:
        if obj is None:
            return self
        value = self.func(obj)
        obj.__dict__[self.name] = value
        return value


class QueueRows(NamedTuple):
    """The rows (positions in the chunk, ascending) of the records one ConsumeQueue takes."""

    topic: str
    queue_id: int
    rows: np.ndarray


class QueueGroups(NamedTuple):
    """The records the ConsumeQueues take, grouped by queue: ``rows`` (positions in the chunk) sorted by
    queue, each queue's in commitlog order; queue *i* has ``rows[bounds[i]:bounds[i + 1]]``."""

    rows: np.ndarray
    bounds: list[int]
    queues: list[tuple[str, int]]


class DispatchColumns:
    """The fields of ``requests`` (in commitlog order) as columns, each computed on first use."""

    def __init__(self, requests: Iterable[DispatchRequest]) -> None:
        self.requests: Sequence[DispatchRequest] = requests if isinstance(requests, Sequence) else list(requests)
        self.count = len(self.requests)

    def __len__(self) -> int:
        return self.count

    @cached_column
    def commitlog_offset(self) -> np.ndarray:
        return np.array([r.commitlog_offset for r in self.requests], dtype=np.int64)

    @cached_column
    def store_timestamp(self) -> np.ndarray:
        return np.array([r.store_timestamp for r in self.requests], dtype=np.int64)

    @cached_column
    def transaction_type(self) -> np.ndarray:
        """``sys_flag & TRANSACTION_TYPE_MASK``."""
        return np.array([r.sys_flag for r in self.requests], dtype=np.int64) & TRANSACTION_TYPE_MASK

    @cached_column
    def msg_size(self) -> np.ndarray:
        return np.array([r.msg_size for r in self.requests], dtype=np.int64)

    @cached_column
    def queue_id(self) -> np.ndarray:
        return np.array([r.queue_id for r in self.requests], dtype=np.int64)

    @cached_column
    def queue_offset(self) -> np.ndarray:
        return np.array([r.queue_offset for r in self.requests], dtype=np.int64)

    @cached_column
    def tags_code(self) -> np.ndarray:
        return np.array([r.tags_code for r in self.requests], dtype=np.int64)

    @cached_column
    def all_success(self) -> bool:
        return all([r.success for r in self.requests])

    @cached_column
    def topics(self) -> list[str]:
        return [r.topic for r in self.requests]

    @cached_column
    def single_topic(self) -> str | None:
        """The topic of every request when they share one (the usual chunk), else None."""
        topics = self.topics
        return topics[0] if topics and topics.count(topics[0]) == len(topics) else None

    @cached_column
    def uniq_keys(self) -> list[str | None]:
        return [r.uniq_key for r in self.requests]

    @cached_column
    def keys(self) -> list[str | None]:
        return [r.keys for r in self.requests]

    @cached_column
    def queue_groups(self) -> QueueGroups:
        """The records the ConsumeQueues take (success, size > 0, not a PREPARED or ROLLBACK
        transaction record), grouped by queue with one stable sort."""
        tx = self.transaction_type
        queued = (self.msg_size > 0) & (tx != TRANSACTION_PREPARED_TYPE) & (tx != TRANSACTION_ROLLBACK_TYPE)
        if not self.all_success:
            queued &= np.array([r.success for r in self.requests], dtype=np.bool_)
        rows = np.flatnonzero(queued)
        if rows.size == 0:
            return QueueGroups(rows, [0], [])
        topic = self.single_topic
        queue_ids = self.queue_id[rows] & 0xFFFF_FFFF  # a Java int
        if topic is None:
            numbers: dict[str, int] = {}
            topic_numbers = np.array([numbers.setdefault(t, len(numbers)) for t in self.topics], dtype=np.int64)
            queue_ids = queue_ids | (topic_numbers[rows] << 32)
        order = np.argsort(queue_ids, kind="stable")
        rows = rows[order]
        starts = [0, *(np.flatnonzero(np.diff(queue_ids[order])) + 1).tolist()]
        firsts = rows[starts].tolist()
        queue_id_list = self.queue_id[firsts].tolist()
        topics = [topic] * len(firsts) if topic is not None else [self.topics[i] for i in firsts]
        return QueueGroups(rows, [*starts, rows.size], list(zip(topics, queue_id_list, strict=True)))

    @cached_column
    def queue_rows(self) -> list[QueueRows]:
        """:attr:`queue_groups` one list entry a queue, queues in order of their first record."""
        rows, bounds, queues = self.queue_groups
        groups = [QueueRows(topic, queue_id, rows[bounds[i]:bounds[i + 1]])
                  for i, (topic, queue_id) in enumerate(queues)]
        groups.sort(key=lambda g: int(g.rows[0]))
        return groups
