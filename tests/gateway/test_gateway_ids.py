"""GetMessage through the gateway with ids of every length RocketMQ makes, and after a store host
change (real processes: two commitlog/indexer/query triples and a gateway).

An IPv6 producer's UNIQ_KEY has 56 hex digits, like an IPv6 store host's offset msg id. A shard whose
broker IP changes (a rescheduled pod) still holds the records of its old host: an offset msg id naming
a host no shard has now must be asked of every shard, and answered with its route queue id.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from mqstore.v1 import commitlog_pb2, common_pb2, gateway_pb2, gateway_pb2_grpc, query_pb2, query_pb2_grpc
from services.store.formats.message_id import make_message_id
from services.store.formats.uniq_key import decode_uniq_key
from tests.commitlog.commitlog_process import ServiceProcess, free_port, spawn_service, start_commitlog
from tests.query.query_process import System
from tests.waiting import eventually_found

Kind = query_pb2.MessageIdKind
SETTINGS = """
shards:
  - {{name: shard-a, commitlog: "{a_commitlog}", query: "{a_query}"}}
  - {{name: shard-b, commitlog: "{b_commitlog}", query: "{b_query}"}}
backend_timeout_ms: 2000
"""
# What a RocketMQ 4.9.8 client on 2001:db8::5 makes: ip 16 + pid 2 + class-loader hash 4 + ms 4 + counter 2.
UNIQ_V6 = "20010DB8000000000000000000000005" + "1F40" + "12345678" + "000003E8" + "0007"


class GatewayProcess(ServiceProcess):
    service_name = "mqstore.v1.MessagingService"


@dataclass
class Cluster:
    a: System
    b: System
    root: Path
    gateway: GatewayProcess | None = None

    @property
    def stub(self) -> gateway_pb2_grpc.MessagingServiceStub:
        assert self.gateway is not None
        return gateway_pb2_grpc.MessagingServiceStub(self.gateway.channel)

    def start_gateway(self, port: int | None = None) -> None:
        settings = self.root / "gateway.yaml"
        settings.write_text(SETTINGS.format(a_commitlog=self.a.commitlog.address, a_query=self.a.query.address,
                                            b_commitlog=self.b.commitlog.address, b_query=self.b.query.address))
        port = port or free_port()
        log_path = self.root / f"gateway-{time.monotonic_ns()}.log"
        self.gateway = GatewayProcess(self.root, port, spawn_service(
            ["gateway", "--config", str(settings), "--listen", f"127.0.0.1:{port}"], None, log_path), log_path)
        self.gateway.wait_serving()

    def restart_gateway(self) -> None:
        assert self.gateway is not None
        port = self.gateway.port
        assert self.gateway.stop() == 0, self.gateway.logs()[-3000:]
        self.start_gateway(port)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("ids")
    a = System.start(root / "a", {"MQSTORE_LISTEN_PORT": "10911", "MQSTORE_BROKER_IP": "127.0.0.1"})
    try:
        b = System.start(root / "b", {"MQSTORE_LISTEN_PORT": "10912", "MQSTORE_BROKER_IP": "127.0.0.1"})
    except BaseException:
        a.kill_all()
        raise
    started = Cluster(a, b, root)
    try:
        started.start_gateway()
        started.stub.CreateTopic(commitlog_pb2.TopicRequest(topic=common_pb2.TopicConfig(
            topic="ids", read_queue_nums=4, write_queue_nums=4, perm=6)), timeout=10)
        yield started
        assert started.gateway is not None
        assert started.gateway.stop() == 0, started.gateway.logs()[-3000:]
        a.stop()
        b.stop()
    finally:
        if started.gateway is not None:
            started.gateway.kill9()
        a.kill_all()
        b.kill_all()


def send(cluster: Cluster, queue_id: int, body: bytes, born_host: str = "",
         **properties: str) -> gateway_pb2.SendResult:
    message = common_pb2.Message(topic="ids", body=body, born_host=born_host, properties=properties)
    result: gateway_pb2.SendResult = cluster.stub.Send(gateway_pb2.SendRequest(message=message, queue_id=queue_id),
                                                       timeout=10)
    return result


def get(cluster: Cluster, msg_id: str, kind: int = Kind.MESSAGE_ID_KIND_UNSPECIFIED) -> query_pb2.ViewMessageResponse:
    response: query_pb2.ViewMessageResponse = cluster.stub.GetMessage(
        query_pb2.ViewMessageRequest(msg_id=msg_id, kind=kind), timeout=10)
    return response


def test_uniq_keys_of_ipv6_producers_are_made_and_found(cluster: Cluster) -> None:
    made = send(cluster, 5, b"v6 made", born_host="[2001:db8::5]:40000")
    given = send(cluster, 1, b"v6 given", born_host="[2001:db8::5]:40001", UNIQ_KEY=UNIQ_V6)
    assert len(made.msg_id) == 56 and decode_uniq_key(made.msg_id).ip == "2001:db8::5"
    assert given.msg_id == UNIQ_V6 and (made.shard, given.shard) == ("shard-b", "shard-a")
    for result, body in ((made, b"v6 made"), (given, b"v6 given")):
        for kind in (Kind.MESSAGE_ID_KIND_UNSPECIFIED, Kind.MESSAGE_ID_KIND_UNIQ_KEY):
            response = eventually_found(functools.partial(get, cluster, result.msg_id, kind))
            found = response.message
            assert response.found_by == Kind.MESSAGE_ID_KIND_UNIQ_KEY
            assert (found.body, found.uniq_key, found.queue_id, found.msg_id) == \
                (body, result.msg_id, result.queue_id, result.offset_msg_id)
            assert found.born_host.startswith("[2001:db8::5]:")


def test_offset_ids_of_a_host_the_store_no_longer_has_are_found_on_every_shard(cluster: Cluster) -> None:
    before = send(cluster, 6, b"before the move")  # shard-b, shard queue 2
    assert before.shard == "shard-b" and before.offset_msg_id == make_message_id(
        "127.0.0.1:10912", int(before.offset_msg_id[16:], 16))
    # shard-b's pod is rescheduled: another IP. The gateway restarts too, so it knows only the new hosts.
    old = cluster.b.commitlog
    assert old.stop() == 0, old.logs()
    cluster.b.commitlog = start_commitlog(old.store_dir, {**(cluster.b.env or {}), "MQSTORE_BROKER_IP": "127.0.0.2"},
                                          port=old.port)
    cluster.restart_gateway()
    after = send(cluster, 7, b"after the move")
    assert after.offset_msg_id[:16] == make_message_id("127.0.0.2:10912", 0)[:16]

    for result, body, host in ((before, b"before the move", "127.0.0.1:10912"),
                               (after, b"after the move", "127.0.0.2:10912")):
        for kind in (Kind.MESSAGE_ID_KIND_UNSPECIFIED, Kind.MESSAGE_ID_KIND_OFFSET):
            response = get(cluster, result.offset_msg_id, kind)
            assert response.found_by == Kind.MESSAGE_ID_KIND_OFFSET
            # The route queue id: the message is shard-b's although its store host is no shard's now.
            assert (response.message.body, response.message.store_host, response.message.queue_id) == \
                (body, host, result.queue_id)
        by_key = eventually_found(functools.partial(get, cluster, result.msg_id))
        assert (by_key.message.body, by_key.message.queue_id) == (body, result.queue_id)
    # The query service of shard-b answers for its old host too.
    direct = query_pb2_grpc.QueryServiceStub(cluster.b.query.channel).ViewMessage(
        query_pb2.ViewMessageRequest(msg_id=before.offset_msg_id), timeout=10)
    assert direct.message.body == b"before the move" and direct.message.queue_id == 2

    # An id no shard holds: every shard says what it looked up.
    absent = make_message_id("10.9.8.7:10911", 0)
    with pytest.raises(grpc.RpcError) as info:
        get(cluster, absent, Kind.MESSAGE_ID_KIND_OFFSET)
    details = str(info.value.details())
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    for shard in ("shard-a", "shard-b"):
        assert f"{shard}: no message at commitlog offset 0 of store host 10.9.8.7:10911 (offset msg id {absent})" \
            in details
