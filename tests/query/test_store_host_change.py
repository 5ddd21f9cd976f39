"""A store whose host changes keeps answering the offset msg ids of its old hosts (real processes).

In Kubernetes a rescheduled broker pod gets another IP, so its ``brokerIP`` (MQSTORE_BROKER_IP) and the
store host of every new record change while the commitlog keeps the records of the old host. An
offset msg id names the host that wrote its record: the query service must match the record's own
STOREHOST, not the host the commitlog has now. Here the commitlog restarts twice on the same files:
127.0.0.1, then 127.0.0.2, then ::1 (an IPv6 store host, so 56-digit offset ids).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from mqstore.v1 import commitlog_pb2, query_pb2
from services.store.formats.message_id import decode_message_id, make_message_id
from tests.commitlog.commitlog_process import start_commitlog
from tests.query.query_process import System, message, running_system

Kind = query_pb2.MessageIdKind


def restart_commitlog(system: System, broker_ip: str) -> None:
    old = system.commitlog
    assert old.stop() == 0, old.logs()
    system.commitlog = start_commitlog(old.store_dir, {**(system.env or {}), "MQSTORE_BROKER_IP": broker_ip},
                                       port=old.port)


@pytest.fixture
def system(tmp_path: Path) -> Iterator[System]:
    with running_system(tmp_path, {"MQSTORE_BROKER_IP": "127.0.0.1", "MQSTORE_LISTEN_PORT": "10911"}) as started:
        yield started


def view(system: System, msg_id: str, kind: int = Kind.MESSAGE_ID_KIND_UNSPECIFIED) -> query_pb2.StoredMessage:
    response = system.query.stub.ViewMessage(query_pb2.ViewMessageRequest(msg_id=msg_id, kind=kind), timeout=10)
    assert response.found_by == (Kind.MESSAGE_ID_KIND_UNIQ_KEY if kind == Kind.MESSAGE_ID_KIND_UNIQ_KEY
                                 else Kind.MESSAGE_ID_KIND_OFFSET)
    message_: query_pb2.StoredMessage = response.message
    return message_


def test_offset_ids_of_every_host_the_commitlog_had_are_found(system: System) -> None:
    sent: list[tuple[commitlog_pb2.AppendResult, str]] = []
    for i, broker_ip in enumerate(["127.0.0.1", "127.0.0.2", "::1"]):
        if i:
            restart_commitlog(system, broker_ip)
        info = system.commitlog.stub.GetStoreInfo(commitlog_pb2.GetStoreInfoRequest(), timeout=5)
        [result] = system.append([message("HostMoves", 0, f"body {i}".encode(), UNIQ_KEY=f"{i + 1:032X}")])
        sent.append((result, info.store_host))
    assert [host for _, host in sent] == ["127.0.0.1:10911", "127.0.0.2:10911", "[::1]:10911"]
    assert [len(r.msg_id) for r, _ in sent] == [32, 32, 56]
    for i, (result, host) in enumerate(sent):
        assert decode_message_id(result.msg_id) == (host, result.commitlog_offset)
        for kind in (Kind.MESSAGE_ID_KIND_UNSPECIFIED, Kind.MESSAGE_ID_KIND_OFFSET):
            found = view(system, result.msg_id, kind)
            assert (found.body, found.store_host, found.msg_id) == (f"body {i}".encode(), host, result.msg_id)
        assert view(system, f"{i + 1:032X}", Kind.MESSAGE_ID_KIND_UNIQ_KEY).msg_id == result.msg_id

    # An id naming another host than the record's is not that record, and the answer says what was asked.
    first, _ = sent[0]
    wrong = make_message_id("127.0.0.2:10911", first.commitlog_offset)
    with pytest.raises(grpc.RpcError) as info:
        view(system, wrong, Kind.MESSAGE_ID_KIND_OFFSET)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    assert info.value.details() == (
        f"no message at commitlog offset {first.commitlog_offset} of store host 127.0.0.2:10911 (offset msg id "
        f"{wrong}): the record there was stored by 127.0.0.1:10911")
