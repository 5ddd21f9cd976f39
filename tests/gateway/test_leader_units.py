"""The gateway's side of a replicated shard, in-process: which refusals may go to the next leader, and
the settings that name the replicas."""

from __future__ import annotations

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from gateway.leader import not_leader
from gateway.resilience import BackendError, backend_error
from gateway.settings import load_gateway_settings
from gateway.shard import not_appended
from services.commitlog.ha.failover import not_leader_refusal
from services.server.shard_keys import LeaderRecord, NotLeader
from services.server.status import status_trailer, store_status
from services.store.config import ConfigError

REPLICA = {"name": "replica-0", "commitlog": "127.0.0.1:1", "query": "127.0.0.1:2", "scheduler": "127.0.0.1:3",
           "indexer": "127.0.0.1:4"}


@pytest.mark.parametrize(("error", "again"), [
    (BackendError(grpc.StatusCode.UNAVAILABLE, "the commitlog ... is unavailable (failed to connect to all "
                  "addresses)", not_applied=True), True),
    # SYNC_MASTER refused after the append: the record is in the leader's log, a resend could store it twice.
    (BackendError(grpc.StatusCode.UNAVAILABLE, "SLAVE_NOT_AVAILABLE: shard broker-a ..."), False),
    (BackendError(grpc.StatusCode.UNAVAILABLE, "Socket closed"), False),
    (BackendError(grpc.StatusCode.DEADLINE_EXCEEDED, "did not answer in time"), False),
    (BackendError(grpc.StatusCode.FAILED_PRECONDITION, "topic is being deleted"), False),
    (BackendError(grpc.StatusCode.RESOURCE_EXHAUSTED, "busy", not_applied=True), False),
])
def test_only_a_write_no_replica_appended_goes_to_the_next_leader(error: BackendError, again: bool) -> None:
    assert not_appended(error) is again


def _failed_call(code: grpc.StatusCode, details: str,
                 info: error_details_pb2.ErrorInfo | None = None) -> grpc.aio.AioRpcError:
    trailer: tuple[tuple[str, str | bytes], ...] = ()
    if info is not None:
        status = status_pb2.Status(code=code.value[0], message=details)
        status.details.add().Pack(info)
        trailer = tuple(rpc_status.to_status(status).trailing_metadata)
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(*trailer), details)


NOT_LEADER = error_details_pb2.ErrorInfo(domain="mqstore.v1", reason="NOT_LEADER", metadata={
    "shard": "broker-a", "replica": "replica-1", "leader": "replica-0", "leaderAddress": "127.0.0.1:9905",
    "epoch": "3"})


@pytest.mark.parametrize(("details", "info", "again"), [
    # A follower's refusal is known by its NOT_LEADER detail, whatever its words.
    ("replica-1 takes no writes for broker-a; replica-0 leads it", NOT_LEADER, True),
    ("replica replica-1 is not the leader of shard broker-a", NOT_LEADER, True),
    # The words alone (another service, a topic named so) prove nothing was left unappended.
    ("topic 'is not the leader of shard' is being deleted", None, False),
    ("refused", error_details_pb2.ErrorInfo(domain="elsewhere", reason="NOT_LEADER"), False),
])
def test_a_follower_refusal_is_decided_by_its_detail_not_its_text(
        details: str, info: error_details_pb2.ErrorInfo | None, again: bool) -> None:
    error = backend_error("the commitlog of broker-a replica-1 (127.0.0.1:1)",
                          _failed_call(grpc.StatusCode.FAILED_PRECONDITION, details, info))
    assert not_appended(error) is again


def test_a_followers_refusal_reaches_the_gateway_naming_the_leader() -> None:
    """The commitlog's refusal through the one error path (RpcEdge's status and its trailer)."""
    refusal = not_leader_refusal("broker-a", "replica-1", "following",
                                 LeaderRecord("replica-0", "127.0.0.1:9905", 3))
    status = store_status(refusal)
    assert status is not None and status.code == grpc.StatusCode.FAILED_PRECONDITION
    call = grpc.aio.AioRpcError(status.code, grpc.aio.Metadata(), grpc.aio.Metadata(
        *status_trailer(status.code, status.details, status.refused, status.reason)), status.details)
    error = backend_error("the commitlog of broker-a replica-1 (127.0.0.1:1)", call)
    assert not_leader(error) == NotLeader("broker-a", "replica-1", "replica-0", "127.0.0.1:9905", 3)
    assert not_appended(error)


def test_replicas_are_read_from_the_shard_settings() -> None:
    settings = load_gateway_settings(None, shards=[{"commitlog": "127.0.0.1:1", "query": "127.0.0.1:2",
                                                    "etcd": "127.0.0.1:5", "broker_name": "broker-a",
                                                    "replicas": [REPLICA]}])
    shard = settings.shards[0]
    assert (shard.etcd, shard.broker_name, [r.name for r in shard.replicas]) == ("127.0.0.1:5", "broker-a",
                                                                                 ["replica-0"])


@pytest.mark.parametrize(("extra", "message"), [
    ({"replicas": [REPLICA]}, "replicas need etcd"),
    ({"etcd": "127.0.0.1:5", "broker_name": "b", "replicas": [REPLICA, REPLICA]}, "replica names must be unique"),
    ({"etcd": "127.0.0.1:5", "broker_name": "b", "replicas": [{"name": "r"}]}, "replicas[0]: expected a mapping"),
])
def test_bad_replica_settings_say_what_to_fix(extra: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_gateway_settings(None, shards=[{"commitlog": "127.0.0.1:1", "query": "127.0.0.1:2", **extra}])
