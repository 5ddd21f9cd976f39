"""Protobuf <-> domain conversion at the edge of the commitlog service.

Only the servicer imports this module; the engine and the store never see a protobuf type.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from mqstore.v1 import commitlog_pb2, common_pb2
from services.commitlog.message_store import StoreStats
from services.commitlog.put_result import PutMessageResult, PutMessageStatus
from services.server.peer import peer_address
from services.store.formats.message import TRANSACTION_COMMIT_TYPE, TRANSACTION_TYPE_MASK, Message
from services.store.formats.quarantine import QuarantinedRange
from services.store.rules.batch_codec import decode_blob
from services.store.rules.due_message import DueMessage
from services.store.rules.producer_message import check_producer_message, check_producer_request
from services.store.rules.topics import TopicConfig

# Domain status -> proto enum value, by name (the numbers match too, but names say what is meant).
_STATUS_TO_PROTO: dict[PutMessageStatus, int] = {
    status: commitlog_pb2.PutMessageStatus.Value(f"PUT_MESSAGE_STATUS_{status.name}")
    for status in PutMessageStatus
}


def message_from_proto(pb: common_pb2.Message, peer: str, group_flow: bool = False,
                       transaction_flow: bool = False, due: bool = False) -> Message:
    """A producer's message; an empty born_host becomes the caller's address (``peer``). ``group_flow``:
    AppendRequest.group_flow (the send-back flow may write %RETRY% / %DLQ% topics); ``transaction_flow``:
    AppendRequest.transaction_flow (half / op / commit records); ``due``: AppendRequest.scheduled_delivery
    (a :class:`DueMessage`, stored without parking it again)."""
    return _message(pb, pb.born_host or peer_address(peer), None, group_flow, transaction_flow, due)


def messages_from_proto(pbs: Iterable[common_pb2.Message], peer: str, due: bool = False) -> list[Message]:
    """A batch's messages: the caller's address is worked out once, not per message."""
    host = peer_address(peer)
    return [_message(pb, pb.born_host or host, i, due=due) for i, pb in enumerate(pbs)]


def _message(pb: common_pb2.Message, born_host: str, index: int | None, group_flow: bool = False,
             transaction_flow: bool = False, due: bool = False) -> Message:
    """A message that came over the wire: only what a producer may send (``producer_message.py``)."""
    # Runs once per appended message: positional arguments in Message's field order, and the properties
    # copied by iterating the map's keys in C (``dict(map)`` goes through a Python-level KeysView and
    # costs twice as much).
    props = pb.properties
    properties = {k: props[k] for k in props}
    # A due message parked as a committed transaction message keeps its commit type, as 4.9.8 delivers it.
    committed_due = due and pb.sys_flag & TRANSACTION_TYPE_MASK == TRANSACTION_COMMIT_TYPE
    check_producer_message(pb.topic, properties, pb.flag, pb.sys_flag, pb.born_timestamp, pb.reconsume_times,
                           pb.prepared_transaction_offset, index, group_flow, transaction_flow or committed_due)
    return (DueMessage if due else Message)(pb.topic, pb.queue_id, pb.body, pb.flag, properties, pb.born_timestamp,
                                            born_host, pb.sys_flag, pb.reconsume_times, pb.prepared_transaction_offset)


def append_result_to_proto(result: PutMessageResult) -> commitlog_pb2.AppendResult:
    return commitlog_pb2.AppendResult(
        status=_STATUS_TO_PROTO[result.status],
        msg_id=result.msg_id,
        commitlog_offset=result.commitlog_offset,
        queue_offset=result.queue_offset,
        store_timestamp=result.store_timestamp,
        wrote_bytes=result.wrote_bytes,
        topic=result.topic,
        queue_id=result.queue_id,
    )


def append_batch_response(results: Sequence[PutMessageResult]) -> commitlog_pb2.AppendBatchResponse:
    """Results built in place in the response (``add``), not built apart and then copied in."""
    response = commitlog_pb2.AppendBatchResponse()
    add, status_of = response.results.add, _STATUS_TO_PROTO
    for r in results:
        add(status=status_of[r.status], msg_id=r.msg_id, commitlog_offset=r.commitlog_offset,
            queue_offset=r.queue_offset, store_timestamp=r.store_timestamp, wrote_bytes=r.wrote_bytes,
            topic=r.topic, queue_id=r.queue_id)
    return response


def blob_messages_from_proto(request: commitlog_pb2.AppendBatchRequest, blob: bytes, peer: str,
                              max_messages: int) -> list[Message]:
    """A blob batch's messages (``batch_codec.py``): the request-wide fields checked once, every entry in
    the decoding pass. ``blob``: the request's encoded_messages, read once (each read copies it)."""
    topic = request.topic
    check_producer_request(topic, request.sys_flag, request.born_timestamp)
    return decode_blob(blob, topic, request.queue_id, request.born_timestamp,
                       request.born_host or peer_address(peer), request.sys_flag, max_messages)


def append_blob_response(results: Sequence[PutMessageResult], topic: str,
                         queue_id: int) -> commitlog_pb2.AppendBatchResponse:
    """One receipt when every message was stored alike (same status and store time, ``topic`` /
    ``queue_id``, consecutive queue offsets); else a result per message (DELAY messages go to
    SCHEDULE_TOPIC_XXXX queues of their own)."""
    first = results[0]
    status, timestamp, queue_offset = first.status, first.store_timestamp, first.queue_offset
    for i, r in enumerate(results):
        if r.status is not status or r.store_timestamp != timestamp or r.queue_offset != queue_offset + i or \
                r.topic != topic or r.queue_id != queue_id:
            return append_batch_response(results)
    return commitlog_pb2.AppendBatchResponse(receipt=commitlog_pb2.AppendBatchReceipt(
        status=_STATUS_TO_PROTO[status], store_timestamp=timestamp, first_queue_offset=queue_offset,
        commitlog_offsets=[r.commitlog_offset for r in results], offset_msg_id_prefix=first.store_host.hex().upper()))


def topic_config_from_proto(pb: common_pb2.TopicConfig) -> TopicConfig:
    return TopicConfig(topic=pb.topic, read_queue_nums=pb.read_queue_nums,
                       write_queue_nums=pb.write_queue_nums, perm=pb.perm)


def topic_config_to_proto(config: TopicConfig) -> common_pb2.TopicConfig:
    return common_pb2.TopicConfig(topic=config.topic, read_queue_nums=config.read_queue_nums,
                                  write_queue_nums=config.write_queue_nums, perm=config.perm)


def store_info_to_proto(stats: StoreStats, *, flush_disk_type: str, transient_store_pool_enable: bool,
                        mapped_file_size: int, store_root: str, incarnation: str,
                        store_host: str,
                        quarantined: Sequence[QuarantinedRange] = (), disk_clean_ratio: float = 0.0,
                        disk_refuse_ratio: float = 0.0, disk_full: bool = False) -> commitlog_pb2.StoreInfo:
    """StoreStats plus the settings a caller needs to interpret them (file size, flush mode), and
    the quarantined ranges a Tail may skip."""
    return commitlog_pb2.StoreInfo(
        min_offset=stats.min_offset,
        max_offset=stats.max_offset,
        flushed_offset=stats.flushed_offset,
        committed_offset=stats.committed_offset,
        flush_disk_type=flush_disk_type,
        transient_store_pool_enable=transient_store_pool_enable,
        mapped_file_size=mapped_file_size,
        mapped_file_count=stats.mapped_file_count,
        disk_total_bytes=stats.disk_total_bytes,
        disk_used_bytes=stats.disk_used_bytes,
        disk_used_ratio=stats.disk_used_bytes / stats.disk_total_bytes if stats.disk_total_bytes else 0.0,
        store_root=store_root,
        incarnation=incarnation,
        store_host=store_host,
        recovered_offset=stats.recovered_offset,
        quarantined_ranges=[commitlog_pb2.QuarantinedRange(start_offset=r.start, end_offset=r.end, reason=r.reason)
                            for r in quarantined],
        disk_clean_ratio=disk_clean_ratio,
        disk_refuse_ratio=disk_refuse_ratio,
        disk_full=disk_full,
    )
