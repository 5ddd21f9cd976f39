"""``mqstore export-rocketmq-store``: a store written by the real services (``mqstore up``, small geometry,
stopped cleanly) becomes one RocketMQ 4.9.8 store directory.

Checked: the one checkpoint merges the commitlog's and the indexer's exactly; every data file is
byte-identical to its source (full files hard-linked, the newest of each directory copied); the
config files have RocketMQ's JSON shapes; mqstore's offline tools read DEST as a RocketMQ-layout
store; SRC is left exactly as it was; and every refusal is one line and a non-zero exit.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from mqstore.v1 import commitlog_pb2, common_pb2, query_pb2
from services.store.tools.rocketmq_layout_export import (
    ExportError,
    Progress,
    SourceStore,
    _copy_file,
    export_rocketmq_store,
)
from tests.commitlog.commitlog_process import run_mqstore, start_commitlog, stop_cleanly
from tests.conftest import StoreFactory
from tests.gateway.system_process import UpProcess, start_up

KIB = 1024
#: Small files: 64 KiB commitlog files, 40-unit ConsumeQueue files, index files of 40 slots / 160 entries.
GEOMETRY = {
    "MQSTORE_MAPPED_FILE_SIZE_COMMIT_LOG": str(64 * KIB),
    "MQSTORE_MAPPED_FILE_SIZE_CONSUME_QUEUE": str(40 * 20),
    "MQSTORE_MAX_HASH_SLOT_NUM": "40",
    "MQSTORE_MAX_INDEX_NUM": "160",
}
CHECKPOINT = struct.Struct(">qqq")
ORDERS_MESSAGES = 300  # 2 queues of 150 units: 4 ConsumeQueue files each
EVENTS_MESSAGES = 24  # default 8 queues
DELAY_LEVELS = (16, 18)  # 30 min and 2 h: never due while the test runs, however slow the machine
COMMITTED = {"orders@billing": {"0": 60, "1": 41}, "events@audit": {"2": 3}}


@dataclass(frozen=True)
class StoppedStore:
    root: Path
    last_key: str


def _message(topic: str, queue_id: int, body: bytes, properties: dict[str, str]) -> common_pb2.Message:
    return common_pb2.Message(topic=topic, queue_id=queue_id, body=body, properties=properties)


def _wait_indexed(up: UpProcess, topic: str, key: str) -> None:
    """The indexer dispatches in commitlog order: once the last message is indexed, all are."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            found = up.stub.QueryByKey(query_pb2.QueryMessageRequest(topic=topic, key=key), timeout=5)
        except grpc.RpcError:
            found = None
        if found is not None and found.messages:
            return
        time.sleep(0.05)
    raise TimeoutError(f"the indexer did not index {key} in 30 s:\n{up.logs()[-3000:]}")


@pytest.fixture(scope="module")
def stopped_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StoppedStore]:
    """Messages in two topics (with delayed ones) and two groups' offsets, by the real services; then a
    clean stop (Ctrl-C). The messages are appended by the commitlog service alone, then ``mqstore up``
    indexes them from its history and takes the consumer offsets."""
    root = tmp_path_factory.mktemp("export-src") / "store"
    commitlog = start_commitlog(root, GEOMETRY)
    try:
        commitlog.stub.CreateTopic(commitlog_pb2.TopicRequest(topic=common_pb2.TopicConfig(
            topic="orders", read_queue_nums=2, write_queue_nums=2, perm=6)), timeout=10)
        batch = [_message("orders", 0, b"later", {"DELAY": str(level), "KEYS": f"delayed-{level}"})
                 for level in DELAY_LEVELS]
        batch += [_message("events", i % 8, b"e" * (1 + i * 37 % 300), {"KEYS": f"event-{i}", "TAGS": "E"})
                  for i in range(EVENTS_MESSAGES)]
        batch += [_message("orders", i % 2, b"o" * (1 + i * 53 % 900), {"KEYS": f"order-{i}", "TAGS": f"T{i % 3}"})
                  for i in range(ORDERS_MESSAGES)]
        for start in range(0, len(batch), 16):
            commitlog.stub.AppendBatch(commitlog_pb2.AppendBatchRequest(messages=batch[start:start + 16]), timeout=10)
    finally:
        stop_cleanly(commitlog)
    up = start_up(root, env_overrides=GEOMETRY)
    try:
        last_key = f"order-{ORDERS_MESSAGES - 1}"
        _wait_indexed(up, "orders", last_key)
        for key, queues in COMMITTED.items():
            topic, group = key.split("@")
            for queue, offset in queues.items():
                up.stub.CommitOffset(query_pb2.UpdateConsumerOffsetRequest(
                    consumer_group=group, topic=topic, queue_id=int(queue), offset=offset), timeout=10)
        assert up.stop() == 0, up.logs()[-5000:]
    finally:
        up.kill_all()
    assert not [p for p in root.rglob("abort")], "a clean stop leaves no abort file"
    yield StoppedStore(root, last_key)


def _snapshot(root: Path) -> dict[str, tuple[int, int, str]]:
    """Every file under ``root``: size, mtime and content digest (SRC must not change at all)."""
    found = {}
    for path in sorted(root.rglob("*")):
        if path.is_file():
            stat = path.stat()
            found[str(path.relative_to(root))] = (stat.st_size, stat.st_mtime_ns,
                                                  hashlib.sha256(path.read_bytes()).hexdigest())
    return found


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def _export(src: Path, dest: Path, *extra: str) -> tuple[int, str, str]:
    done = run_mqstore("export-rocketmq-store", src, dest, *extra)
    return done.returncode, done.stdout.decode(), done.stderr.decode()


@pytest.fixture(scope="module")
def exported(stopped_store: StoppedStore, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    src = stopped_store.root
    before = _snapshot(src)
    dest = tmp_path_factory.mktemp("export-dest") / "rocketmq-store"
    code, out, err = _export(src, dest, "--progress-interval", "0")
    assert code == 0, err
    assert _snapshot(src) == before, "the export changed SRC"
    yield dest, out + err


def test_checkpoint_merges_the_commitlog_and_the_indexer(stopped_store: StoppedStore,
                                                         exported: tuple[Path, str]) -> None:
    dest, _ = exported
    physic, logics_0, index_0 = CHECKPOINT.unpack_from((stopped_store.root / "checkpoint").read_bytes())
    physic_0, logics, index = CHECKPOINT.unpack_from((stopped_store.root / "indexer" / "checkpoint").read_bytes())
    # The defect: each service's checkpoint holds only its own times, so neither alone is RocketMQ's.
    assert (logics_0, index_0, physic_0) == (0, 0, 0)
    assert physic > 0 and logics > 0 and index > 0
    data = (dest / "checkpoint").read_bytes()
    assert data == CHECKPOINT.pack(physic, logics, index) + bytes(4096 - CHECKPOINT.size)


def test_data_files_are_the_sources_byte_for_byte(stopped_store: StoppedStore, exported: tuple[Path, str]) -> None:
    src, (dest, _) = stopped_store.root, exported
    pairs = {"commitlog": src / "commitlog", "consumequeue": src / "indexer" / "consumequeue",
             "index": src / "indexer" / "index"}
    for name, source in pairs.items():
        assert _files(dest / name) == _files(source), name
        for rel in _files(source):
            assert (dest / name / rel).read_bytes() == (source / rel).read_bytes(), f"{name}/{rel}"
            # RocketMQ's time lookups and file expiry read mtimes: a copy keeps them.
            assert (dest / name / rel).stat().st_mtime_ns == (source / rel).stat().st_mtime_ns
    # Small geometry: the commitlog, every "orders" queue and the index have rolled to several files.
    assert len(_files(dest / "commitlog")) >= 3 and len(_files(dest / "index")) >= 2
    for queue in ("0", "1"):
        assert len(_files(dest / "consumequeue" / "orders" / queue)) >= 3
    assert sorted(p.name for p in dest.iterdir()) == ["checkpoint", "commitlog", "config", "consumequeue", "index"]


def test_full_files_are_hard_linked_and_the_newest_of_each_directory_copied(stopped_store: StoppedStore,
                                                                           exported: tuple[Path, str]) -> None:
    """Both stores write only into the newest file of a directory: sharing it would make each write into
    the other."""
    src, (dest, _) = stopped_store.root, exported
    for name, source in (("commitlog", src / "commitlog"),
                         ("consumequeue/orders/0", src / "indexer" / "consumequeue" / "orders" / "0"),
                         ("index", src / "indexer" / "index")):
        names = _files(source)
        shared = [n for n in names if os.path.samefile(source / n, dest / name / n)]
        assert shared == names[:-1], name


def test_config_files_have_rocketmq_shapes(exported: tuple[Path, str]) -> None:
    dest, _ = exported
    topics = json.loads((dest / "config" / "topics.json").read_text())
    assert set(topics) == {"topicConfigTable", "dataVersion"}
    assert set(topics["dataVersion"]) == {"counter", "timestamp"}
    assert topics["dataVersion"]["timestamp"] > 0
    table = topics["topicConfigTable"]
    assert "SCHEDULE_TOPIC_XXXX" not in table  # RocketMQ declares it itself (18 queues)
    assert table["orders"] == {"order": False, "perm": 6, "readQueueNums": 2, "topicFilterType": "SINGLE_TAG",
                               "topicName": "orders", "topicSysFlag": 0, "writeQueueNums": 2}
    assert table["events"]["readQueueNums"] == table["events"]["writeQueueNums"] == 8
    assert json.loads((dest / "config" / "consumerOffset.json").read_text()) == {"offsetTable": COMMITTED}
    # Delayed messages wait in SCHEDULE_TOPIC_XXXX queue level-1; mqstore delivered none of them.
    assert json.loads((dest / "config" / "delayOffset.json").read_text()) == \
        {"offsetTable": {str(level): 0 for level in DELAY_LEVELS}}
    assert sorted(p.name for p in (dest / "consumequeue" / "SCHEDULE_TOPIC_XXXX").iterdir()) == \
        [str(level - 1) for level in DELAY_LEVELS]


def test_progress_on_stderr_and_a_summary(exported: tuple[Path, str]) -> None:
    dest, output = exported
    files = len(_files(dest / "commitlog")) + len(_files(dest / "consumequeue")) + len(_files(dest / "index"))
    assert f"export: 1/{files} files" in output and f"export: {files}/{files} files" in output
    assert f"exported to {dest}: " in output
    assert (f"storePathRootDir={dest} mappedFileSizeCommitLog={64 * KIB} mappedFileSizeConsumeQueue=800 "
            "maxHashSlotNum=40 maxIndexNum=160") in output


def test_mqstore_inspect_reads_dest_as_a_rocketmq_store(stopped_store: StoppedStore,
                                                       exported: tuple[Path, str]) -> None:
    src, (dest, _) = stopped_store.root, exported
    for kind, exported_path, source_path in (("commitlog", dest / "commitlog", src / "commitlog"),
                                             ("consumequeue", dest / "consumequeue", src / "indexer" / "consumequeue")):
        from_dest = run_mqstore("inspect", kind, exported_path, "--json")
        assert from_dest.returncode == 0, from_dest.stderr
        assert from_dest.stdout == run_mqstore("inspect", kind, source_path, "--json").stdout
        rows = [json.loads(line) for line in from_dest.stdout.splitlines()]
        assert sum(row["type"] in ("msg", "cq") for row in rows) >= ORDERS_MESSAGES + EVENTS_MESSAGES
    for name in _files(dest / "index"):
        from_dest = run_mqstore("inspect", "index", dest / "index" / name, "--json")
        assert from_dest.returncode == 0, from_dest.stderr
        assert from_dest.stdout == run_mqstore("inspect", "index", src / "indexer" / "index" / name, "--json").stdout
    # The unit of the last message points at its record in DEST's commitlog.
    units = [json.loads(line) for line in run_mqstore("inspect", "consumequeue", dest / "consumequeue" / "orders",
                                                      "--json").stdout.splitlines()]
    records = {row["commit_log_offset"]: row for row in map(json.loads, run_mqstore(
        "inspect", "commitlog", dest / "commitlog", "--json").stdout.splitlines()) if row["type"] == "msg"}
    last = max(units, key=lambda unit: unit["phy_offset"])
    assert records[last["phy_offset"]]["properties"]["KEYS"] == stopped_store.last_key


def test_copy_and_another_filesystem_share_no_file(stopped_store: StoppedStore, tmp_path: Path) -> None:
    code, _, err = _export(stopped_store.root, tmp_path / "copied", "--copy")
    assert code == 0, err
    assert not any(os.path.samefile(stopped_store.root / "commitlog" / n, tmp_path / "copied" / "commitlog" / n)
                   for n in _files(stopped_store.root / "commitlog"))
    shm = Path("/dev/shm")
    if not shm.is_dir() or shm.stat().st_dev == stopped_store.root.stat().st_dev:
        return
    other = shm / f"mqstore-export-test-{os.getpid()}"
    try:
        code, out, err = _export(stopped_store.root, other)
        assert code == 0, err
        assert "0 hard-linked" in out
        for rel in _files(stopped_store.root / "commitlog"):
            assert (other / "commitlog" / rel).read_bytes() == (stopped_store.root / "commitlog" / rel).read_bytes()
    finally:
        shutil.rmtree(other, ignore_errors=True)


# -- refusals: one line on stderr, exit 1, nothing written -------------------------------------
def _refused(src: Path, dest: Path, expected: str) -> None:
    code, out, err = _export(src, dest)
    assert code == 1 and out == ""
    assert len(err.strip().splitlines()) == 1 and expected in err, err
    assert err.startswith("mqstore export-rocketmq-store: ")


def test_refuses_what_is_not_an_mqstore_store(tmp_path: Path, pristine_store: StoreFactory) -> None:
    (tmp_path / "empty").mkdir()
    _refused(tmp_path / "empty", tmp_path / "d1", "is not an mqstore store")
    _refused(tmp_path / "missing", tmp_path / "d2", "no such directory")
    _refused(pristine_store("normal-raw"), tmp_path / "d3", "already in RocketMQ's layout")
    assert not any((tmp_path / name).exists() for name in ("d1", "d2", "d3"))


def test_refuses_a_dest_that_is_not_empty(stopped_store: StoppedStore, tmp_path: Path) -> None:
    dest = tmp_path / "busy"
    dest.mkdir()
    (dest / "keep.txt").write_text("mine")
    _refused(stopped_store.root, dest, "is not empty")
    assert _files(dest) == ["keep.txt"]
    _refused(stopped_store.root, stopped_store.root / "inside", "is inside the store")
    assert not (stopped_store.root / "inside").exists()


def test_refuses_a_store_that_did_not_stop_cleanly(stopped_store: StoppedStore, tmp_path: Path) -> None:
    src = tmp_path / "store"
    shutil.copytree(stopped_store.root, src)
    (src / "indexer" / "abort").touch()
    _refused(src, tmp_path / "dest", "did not stop cleanly")
    assert not (tmp_path / "dest").exists()


def test_refuses_a_store_whose_service_is_running(stopped_store: StoppedStore, tmp_path: Path) -> None:
    src = tmp_path / "store"
    shutil.copytree(stopped_store.root, src)
    service = start_commitlog(src, GEOMETRY)
    try:
        _refused(src, tmp_path / "dest", f"its commitlog service is running ({{\"pid\": {service.pid}")
        assert not (tmp_path / "dest").exists()
    finally:
        stop_cleanly(service)
    code, _, err = _export(src, tmp_path / "dest")
    assert code == 0, err


def test_an_interrupted_export_leaves_nothing(stopped_store: StoppedStore, tmp_path: Path) -> None:
    """Ctrl-C (or any failure) in the middle removes what was written: DEST is never half a store."""
    def interrupt(state: Progress) -> None:
        if state.files_done >= 2:
            raise KeyboardInterrupt

    for dest, existed in ((tmp_path / "new", False), (tmp_path / "empty", True)):
        if existed:
            dest.mkdir()
        with pytest.raises(KeyboardInterrupt):
            export_rocketmq_store(SourceStore.at(stopped_store.root), dest, progress=interrupt,
                                  progress_interval_s=0)
        assert dest.exists() == existed and (not existed or not any(dest.iterdir()))
    with pytest.raises(ExportError, match="not empty"):
        (tmp_path / "empty" / "x").touch()
        export_rocketmq_store(SourceStore.at(stopped_store.root), tmp_path / "empty")


def test_delay_offsets_carry_what_the_scheduler_delivered(tmp_path: Path) -> None:
    """The broker's ScheduleMessageService resumes each level at the scheduler's delivered count: what
    mqstore delivered is not delivered again; a level it never delivered from starts at 0."""
    from services.store.formats.delay_offsets_file import write_delay_offsets
    from services.store.tools.rocketmq_layout_export import _write_delay_offsets

    dest = tmp_path / "dest"
    for queue in ("0", "2"):  # levels 1 and 3
        (dest / "consumequeue" / "SCHEDULE_TOPIC_XXXX" / queue).mkdir(parents=True)
    (dest / "config").mkdir()
    delivered = tmp_path / "scheduler" / "config" / "delayOffset.json"
    delivered.parent.mkdir(parents=True)
    write_delay_offsets(delivered, {1: 5})
    assert _write_delay_offsets(dest, delivered) == 2
    assert json.loads((dest / "config" / "delayOffset.json").read_text()) == {"offsetTable": {"1": 5, "3": 0}}


def test_a_copied_file_takes_the_disk_its_data_takes(tmp_path: Path) -> None:
    """Store files are sparse (and an older store's files were allocated whole, its unwritten rest
    zeros): a copy writes the data and leaves the rest a hole, byte for byte the same file."""
    source = tmp_path / "00000000000000000000"
    size, data = 64 * 1024 * KIB, os.urandom(300 * KIB)
    with open(source, "wb") as file:
        file.truncate(size)
        os.posix_fallocate(file.fileno(), 32 * 1024 * KIB, 8 * 1024 * KIB)  # allocated, never written
        file.seek(4 * KIB)
        file.write(data)
        file.seek(48 * 1024 * KIB)
        file.write(bytes(2 * 1024 * KIB))  # zeros written out
        file.seek(size - KIB)
        file.write(data[:KIB])
    advanced: list[int] = []
    _copy_file(source, tmp_path / "copy", advanced.append)
    copy = tmp_path / "copy"
    assert copy.stat().st_size == size and sum(advanced) == size
    assert copy.stat().st_blocks * 512 <= len(data) + 16 * KIB, copy.stat().st_blocks * 512
    with open(source, "rb") as a, open(copy, "rb") as b:
        while chunk := a.read(8 * 1024 * KIB):
            assert chunk == b.read(len(chunk))
    assert copy.stat().st_mtime_ns == source.stat().st_mtime_ns
