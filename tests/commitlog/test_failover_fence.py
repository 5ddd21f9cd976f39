"""The lease fence on every answer of a leader under etcd leadership, in-process against a real etcd:
a put that does not wait for the store (``WAIT=false``, 4.9.8's waitStoreMsgOK) is answered without the
flush or the followers, but never by a leader whose lease may have lapsed."""

from __future__ import annotations

import time
from collections.abc import Iterator
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


@pytest.fixture
def leader(tmp_path: Path, etcd: str) -> Iterator[tuple[MessageStore, EtcdReplication]]:
    engine = MessageStore(load_config(environ={}, mapped_file_size_commit_log=64 * 1024, etcd_endpoint=etcd,
                                      ha_listen_port=free_port(), broker_name="fence-shard",
                                      ha_replica_name="replica-0", ha_lease_ttl_seconds=2), tmp_path)
    engine.start()
    replication = EtcdReplication(engine.commit_log, None)
    replication.start()
    try:
        deadline = time.monotonic() + LEAD_TIMEOUT_S
        while engine.commit_log.write_refusal is not None:  # it campaigns on the shard nobody leads
            assert time.monotonic() < deadline, "the only replica did not take its shard"
            time.sleep(0.05)
        yield engine, replication
    finally:
        replication.stop()
        engine.shutdown()


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
