"""RocketMQ 5 messages (apache.rocketmq.v2.Message) to and from mqstore's (mqstore.v1 Message and
StoredMessage), with RocketMQ's own property names, so a message reads the same through both protocols:

* tag -> TAGS, keys -> KEYS (space separated), user properties as they are;
* message group (FIFO) -> __SHARDINGKEY (RocketMQ 5's property) and the send's sharding key, so one
  group stays in one queue;
* delivery timestamp -> TIMER_DELIVER_MS (RocketMQ 5's timer message);
* transactional -> TRAN_MSG + PGROUP (mqstore's half message flow);
* message id -> the UNIQ_KEY the gateway gives the message. RocketMQ 5 clients make 34-digit ids
  ("01" + 32 hex digits) that are not RocketMQ 4 UNIQ_KEYs, so the gateway's id is the one returned
  by the send (SendReceipt.message_id) and seen by consumers.
"""

from __future__ import annotations

import hashlib
import zlib

from google.protobuf import timestamp_pb2

from apache.rocketmq.v2 import definition_pb2
from mqstore.v1 import common_pb2, query_pb2, transaction_pb2

TAGS = "TAGS"
KEYS = "KEYS"
UNIQ_KEY = "UNIQ_KEY"
SHARDING_KEY = "__SHARDINGKEY"
TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
TRANSACTION_PREPARED = "TRAN_MSG"
PRODUCER_GROUP = "PGROUP"
#: The producer group of half messages sent over the v2 protocol (its clients name no producer group).
V2_PRODUCER_GROUP = "RMQ5_PRODUCER_GROUP"
#: Properties that are system properties in v2 (not handed to consumers as user properties).
_SYSTEM = {TAGS, KEYS, UNIQ_KEY, SHARDING_KEY, TIMER_DELIVER_MS, TRANSACTION_PREPARED, PRODUCER_GROUP,
           "DELAY", "WAIT", "REAL_TOPIC", "REAL_QID", "TIMER_OUT_MS", "TIMER_ENQUEUE_MS", "TIMER_DEQUEUE_MS",
           "RETRY_TOPIC", "ORIGIN_MESSAGE_ID", "MIN_OFFSET", "MAX_OFFSET", "CLUSTER", "TRACE_ON",
           "CONSUME_START_TIME", "TRAN_PREPARED_QUEUE_OFFSET", "__transactionId__"}
MessageType = definition_pb2.MessageType


class BadMessage(ValueError):
    """A v2 message mqstore cannot store as given (the reason says what to fix)."""


def to_mqstore(message: definition_pb2.Message, max_body_bytes: int) -> tuple[common_pb2.Message, str]:
    """The mqstore message for a v2 one, and its sharding key ("" unless FIFO)."""
    system = message.system_properties
    body = bytes(message.body)
    if system.body_encoding == definition_pb2.Encoding.GZIP:
        body = gunzip(body, max_body_bytes)
    if len(body) > max_body_bytes:
        raise BadMessage(f"the body is {len(body)} bytes, more than the {max_body_bytes} allowed")
    properties = dict(message.user_properties)
    clashing = sorted(set(properties) & _SYSTEM)
    if clashing:
        raise BadMessage(f"user properties may not use the system property names {clashing}")
    if system.HasField("tag"):
        properties[TAGS] = system.tag
    if system.keys:
        properties[KEYS] = " ".join(system.keys)
    sharding_key = ""
    if system.HasField("message_group"):
        if not system.message_group:
            raise BadMessage("the message group is empty: give a FIFO message a non-empty message group")
        sharding_key = properties[SHARDING_KEY] = system.message_group
    if system.HasField("delivery_timestamp"):
        properties[TIMER_DELIVER_MS] = str(_millis(system.delivery_timestamp))
    if system.message_type == MessageType.TRANSACTION:
        properties[TRANSACTION_PREPARED] = "true"
        properties[PRODUCER_GROUP] = V2_PRODUCER_GROUP
    born_ms = _millis(system.born_timestamp) if system.HasField("born_timestamp") else 0
    return common_pb2.Message(topic=message.topic.name, body=body, properties=properties,
                              born_timestamp=born_ms), sharding_key


def gunzip(body: bytes, max_body_bytes: int) -> bytes:
    """A GZIP-encoded body inflated (every member, as gzip.decompress reads them), never past
    ``max_body_bytes``: a few KiB of GZIP can claim gigabytes, so a body that would inflate beyond the
    limit is refused when the limit is reached, not once it is whole."""
    out = bytearray()
    rest = body
    while True:
        inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
        try:
            out += inflater.decompress(rest, max_body_bytes + 1 - len(out))
        except zlib.error as exc:
            raise BadMessage(f"the body is marked GZIP but does not decompress: {exc}") from None
        if len(out) > max_body_bytes:
            raise BadMessage(f"the body inflates to more than the {max_body_bytes} bytes allowed")
        if not inflater.eof:
            raise BadMessage("the body is marked GZIP but does not decompress: its gzip stream is cut short")
        rest = inflater.unused_data
        if not rest:
            return bytes(out)


def to_v2(stored: query_pb2.StoredMessage, topic: definition_pb2.Resource, queue_id: int, receipt_handle: str,
          invisible_ms: int, delivery_attempt: int) -> definition_pb2.Message:
    """The v2 message a consumer receives for a stored one."""
    props = stored.properties
    body = bytes(stored.body)
    system = definition_pb2.SystemProperties(
        message_id=stored.uniq_key or stored.msg_id,
        body_digest=body_digest(body),
        body_encoding=body_encoding(stored),
        born_timestamp=_timestamp(stored.born_timestamp), born_host=stored.born_host.rsplit(":", 1)[0],
        store_timestamp=_timestamp(stored.store_timestamp), store_host=stored.store_host,
        receipt_handle=receipt_handle, queue_id=queue_id, queue_offset=stored.queue_offset,
        delivery_attempt=delivery_attempt)
    system.invisible_duration.FromMilliseconds(invisible_ms)
    system.message_type = MessageType.NORMAL
    if TAGS in props:
        system.tag = props[TAGS]
    if props.get(KEYS):
        system.keys.extend(props[KEYS].split())
    if SHARDING_KEY in props:
        system.message_group = props[SHARDING_KEY]
        system.message_type = MessageType.FIFO
    elif TIMER_DELIVER_MS in props or "DELAY" in props:
        system.message_type = MessageType.DELAY
        if props.get(TIMER_DELIVER_MS, "").isdigit():
            system.delivery_timestamp.CopyFrom(_timestamp(int(props[TIMER_DELIVER_MS])))
    elif TRANSACTION_PREPARED in props:
        system.message_type = MessageType.TRANSACTION
    user = {k: v for k, v in props.items() if k not in _SYSTEM}
    return definition_pb2.Message(topic=topic, user_properties=user, system_properties=system, body=body)


def body_encoding(stored: query_pb2.StoredMessage) -> definition_pb2.Encoding.ValueType:
    """IDENTITY for a body the query service handed over plain or inflated (the one inflate rule);
    GZIP for one it left as stored, compressed (LZ4, ZSTD, not a whole zlib stream): RocketMQ 5's
    proxy marks every body whose record has the compressed flag GZIP and sends its stored bytes, the
    only compressed encoding v2 has, so a consumer sees the body it cannot decode as such."""
    return definition_pb2.Encoding.GZIP if stored.body_compressed else definition_pb2.Encoding.IDENTITY


def body_digest(body: bytes) -> definition_pb2.Digest:
    """The digest a RocketMQ 5 proxy sends: MD5 as 32 uppercase hex digits, the one form every official
    client verifies alike (their CRC32 forms differ: the Node client compares a decimal string, the
    Java and Python clients hex). A client discards a message whose digest does not match."""
    return definition_pb2.Digest(type=definition_pb2.DigestType.MD5, checksum=hashlib.md5(body).hexdigest().upper())


def _millis(ts: timestamp_pb2.Timestamp) -> int:
    return ts.seconds * 1000 + ts.nanos // 1_000_000


def _timestamp(ms: int) -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.FromMilliseconds(ms)
    return ts


def check_message(check: transaction_pb2.TransactionCheck) -> definition_pb2.Message:
    """The half of a transaction check as the v2 message a producer's TransactionChecker sees."""
    props = check.message.properties
    body = bytes(check.message.body)
    system = definition_pb2.SystemProperties(message_id=check.transaction_id,
                                             message_type=MessageType.TRANSACTION,
                                             body_digest=body_digest(body),
                                             body_encoding=definition_pb2.Encoding.IDENTITY)
    if check.message.born_timestamp:
        system.born_timestamp.CopyFrom(_timestamp(check.message.born_timestamp))
    if TAGS in props:
        system.tag = props[TAGS]
    if props.get(KEYS):
        system.keys.extend(props[KEYS].split())
    user = {k: v for k, v in props.items() if k not in _SYSTEM}
    return definition_pb2.Message(topic=definition_pb2.Resource(name=check.message.topic), user_properties=user,
                                  system_properties=system, body=body)
