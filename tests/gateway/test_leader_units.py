"""The gateway's side of a replicated shard, in-process: which refusals may go to the next leader, and
the settings that name the replicas."""

from __future__ import annotations

import grpc
import pytest

from gateway.resilience import BackendError
from gateway.settings import load_gateway_settings
from gateway.shard import not_appended
from services.store.config import ConfigError

REPLICA = {"name": "replica-0", "commitlog": "127.0.0.1:1", "query": "127.0.0.1:2", "scheduler": "127.0.0.1:3",
           "indexer": "127.0.0.1:4"}


@pytest.mark.parametrize(("error", "again"), [
    (BackendError(grpc.StatusCode.FAILED_PRECONDITION, "replica replica-1 is not the leader of shard broker-a "
                  "(replica replica-0 at 127.0.0.1:9905 leads epoch 1): send to the leader etcd names"), True),
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
