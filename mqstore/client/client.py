"""Lookups and administration: messages by id or key, queue and consumer offsets, topics and routes."""

from __future__ import annotations

from typing import Any

from mqstore.client.connection import Endpoint
from mqstore.client.consumer import PullConsumer
from mqstore.client.errors import NotFoundError
from mqstore.client.models import Message, QueryResult, QueueOffsets, TopicConfig, TopicRoute
from mqstore.client.offsets import committed_offsets, queue_offsets
from mqstore.client.producer import Producer
from mqstore.client.retry import SendBackReceipt, send_back_request
from mqstore.v1 import commitlog_pb2, common_pb2, gateway_pb2, query_pb2

MAX_QUERY = 64
_ID_KINDS = {None: 0, "offset": 1, "uniq_key": 2}


class Client(Endpoint):
    """Everything but sending and consuming; also hands out producers and consumers on its channel."""

    # -- messages ----------------------------------------------------------------------------------

    def get_message(self, msg_id: str, *, topic: str | None = None, kind: str | None = None,
                    timeout: float | None = None) -> Message:
        """A message by its UNIQ_KEY (a receipt's ``msg_id``) or offset msg id; ``topic`` narrows a
        UNIQ_KEY search, ``kind`` (``"offset"`` or ``"uniq_key"``) says which id it is."""
        if kind not in _ID_KINDS:
            raise ValueError(f"kind must be 'offset' or 'uniq_key', not {kind!r}")
        request = query_pb2.ViewMessageRequest(msg_id=msg_id, topic=topic or "", kind=_ID_KINDS[kind])
        return Message.from_proto(self.connection.call("GetMessage", request, timeout).message)

    def query(self, topic: str, key: str, *, begin_ms: int = 0, end_ms: int = 0, max_num: int = 32,
              timeout: float | None = None) -> QueryResult:
        """Messages whose KEYS or UNIQ_KEY hold ``key``, stored within [begin_ms, end_ms] (0 = open)."""
        request = query_pb2.QueryMessageRequest(topic=topic, key=key, begin_timestamp=begin_ms,
                                                end_timestamp=end_ms, max_num=max_num)
        response = self.connection.call("QueryByKey", request, timeout)
        return QueryResult(messages=[Message.from_proto(m) for m in response.messages],
                           index_hits=response.index_hits,
                           index_last_update_timestamp=response.index_last_update_timestamp)

    def send_back(self, group: str, message: Message | str, delay_level: int = 0, *,
                  max_reconsume_times: int | None = None, timeout: float | None = None) -> SendBackReceipt:
        """Hands a consumed message (or its offset msg id) back for the group: a retry or a dead letter
        (see :meth:`mqstore.client.PullConsumer.consume_later`)."""
        request = send_back_request(group, message, delay_level, max_reconsume_times)
        return SendBackReceipt.from_proto(self.connection.call("ConsumerSendBack", request, timeout))

    # -- offsets -----------------------------------------------------------------------------------

    def queue_offsets(self, topic: str, queue_id: int, *, timeout: float | None = None) -> QueueOffsets:
        request = query_pb2.GetQueueOffsetRangeRequest(topic=topic, queue_id=queue_id)
        r = self.connection.call("GetQueueOffsets", request, timeout)
        return QueueOffsets(topic=topic, queue_id=queue_id, min_offset=r.min_offset, max_offset=r.max_offset)

    def all_queue_offsets(self, topic: str, queue_ids: list[int] | None = None, *,
                          timeout: float | None = None) -> list[QueueOffsets]:
        """Offsets of several queues (every queue of the route by default) in one round trip."""
        ids = self.route(topic, timeout=timeout).readable_queue_ids if queue_ids is None else queue_ids
        return queue_offsets(self.connection, topic, ids, timeout)

    def search_offset(self, topic: str, queue_id: int, timestamp_ms: int, *, timeout: float | None = None) -> int:
        """The queue offset whose store time is nearest ``timestamp_ms`` (RocketMQ's searchOffset)."""
        request = query_pb2.SearchOffsetRequest(topic=topic, queue_id=queue_id, timestamp=timestamp_ms)
        offset: int = self.connection.call("SearchOffset", request, timeout).offset
        return offset

    def committed_offset(self, group: str, topic: str, queue_id: int, *, timeout: float | None = None) -> int | None:
        """The next offset ``group`` will consume, or None when it never committed one."""
        request = query_pb2.QueryConsumerOffsetRequest(consumer_group=group, topic=topic, queue_id=queue_id)
        try:
            offset: int = self.connection.call("QueryOffset", request, timeout).offset
        except NotFoundError:
            return None
        return offset

    def committed_offsets(self, group: str, topic: str, queue_ids: list[int], *,
                          timeout: float | None = None) -> dict[int, int | None]:
        return committed_offsets(self.connection, group, topic, queue_ids, timeout)

    def commit_offset(self, group: str, topic: str, queue_id: int, offset: int, *,
                      timeout: float | None = None) -> None:
        """Set the next offset ``group`` consumes from the queue (moves it back as well as forward)."""
        request = query_pb2.UpdateConsumerOffsetRequest(consumer_group=group, topic=topic, queue_id=queue_id,
                                                        offset=offset)
        self.connection.call("CommitOffset", request, timeout)

    # -- topics ------------------------------------------------------------------------------------

    def topics(self, *, timeout: float | None = None) -> list[TopicConfig]:
        """Every topic the token may produce to or consume from, by name."""
        response = self.connection.call("ListTopics", commitlog_pb2.ListTopicsRequest(), timeout)
        return [TopicConfig.from_proto(t) for t in response.topics]

    def create_topic(self, topic: str, queues: int = 8, *, read_queues: int | None = None,
                     write_queues: int | None = None, perm: int = 6, timeout: float | None = None) -> TopicConfig:
        """A topic on every shard (admin tokens only when auth is on); ALREADY_EXISTS if it exists."""
        config = _config(topic, read_queues if read_queues is not None else queues,
                         write_queues if write_queues is not None else queues, perm)
        return TopicConfig.from_proto(self.connection.call("CreateTopic", config, timeout))

    def update_topic(self, topic: str, *, queues: int | None = None, read_queues: int | None = None,
                     write_queues: int | None = None, perm: int | None = None,
                     timeout: float | None = None) -> TopicConfig:
        """Change queue counts or permission; what is not given keeps its current value."""
        current = next((t for t in self.topics(timeout=timeout) if t.topic == topic), None)
        if current is None:
            raise NotFoundError("NOT_FOUND", f"topic {topic!r} does not exist (or the token may not see it)")
        read = read_queues if read_queues is not None else queues if queues is not None else current.read_queue_nums
        write = (write_queues if write_queues is not None else queues if queues is not None
                 else current.write_queue_nums)
        config = _config(topic, read, write, current.perm if perm is None else perm)
        return TopicConfig.from_proto(self.connection.call("UpdateTopic", config, timeout))

    def route(self, topic: str, *, timeout: float | None = None) -> TopicRoute:
        """The topic's queues and the shard each lives on."""
        return TopicRoute.from_proto(
            self.connection.call("GetRoute", gateway_pb2.GetRouteRequest(topic=topic), timeout))

    # -- producers and consumers on this channel ----------------------------------------------------

    def producer(self) -> Producer:
        """A Producer sharing this client's channel (closing it leaves the channel open)."""
        return Producer(connection=self.connection)

    def consumer(self, group: str | None, topic: str, **options: Any) -> PullConsumer:
        """A PullConsumer sharing this client's channel; options as for PullConsumer."""
        return PullConsumer(group, topic, connection=self.connection, **options)


def _config(topic: str, read: int, write: int, perm: int) -> Any:
    return commitlog_pb2.TopicRequest(topic=common_pb2.TopicConfig(topic=topic, read_queue_nums=read,
                                                                   write_queue_nums=write, perm=perm))
