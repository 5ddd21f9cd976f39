"""The gateway <-> commitlog wire contract, read from the generated descriptors.

The gateway forwards its clients' SendRequest / SendBatchRequest bytes to the commitlog as
AppendBatchRequest bytes (gateway/shard.py, gateway/servicer.py) and writes encoded_messages by hand:
that works only while the field numbers and types line up, which nothing in protobuf itself checks.
"""

from __future__ import annotations

from google.protobuf.descriptor import Descriptor, FieldDescriptor

from gateway import servicer
from mqstore.v1 import commitlog_pb2, common_pb2, gateway_pb2

APPEND = commitlog_pb2.AppendBatchRequest.DESCRIPTOR
FORWARDED = (  # (gateway request, its field that is AppendBatchRequest.messages, the fields the gateway clears)
    (gateway_pb2.SendRequest.DESCRIPTOR, "message", servicer._SEND_ONLY_FIELDS),
    (gateway_pb2.SendBatchRequest.DESCRIPTOR, "messages", servicer._SEND_BATCH_ONLY_FIELDS),
)


def _shape(field: FieldDescriptor) -> tuple[int, int, str]:
    return field.number, field.type, field.message_type.full_name if field.message_type else ""


def test_the_forwarded_requests_messages_are_append_batch_entries() -> None:
    """Field 1 of SendRequest (one Message) and of SendBatchRequest (repeated Message) is, on the wire,
    AppendBatchRequest.messages: same number, same wire type, same message type."""
    entries = APPEND.fields_by_name["messages"]
    assert entries.type == FieldDescriptor.TYPE_MESSAGE and entries.message_type is common_pb2.Message.DESCRIPTOR
    for request, name, _ in FORWARDED:
        assert _shape(request.fields_by_name[name]) == _shape(entries), \
            f"{request.full_name}.{name} no longer lines up with {APPEND.full_name}.messages"


def test_every_other_field_of_a_forwarded_request_is_cleared_by_the_gateway() -> None:
    """A field the gateway did not clear would reach the commitlog as whatever AppendBatchRequest field
    has its number (SendRequest.sharding_key would be read as the batch's topic)."""
    for request, name, cleared in FORWARDED:
        assert set(_field_names(request)) - {name} == set(cleared), request.full_name


def _field_names(message: Descriptor) -> list[str]:
    return [field.name for field in message.fields]


def test_send_requests_back_to_back_are_one_append_batch() -> None:
    messages = [common_pb2.Message(topic="T", queue_id=i, body=b"m%d" % i, properties={"KEYS": str(i)})
                for i in range(3)]
    data = b"".join(gateway_pb2.SendRequest(message=m).SerializeToString() for m in messages)
    assert list(commitlog_pb2.AppendBatchRequest.FromString(data).messages) == messages
    batch = gateway_pb2.SendBatchRequest(messages=messages).SerializeToString()
    assert list(commitlog_pb2.AppendBatchRequest.FromString(batch).messages) == messages


def test_the_hand_encoded_blob_is_the_encoded_messages_field() -> None:
    head = commitlog_pb2.AppendBatchRequest(topic="T", queue_id=3, born_timestamp=1_700_000_000_000,
                                            born_host="10.0.0.1:5000", sys_flag=2)
    for blob in (b"", b"x", b"y" * 300, b"z" * 70_000):  # one-, two- and three-byte length varints
        expected = commitlog_pb2.AppendBatchRequest()
        expected.CopyFrom(head)
        expected.encoded_messages = blob
        assert commitlog_pb2.AppendBatchRequest.FromString(servicer.blob_append_request(head, blob)) == expected
