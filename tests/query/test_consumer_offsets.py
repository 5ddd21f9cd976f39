"""Consumer offsets survive a clean restart and a kill -9 (after a persist interval), are kept in
RocketMQ's consumerOffset.json shape with a .bak, and a second process cannot take the store."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from mqstore.v1 import query_pb2
from services.store.formats.consumer_offsets_file import read_offset_table
from tests.commitlog.commitlog_process import free_port, spawn_service
from tests.query.query_process import PERSIST_INTERVAL_MS, System, message, running_system, wait_until


@pytest.fixture
def fresh(tmp_path: Path) -> Iterator[System]:
    """A system whose queues hold the messages the tests commit offsets for (a commit past a queue's
    max offset is refused)."""
    with running_system(tmp_path) as started:
        for topic, queue_id, count in (("TopicA", 0, 100), ("TopicA", 3, 7), ("TopicB", 1, 12)):
            started.append([message(topic, queue_id, f"{i}".encode()) for i in range(count)])
        started.wait_dispatched()
        yield started


def commit(system: System, group: str, topic: str, queue_id: int, offset: int) -> None:
    system.query.stub.UpdateConsumerOffset(query_pb2.UpdateConsumerOffsetRequest(
        consumer_group=group, topic=topic, queue_id=queue_id, offset=offset), timeout=5)


def committed(system: System, group: str, topic: str, queue_id: int) -> int:
    response = system.query.stub.QueryConsumerOffset(query_pb2.QueryConsumerOffsetRequest(
        consumer_group=group, topic=topic, queue_id=queue_id), timeout=5)
    return int(response.offset)


def offsets_file(system: System) -> Path:
    return system.query.store_dir / "config" / "consumerOffset.json"


def table_on_disk(path: Path) -> dict[str, dict[str, int]]:
    try:
        return dict(json.loads(path.read_text())["offsetTable"])
    except (OSError, ValueError):
        return {}


def test_offsets_survive_clean_restart_and_kill9(fresh: System) -> None:
    with pytest.raises(grpc.RpcError) as info:
        committed(fresh, "g1", "TopicA", 0)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND and "g1" in str(info.value.details())

    commit(fresh, "g1", "TopicA", 0, 42)
    commit(fresh, "g1", "TopicA", 3, 7)
    commit(fresh, "g2", "TopicA", 0, 5)
    commit(fresh, "g1", "TopicA", 0, 43)
    assert committed(fresh, "g1", "TopicA", 0) == 43

    fresh.restart_query()  # a clean stop writes the table
    assert table_on_disk(offsets_file(fresh)) == {"TopicA@g1": {"0": 43, "3": 7}, "TopicA@g2": {"0": 5}}
    assert (committed(fresh, "g1", "TopicA", 0), committed(fresh, "g1", "TopicA", 3),
            committed(fresh, "g2", "TopicA", 0)) == (43, 7, 5)

    commit(fresh, "g1", "TopicA", 0, 100)
    # Within a persist interval the commit is on disk (appended to the file's journal, the file itself
    # left as the clean stop wrote it); a kill -9 after that loses nothing.
    wait_until(lambda: read_offset_table(offsets_file(fresh)).get("TopicA@g1", {}).get(0) == 100,
               timeout_s=10 * PERSIST_INTERVAL_MS / 1000)
    assert table_on_disk(offsets_file(fresh))["TopicA@g1"]["0"] == 43
    fresh.restart_query(kill=True)
    assert committed(fresh, "g1", "TopicA", 0) == 100
    assert committed(fresh, "g2", "TopicA", 0) == 5


def test_a_commit_past_the_max_offset_is_refused(fresh: System) -> None:
    for offset in (101, 2**63 - 1):
        with pytest.raises(grpc.RpcError) as info:
            commit(fresh, "g1", "TopicA", 0, offset)
        assert info.value.code() == grpc.StatusCode.OUT_OF_RANGE
        assert "past the max offset 100 of TopicA/0" in str(info.value.details())
    commit(fresh, "g1", "TopicA", 0, 100)  # the max offset itself: everything consumed
    assert committed(fresh, "g1", "TopicA", 0) == 100


def test_a_damaged_file_falls_back_to_its_backup(fresh: System) -> None:
    commit(fresh, "g", "TopicB", 1, 11)
    fresh.restart_query()
    commit(fresh, "g", "TopicB", 1, 12)
    fresh.query.stop()
    path = offsets_file(fresh)
    assert table_on_disk(path)["TopicB@g"]["1"] == 12
    path.write_text('{"offsetTable": {"TopicB@g": {"1": ')  # torn by hand
    fresh.restart_query()
    assert committed(fresh, "g", "TopicB", 1) == 11


def test_unreadable_file_and_backup_refuse_to_start(fresh: System, tmp_path: Path) -> None:
    store = tmp_path / "broken-query"
    (store / "config").mkdir(parents=True)
    (store / "config" / "consumerOffset.json").write_text("not json")
    (store / "config" / "consumerOffset.json.bak").write_text("[]")
    code = _run_to_exit(fresh, store, tmp_path / "broken.log")
    assert code == 4


def test_a_second_process_cannot_take_the_store(fresh: System, tmp_path: Path) -> None:
    code = _run_to_exit(fresh, fresh.query.store_dir, tmp_path / "second.log")
    assert code == 3
    assert "locked" in (tmp_path / "second.log").read_text()


def _run_to_exit(system: System, store: Path, log_path: Path) -> int:
    args = ["serve", "query", "--store", str(store), "--listen", f"127.0.0.1:{free_port()}",
            "--commitlog", system.commitlog.address, "--indexer", system.indexer.address]
    proc = spawn_service(args, None, log_path)
    try:
        return proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise
