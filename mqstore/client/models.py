"""What users of the client see: plain dataclasses, not protobuf messages.

Protobuf types stay inside the package so user code does not depend on generated code, and so the
fields get the names RocketMQ users know: ``uniq_key`` (the UNIQ_KEY a send returns and a consumer
sees) and ``offset_msg_id`` (store host + commitlog offset), the same names on the wire, in the CLI's
JSON and in the Node.js client. ``msg_id`` stays as a deprecated alias of ``uniq_key`` (RocketMQ's
``MessageClientExt.getMsgId``); on the wire a StoredMessage's deprecated ``msg_id`` is the offset id.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from mqstore.v1 import common_pb2, gateway_pb2

#: RocketMQ's system property names.
PROPERTY_TAGS = "TAGS"
PROPERTY_KEYS = "KEYS"
PROPERTY_DELAY = "DELAY"
PROPERTY_UNIQ_KEY = "UNIQ_KEY"
#: RocketMQ 5's message group: a batch's sharding key, kept so v2 FIFO consumers see the order.
PROPERTY_SHARDING_KEY = "__SHARDINGKEY"
#: RocketMQ separates the keys of one message with a space (MessageConst.KEY_SEPARATOR).
KEY_SEPARATOR = " "
#: TopicConfig.perm bits, as in RocketMQ's PermName.
PERM_WRITE = 2
PERM_READ = 4

Keys = str | Iterable[str]


def encode_body(body: bytes | str) -> bytes:
    """Text bodies are sent as UTF-8, the encoding every RocketMQ client uses for strings."""
    return body.encode("utf-8") if isinstance(body, str) else bytes(body)


def join_keys(keys: Keys | None) -> str:
    """KEYS as RocketMQ stores them: one string, keys separated by spaces; a key cannot hold a space."""
    if keys is None:
        return ""
    if isinstance(keys, str):
        return " ".join(keys.split())
    parts = [str(k) for k in keys]
    for key in parts:
        if not key or any(c.isspace() for c in key):
            raise ValueError(f"key {key!r} is empty or contains white space: RocketMQ separates keys with spaces")
    return KEY_SEPARATOR.join(parts)


@dataclass(slots=True)
class OutgoingMessage:
    """A message to send. ``topic`` may be left empty when the send call names the topic."""

    body: bytes | str
    topic: str = ""
    tags: str | None = None
    keys: Keys | None = None
    properties: Mapping[str, str] | None = None
    #: Same key, same queue: the order of sends is the order of consumption.
    sharding_key: str | None = None
    #: An explicit route queue id (takes precedence over sharding_key).
    queue_id: int | None = None
    #: RocketMQ's delay level (1 = 1 s ... 18 = 2 h); the message is stored under SCHEDULE_TOPIC_XXXX.
    delay_level: int | None = None
    flag: int = 0

    def to_proto(self, topic: str | None = None) -> Any:
        """The wire Message: tags, keys and delay become the TAGS, KEYS and DELAY properties."""
        properties = self.wire_properties()
        name = self.topic or topic
        if not name:
            raise ValueError("the message has no topic: give one to the message or to the send call")
        return common_pb2.Message(topic=name, body=encode_body(self.body), flag=self.flag, properties=properties)

    def wire_properties(self) -> dict[str, str]:
        """The properties as sent: the message's own plus TAGS, KEYS and DELAY."""
        properties = dict(self.properties or {})
        if self.tags:
            properties[PROPERTY_TAGS] = self.tags
        keys = join_keys(self.keys)
        if keys:
            properties[PROPERTY_KEYS] = keys
        if self.delay_level is not None:
            if self.delay_level < 0:
                raise ValueError(f"delay level {self.delay_level} must not be negative")
            if self.delay_level:
                properties[PROPERTY_DELAY] = str(self.delay_level)
        return properties

    def to_request(self, topic: str | None = None) -> Any:
        request = gateway_pb2.SendRequest(message=self.to_proto(topic), sharding_key=self.sharding_key or "")
        if self.queue_id is not None:
            request.queue_id = self.queue_id
        return request


@dataclass(slots=True, frozen=True)
class SendReceipt:
    """The store's answer to one send."""

    #: The UNIQ_KEY: the id to find the message by (``Client.get_message``); a consumer's ``Message.uniq_key``.
    uniq_key: str
    #: Store host + commitlog offset (32 hex digits, 56 for an IPv6 store host): the cheapest id to look up.
    offset_msg_id: str
    topic: str
    queue_id: int
    queue_offset: int
    store_timestamp: int
    shard: str
    #: ``PUT_OK``, or e.g. ``FLUSH_DISK_TIMEOUT`` (written, but not flushed in time).
    status: str = "PUT_OK"

    @classmethod
    def from_proto(cls, result: Any) -> SendReceipt:
        return cls(uniq_key=result.uniq_key or result.msg_id, offset_msg_id=result.offset_msg_id, topic=result.topic,
                   queue_id=result.queue_id, queue_offset=result.queue_offset,
                   store_timestamp=result.store_timestamp, shard=result.shard, status=_put_status(result.status))

    @property
    def msg_id(self) -> str:
        """Deprecated alias of ``uniq_key``."""
        return self.uniq_key

    @property
    def ok(self) -> bool:
        return self.status == "PUT_OK"

    def to_json(self) -> dict[str, Any]:
        """``msg_id``: the deprecated alias of ``uniq_key``, kept for scripts that read it."""
        return {"uniq_key": self.uniq_key, "offset_msg_id": self.offset_msg_id, "msg_id": self.uniq_key,
                "topic": self.topic,
                "queue_id": self.queue_id, "queue_offset": self.queue_offset,
                "store_timestamp": self.store_timestamp, "shard": self.shard, "status": self.status}


def _put_status(value: int) -> str:
    from mqstore.v1 import commitlog_pb2

    name: str = commitlog_pb2.PutMessageStatus.Name(value) if value else "PUT_MESSAGE_STATUS_UNSPECIFIED"
    return name.removeprefix("PUT_MESSAGE_STATUS_")


@dataclass(slots=True, frozen=True)
class Message:
    """A stored message as a consumer gets it (RocketMQ's MessageExt)."""

    topic: str
    queue_id: int
    queue_offset: int
    #: Deprecated alias: ``uniq_key`` when the message has one (every message sent through the gateway),
    #: else ``offset_msg_id``.
    msg_id: str
    #: Store host + commitlog offset: the ``offset_msg_id`` of the send that stored it.
    offset_msg_id: str
    #: The UNIQ_KEY property: the ``uniq_key`` of the send ("" for a message stored without one).
    uniq_key: str
    tags: str
    keys: tuple[str, ...]
    properties: dict[str, str]
    body: bytes
    born_timestamp: int
    born_host: str
    store_timestamp: int
    store_host: str
    commitlog_offset: int = 0
    reconsume_times: int = 0
    flag: int = 0
    sys_flag: int = 0
    body_crc: int = 0
    store_size: int = 0
    #: True when the body is still compressed (an algorithm the store does not decompress).
    body_compressed: bool = False

    @classmethod
    def from_proto(cls, m: Any) -> Message:
        return cls(topic=m.topic, queue_id=m.queue_id, queue_offset=m.queue_offset,
                   msg_id=m.uniq_key or m.offset_msg_id or m.msg_id, offset_msg_id=m.offset_msg_id or m.msg_id,
                   uniq_key=m.uniq_key, tags=m.tags,
                   keys=tuple(m.keys.split()), properties=dict(m.properties), body=bytes(m.body),
                   born_timestamp=m.born_timestamp, born_host=m.born_host, store_timestamp=m.store_timestamp,
                   store_host=m.store_host, commitlog_offset=m.commitlog_offset, reconsume_times=m.reconsume_times,
                   flag=m.flag, sys_flag=m.sys_flag, body_crc=m.body_crc, store_size=m.store_size,
                   body_compressed=m.body_compressed)

    @property
    def text(self) -> str:
        """The body as UTF-8 text (undecodable bytes replaced)."""
        return self.body.decode("utf-8", errors="replace")

    def to_json(self) -> dict[str, Any]:
        """JSON-safe fields: the body as ``body`` when it is UTF-8 text, else as ``body_base64``."""
        data: dict[str, Any] = {
            "topic": self.topic, "queue_id": self.queue_id, "queue_offset": self.queue_offset,
            "uniq_key": self.uniq_key, "offset_msg_id": self.offset_msg_id, "msg_id": self.msg_id,
            "tags": self.tags, "keys": list(self.keys), "properties": self.properties,
            "born_timestamp": self.born_timestamp, "born_host": self.born_host,
            "store_timestamp": self.store_timestamp, "store_host": self.store_host,
            "commitlog_offset": self.commitlog_offset, "reconsume_times": self.reconsume_times,
            "flag": self.flag, "sys_flag": self.sys_flag, "body_crc": self.body_crc, "store_size": self.store_size,
        }
        if self.body_compressed:
            data["body_compressed"] = True
        try:
            data["body"] = self.body.decode("utf-8")
        except UnicodeDecodeError:
            data["body_base64"] = base64.b64encode(self.body).decode("ascii")
        return data


@dataclass(slots=True, frozen=True)
class QueueOffsets:
    """A queue's offsets: messages are at ``min_offset <= offset < max_offset``."""

    topic: str
    queue_id: int
    min_offset: int
    max_offset: int

    @property
    def count(self) -> int:
        return self.max_offset - self.min_offset

    def to_json(self) -> dict[str, Any]:
        return {"topic": self.topic, "queue_id": self.queue_id, "min_offset": self.min_offset,
                "max_offset": self.max_offset}


def perm_text(perm: int) -> str:
    """``rw``, ``r-``, ``-w`` or ``--``, as RocketMQ's admin tools print a permission."""
    return ("r" if perm & PERM_READ else "-") + ("w" if perm & PERM_WRITE else "-")


@dataclass(slots=True, frozen=True)
class TopicConfig:
    topic: str
    read_queue_nums: int
    write_queue_nums: int
    #: 6 = read and write, 4 = read only, 2 = write only (RocketMQ's PermName bits).
    perm: int

    @classmethod
    def from_proto(cls, c: Any) -> TopicConfig:
        return cls(topic=c.topic, read_queue_nums=c.read_queue_nums, write_queue_nums=c.write_queue_nums,
                   perm=c.perm)

    def to_json(self) -> dict[str, Any]:
        """``perm`` as the table shows it and ``--perm`` takes it (``rw``); ``perm_bits``: RocketMQ's number."""
        return {"topic": self.topic, "read_queue_nums": self.read_queue_nums,
                "write_queue_nums": self.write_queue_nums, "perm": perm_text(self.perm), "perm_bits": self.perm}


@dataclass(slots=True, frozen=True)
class QueueRoute:
    queue_id: int
    shard: str
    #: The queue's id inside its shard's store.
    shard_queue_id: int
    writable: bool
    readable: bool

    def to_json(self) -> dict[str, Any]:
        return {"queue_id": self.queue_id, "shard": self.shard, "shard_queue_id": self.shard_queue_id,
                "writable": self.writable, "readable": self.readable}


@dataclass(slots=True, frozen=True)
class TopicRoute:
    topic: str
    queues: tuple[QueueRoute, ...]

    @classmethod
    def from_proto(cls, r: Any) -> TopicRoute:
        return cls(topic=r.topic, queues=tuple(
            QueueRoute(queue_id=q.queue_id, shard=q.shard, shard_queue_id=q.shard_queue_id, writable=q.writable,
                       readable=q.readable) for q in r.queues))

    @property
    def readable_queue_ids(self) -> list[int]:
        return [q.queue_id for q in self.queues if q.readable]

    def to_json(self) -> dict[str, Any]:
        return {"topic": self.topic, "queues": [q.to_json() for q in self.queues]}


@dataclass(slots=True, frozen=True)
class QueryResult:
    """Messages found by key, in store order."""

    messages: list[Message]
    #: Index hits examined: 64 means older matches may exist (narrow the time range).
    index_hits: int
    index_last_update_timestamp: int

    @property
    def maybe_more(self) -> bool:
        return self.index_hits >= 64
