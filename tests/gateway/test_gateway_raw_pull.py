"""A raw pull through a route whose queue ids are offset across shards: the gateway relays the query
service's answer untouched (the records keep the shard's queue id) and the client numbers them with
the route queue id it asked for, so a raw pull gives the decoded pull's messages."""

from __future__ import annotations

import time

from mqstore.client.models import Message
from mqstore.client.records import decode_records
from mqstore.v1 import query_pb2
from tests.gateway.test_gateway_shards import Cluster, cluster, create, send

__all__ = ["cluster"]


def test_a_raw_pull_on_the_second_shard_equals_the_decoded_one(cluster: Cluster) -> None:
    create(cluster, "rawrouted")
    results = [send(cluster, "rawrouted", f"m{i}".encode(), properties={"TAGS": "t"}) for i in range(16)]
    on_b = next(r for r in results if r.shard == "shard-b" and r.queue_id >= 4)
    wanted = sum(1 for r in results if r.queue_id == on_b.queue_id)
    request = query_pb2.PullMessageRequest(topic="rawrouted", queue_id=on_b.queue_id, max_messages=64)
    deadline = time.monotonic() + 10
    while len(decoded := cluster.stub.Pull(request, timeout=10).messages) < wanted:
        assert time.monotonic() < deadline, "the messages did not become pullable"
        time.sleep(0.05)
    request.raw_records = True
    raw = cluster.stub.Pull(request, timeout=10)
    assert raw.record_count == wanted and not raw.messages
    assert decode_records(raw.records)[0].queue_id == on_b.queue_id - 4  # as stored: the shard's id
    assert decode_records(raw.records, on_b.queue_id) == [Message.from_proto(m) for m in decoded]
