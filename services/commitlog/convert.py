"""Protobuf <-> domain conversion at the edge of the commitlog service.

Only the servicer imports this module; the engine and the store never see a protobuf type.
"""

from __future__ import annotations

from urllib.parse import unquote

from mqstore.v1 import commitlog_pb2, common_pb2

from services.commitlog.commit_log import StoreStats
from services.commitlog.put_result import PutMessageResult, PutMessageStatus
from services.commitlog.topic_config import TopicConfig
from services.store.message import Message

#: born_host of a message whose producer left it empty and whose peer is not an IP (a unix socket).
UNKNOWN_BORN_HOST = "127.0.0.1:0"

# Domain status -> proto enum value, by name (the numbers match too, but names say what is meant).
_STATUS_TO_PROTO: dict[PutMessageStatus, int] = {
    status: commitlog_pb2.PutMessageStatus.Value(f"PUT_MESSAGE_STATUS_{status.name}")
    for status in PutMessageStatus
}


def peer_address(peer: str) -> str:
    """``context.peer()`` -> ``ip:port`` as a record stores it.

    ``"ipv4:127.0.0.1:5000"`` -> ``"127.0.0.1:5000"``; ``"ipv6:[::1]:5000"`` (or its URL-escaped form
    ``"ipv6:%5B::1%5D:5000"``, which some gRPC versions report) -> ``"[::1]:5000"``; anything else
    (``unix:``, empty) -> :data:`UNKNOWN_BORN_HOST`.
    """
    scheme, _, address = peer.partition(":")
    if scheme not in ("ipv4", "ipv6") or not address:
        return UNKNOWN_BORN_HOST
    address = unquote(address)
    if scheme == "ipv6" and not address.startswith("["):
        host, _, port = address.rpartition(":")
        address = f"[{host}]:{port}"
    return address


def message_from_proto(pb: common_pb2.Message, peer: str) -> Message:
    """A producer's message; an empty born_host becomes the caller's address (``peer``)."""
    return Message(
        topic=pb.topic,
        queue_id=pb.queue_id,
        body=pb.body,
        flag=pb.flag,
        properties=dict(pb.properties),
        born_timestamp=pb.born_timestamp,
        born_host=pb.born_host or peer_address(peer),
        sys_flag=pb.sys_flag,
        reconsume_times=pb.reconsume_times,
        prepared_transaction_offset=pb.prepared_transaction_offset,
    )


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


def topic_config_from_proto(pb: common_pb2.TopicConfig) -> TopicConfig:
    return TopicConfig(topic=pb.topic, read_queue_nums=pb.read_queue_nums,
                       write_queue_nums=pb.write_queue_nums, perm=pb.perm)


def topic_config_to_proto(config: TopicConfig) -> common_pb2.TopicConfig:
    return common_pb2.TopicConfig(topic=config.topic, read_queue_nums=config.read_queue_nums,
                                  write_queue_nums=config.write_queue_nums, perm=config.perm)


def store_info_to_proto(stats: StoreStats, *, flush_disk_type: str, transient_store_pool_enable: bool,
                        mapped_file_size: int, store_root: str, incarnation: str,
                        store_host: str) -> commitlog_pb2.StoreInfo:
    """StoreStats plus the settings a caller needs to interpret them (file size, flush mode)."""
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
    )
