"""Protobuf <-> domain types for the query service: the only module (with the servicer and the
backends) that sees generated code."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mqstore.v1 import query_pb2
from services.query.lookup import KeyQueryResult
from services.query.pull import PullResult
from services.query.stored_message import StoredMessage
from services.store.formats.message import PROPERTY_KEYS, PROPERTY_TAGS, PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX
from services.store.formats.message_id import MessageIdKind
from services.store.rules.pull_request import PullQuery
from services.store.rules.subscription import parse_subscription


def add_messages(target: Any, messages: Sequence[StoredMessage]) -> None:
    """Append ``messages`` to a repeated StoredMessage field. Built in place with ``add``: a message
    built alone and then appended is copied again, which costs as much as building it (a pull
    converts up to 1024 messages)."""
    add = target.add
    for m in messages:
        props = m.properties
        message = add(
            topic=m.topic, queue_id=m.queue_id, queue_offset=m.queue_offset, commitlog_offset=m.commitlog_offset,
            offset_msg_id=m.msg_id, msg_id=m.msg_id, tags=props.get(PROPERTY_TAGS, ""),
            keys=props.get(PROPERTY_KEYS, ""), uniq_key=props.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX, ""),
            born_timestamp=m.born_timestamp,
            born_host=m.born_host, store_timestamp=m.store_timestamp, store_host=m.store_host,
            reconsume_times=m.reconsume_times, sys_flag=m.sys_flag, flag=m.flag, body=m.body, body_crc=m.body_crc,
            store_size=m.store_size, prepared_transaction_offset=m.prepared_transaction_offset,
            body_compressed=m.body_compressed)
        # Item by item: a dict passed to the constructor goes through the slower Mapping.update.
        properties = message.properties
        for name, value in props.items():
            properties[name] = value


def pull_query_from_proto(request: query_pb2.PullMessageRequest, max_long_poll_ms: int) -> PullQuery:
    """Raises InvalidArgumentError for any field out of its bounds."""
    return PullQuery.checked(request.topic, request.queue_id, request.queue_offset, request.max_messages,
                             request.max_bytes, parse_subscription(request.subscription), request.long_poll_ms,
                             max_long_poll_ms)


def pull_result_to_proto(result: PullResult) -> query_pb2.PullMessageResponse:
    """Decoded messages, or a raw pull's record bytes (set only when there are some, so an empty raw
    answer is byte for byte the decoded one)."""
    response = query_pb2.PullMessageResponse(status=result.status.value, next_begin_offset=result.next_begin_offset,
                                             min_offset=result.min_offset, max_offset=result.max_offset)
    if result.record_count:
        response.records = result.records
        response.record_count = result.record_count
    else:
        add_messages(response.messages, result.messages)
    return response


def view_response(message: StoredMessage, found_by: MessageIdKind) -> query_pb2.ViewMessageResponse:
    built = query_pb2.QueryMessageResponse()
    add_messages(built.messages, [message])
    return query_pb2.ViewMessageResponse(message=built.messages[0], found_by=found_by.value)


def query_response(result: KeyQueryResult) -> query_pb2.QueryMessageResponse:
    response = query_pb2.QueryMessageResponse(
        index_last_update_timestamp=result.index_last_update_timestamp,
        index_last_update_phy_offset=result.index_last_update_phy_offset, index_hits=result.index_hits)
    add_messages(response.messages, result.messages)
    return response

