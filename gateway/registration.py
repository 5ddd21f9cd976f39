"""The MessagingService's registration on a gRPC server: the generated one's shape, with the wire
edge's decoding (undecodable requests reach the servicer as such) and serialising (relayed bytes go
out as they are)."""

from __future__ import annotations

from typing import Any

import grpc

from gateway.servicer import MessagingServicer
from gateway.wire import SERVICE_NAME, decoder, serialize
from mqstore.v1 import admin_pb2, commitlog_pb2, gateway_pb2, groups_pb2, query_pb2, transaction_pb2


def add_to_server(servicer: MessagingServicer, server: grpc.aio.Server) -> None:
    """Like the generated ``add_MessagingServiceServicer_to_server``, but every answer may also be
    bytes already serialised by a backend (relayed pulls)."""
    unary_methods: dict[str, tuple[Any, Any]] = {
        "Send": (servicer.Send, gateway_pb2.SendRequest),
        "SendBatch": (servicer.SendBatch, gateway_pb2.SendBatchRequest),
        "Pull": (servicer.Pull, query_pb2.PullMessageRequest),
        "GetMessage": (servicer.GetMessage, query_pb2.ViewMessageRequest),
        "QueryByKey": (servicer.QueryByKey, query_pb2.QueryMessageRequest),
        "SearchOffset": (servicer.SearchOffset, query_pb2.SearchOffsetRequest),
        "GetQueueOffsets": (servicer.GetQueueOffsets, query_pb2.GetQueueOffsetRangeRequest),
        "CommitOffset": (servicer.CommitOffset, query_pb2.UpdateConsumerOffsetRequest),
        "QueryOffset": (servicer.QueryOffset, query_pb2.QueryConsumerOffsetRequest),
        "CreateTopic": (servicer.CreateTopic, commitlog_pb2.TopicRequest),
        "UpdateTopic": (servicer.UpdateTopic, commitlog_pb2.TopicRequest),
        "ListTopics": (servicer.ListTopics, commitlog_pb2.ListTopicsRequest),
        "GetRoute": (servicer.GetRoute, gateway_pb2.GetRouteRequest),
        "ConsumerSendBack": (servicer.ConsumerSendBack, gateway_pb2.ConsumerSendBackRequest),
        "Heartbeat": (servicer.Heartbeat, groups_pb2.HeartbeatRequest),
        "UnregisterConsumer": (servicer.UnregisterConsumer, groups_pb2.UnregisterConsumerRequest),
        "DescribeGroups": (servicer.DescribeGroups, groups_pb2.DescribeGroupsRequest),
        "EndTransaction": (servicer.EndTransaction, transaction_pb2.EndTransactionRequest),
        "GetClusterStatus": (servicer.GetClusterStatus, admin_pb2.GetClusterStatusRequest),
        "DeleteTopic": (servicer.DeleteTopic, admin_pb2.DeleteTopicRequest),
    }
    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {
        name: grpc.unary_unary_rpc_method_handler(handler, request_deserializer=decoder(request_type),
                                                  response_serializer=serialize)
        for name, (handler, request_type) in unary_methods.items()
    }
    handlers["SendStream"] = grpc.stream_stream_rpc_method_handler(
        servicer.SendStream, request_deserializer=decoder(gateway_pb2.SendRequest), response_serializer=serialize)
    handlers["SendBatchStream"] = grpc.stream_stream_rpc_method_handler(
        servicer.SendBatchStream, request_deserializer=decoder(gateway_pb2.SendBatchRequest),
        response_serializer=serialize)
    handlers["TransactionChecks"] = grpc.stream_stream_rpc_method_handler(
        servicer.TransactionChecks, request_deserializer=decoder(transaction_pb2.TransactionCheckStreamRequest),
        response_serializer=serialize)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
