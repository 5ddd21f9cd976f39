"""Replicas under etcd leadership, in-process against a real etcd.

The lease fence on every answer of a leader: a put that does not wait for the store (``WAIT=false``,
4.9.8's waitStoreMsgOK) is answered without the flush or the followers, but never by a leader whose
lease may have lapsed. Readiness: the leader, and a follower once etcd lists it in the in-sync set."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from services.commitlog.ha.failover import EtcdReplication
from services.commitlog.ha.leadership import NotLeaderError
from services.commitlog.message_store import MessageStore
from services.store.config import load_config
from services.store.formats.message import PROPERTY_WAIT_STORE_MSG_OK, Message
from tests.commitlog.commitlog_process import free_port
from tests.commitlog.etcd_process import running_etcd

LEAD_TIMEOUT_S = 10.0


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running_etcd(tmp_path_factory.mktemp("etcd") / "data") as endpoint:
        yield endpoint


@contextmanager
def _replica(root: Path, etcd: str, shard: str, name: str) -> Iterator[tuple[MessageStore, EtcdReplication]]:
    engine = MessageStore(load_config(environ={}, mapped_file_size_commit_log=64 * 1024, etcd_endpoint=etcd,
                                      ha_listen_port=free_port(), broker_ip="127.0.0.1", broker_name=shard,
                                      ha_replica_name=name, ha_lease_ttl_seconds=2,
                                      ha_send_heartbeat_interval=200), root)
    engine.start()
    replication = EtcdReplication(engine.commit_log, None)
    replication.start()
    try:
        yield engine, replication
    finally:
        replication.stop()
        engine.shutdown()


def _wait(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + LEAD_TIMEOUT_S
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


@pytest.fixture
def leader(tmp_path: Path, etcd: str) -> Iterator[tuple[MessageStore, EtcdReplication]]:
    with _replica(tmp_path, etcd, "fence-shard", "replica-0") as (engine, replication):
        # it campaigns on the shard nobody leads
        _wait(lambda: engine.commit_log.write_refusal is None, "the only replica did not take its shard")
        yield engine, replication


def _message(wait: bool) -> Message:
    return Message("T", 0, b"x", properties={PROPERTY_WAIT_STORE_MSG_OK: str(wait).lower()})


def test_a_leader_whose_lease_lapsed_answers_no_put_not_even_one_that_does_not_wait(
        leader: tuple[MessageStore, EtcdReplication]) -> None:
    engine, replication = leader
    engine.put_message(_message(wait=False))
    engine.put_message(_message(wait=True))
    # As if the leader had been paused past its lease: its keeper renews no more and has not noticed
    # yet, so writes are still taken, and no answer may say the message is stored.
    leadership = replication.leadership
    leadership._stopped.set()
    assert leadership._keeper is not None
    leadership._keeper.join(5)
    leadership._valid_until = 0.0
    for wait in (False, True):
        with pytest.raises(NotLeaderError, match="was not renewed in time"):
            engine.put_message(_message(wait))


def test_a_replica_is_ready_as_the_leader_or_an_in_sync_follower(tmp_path: Path, etcd: str) -> None:
    with _replica(tmp_path / "a", etcd, "ready-shard", "replica-a") as (leader, a):
        _wait(a.ready, "the first replica did not lead and become ready")
        for _ in range(20):
            leader.put_message(_message(wait=True))
        with _replica(tmp_path / "b", etcd, "ready-shard", "replica-b") as (follower, b):
            assert not b.ready()  # it holds nothing yet: not in the in-sync set
            _wait(lambda: follower.max_offset == leader.max_offset, "the follower did not catch up")
            _wait(b.ready, "the caught-up follower did not become ready (in the in-sync set)")
            assert a.ready() and not b.leadership.is_leader()
