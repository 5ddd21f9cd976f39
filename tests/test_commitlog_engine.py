"""The CommitLog engine in-process: put path rules, file rolls, flush modes, the transient store pool."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from services.commitlog.message_store import MessageStore
from services.commitlog.put_result import PutMessageError, PutMessageStatus
from services.store.config import load_config
from services.store.errors import (
    AlreadyExistsError,
    InvalidArgumentError,
    NotFoundError,
    ResourceExhaustedError,
)
from services.store.formats.message import SCHEDULE_TOPIC, TRANSACTION_PREPARED_TYPE, Message
from services.store.formats.message_id import decode_message_id
from services.store.formats.record import BLANK_MAGIC_CODE, decode_record, read_size_and_magic
from services.store.rules.topics import TopicConfig
from tests.geometry import SMALL, GeometryPreset, geometry_id


def make_log(root: Path, **overrides: Any) -> MessageStore:
    settings: dict[str, Any] = {"mapped_file_size_commit_log": 64 * 1024, "max_message_size": 16 * 1024}
    settings.update(overrides)
    log = MessageStore(load_config(environ={}, **settings), root)
    log.start()
    return log


@pytest.fixture
def log(store_geometry: GeometryPreset, tmp_path: Path) -> Iterator[MessageStore]:
    commit_log = make_log(tmp_path, mapped_file_size_commit_log=store_geometry.commitlog_file_size)
    yield commit_log
    commit_log.shutdown()


def snapshot(log: MessageStore) -> tuple[int, dict[tuple[str, int], int], list[TopicConfig]]:
    return log.max_offset, dict(log.commit_log.queue_table), log.topics.list()


@pytest.mark.parametrize(("message", "status", "match"), [
    (Message("", 0, b"x"), PutMessageStatus.MESSAGE_ILLEGAL, "topic is empty"),
    (Message("T" * 128, 0, b"x"), PutMessageStatus.MESSAGE_ILLEGAL, "longer than 127"),
    (Message("bad topic", 0, b"x"), PutMessageStatus.MESSAGE_ILLEGAL, "illegal characters"),
    (Message("TopicX", 8, b"x"), PutMessageStatus.MESSAGE_ILLEGAL, "queue id 8 is out of range"),
    (Message("TopicX", -1, b"x"), PutMessageStatus.MESSAGE_ILLEGAL, "queue id"),
    (Message("TopicX", 0, b"x" * 20000), PutMessageStatus.MESSAGE_ILLEGAL, "more than the limit"),
    (Message("TopicX", 0, b"x", properties={"k": "v" * 40000}), PutMessageStatus.PROPERTIES_SIZE_EXCEEDED,
     "more than 32767"),
    (Message("TopicX", 0, b"x", properties={"k\x01": "v"}), PutMessageStatus.MESSAGE_ILLEGAL, "x01"),
    (Message("TopicX", 0, b"x", properties={"k": "v\x02w"}), PutMessageStatus.MESSAGE_ILLEGAL, "x01"),
    (Message("TopicX", 0, b"x", properties={"DELAY": "soon"}), PutMessageStatus.MESSAGE_ILLEGAL, "not an integer"),
    (Message("TopicX", 0, b"x", born_host="nowhere"), PutMessageStatus.MESSAGE_ILLEGAL, "ip:port"),
    (Message("TopicX", 0, b"x", flag=2**31), PutMessageStatus.MESSAGE_ILLEGAL, "32-bit"),
])
def test_bad_messages_are_refused_and_change_nothing(log: MessageStore, message: Message,
                                                    status: PutMessageStatus, match: str) -> None:
    log.put_message(Message("TopicX", 0, b"first"))
    before = snapshot(log)
    with pytest.raises(PutMessageError, match=match) as info:
        log.put_messages([Message("TopicX", 1, b"good"), message])
    assert info.value.status is status and info.value.index == 1
    assert snapshot(log) == before


def test_unknown_topic_without_auto_create_is_not_found(tmp_path: Path) -> None:
    log = make_log(tmp_path, auto_create_topic_enable=False)
    try:
        with pytest.raises(NotFoundError, match="create it first"):
            log.put_message(Message("Nope", 0, b"x"))
        log.create_topic(TopicConfig("Yes", 2, 2))
        assert log.put_message(Message("Yes", 1, b"x")).status is PutMessageStatus.PUT_OK
        with pytest.raises(AlreadyExistsError):
            log.create_topic(TopicConfig("Yes", 2, 2))
        with pytest.raises(InvalidArgumentError, match="perm"):
            log.update_topic(TopicConfig("Yes", 2, 2, perm=9))
        log.update_topic(TopicConfig("Yes", 4, 4, perm=4))
        with pytest.raises(PutMessageError, match="not writable"):
            log.put_message(Message("Yes", 0, b"x"))
    finally:
        log.shutdown()
    # A clean stop folds the table's journal into topics.json: what was acknowledged, in one file.
    assert json.loads((tmp_path / "config" / "topics.json").read_bytes())["topics"] == {
        "Yes": {"read_queue_nums": 4, "write_queue_nums": 4, "perm": 4}}
    assert (tmp_path / "config" / "topics.json.journal").read_bytes() == b""


@pytest.mark.parametrize("store_geometry", [SMALL], ids=geometry_id, indirect=True)
def test_batch_across_a_file_roll_writes_a_blank_and_continues(log: MessageStore) -> None:
    results = log.put_messages([Message("TopicR", i % 2, b"y" * 1000) for i in range(200)])
    file_size = log.config.mapped_file_size_commit_log
    rolled = [r for r in results if r.commitlog_offset % file_size == 0 and r.commitlog_offset > 0]
    assert rolled, "200 KB of records must cross the 64 KiB files"
    for before, after in zip(results, results[1:], strict=False):
        end = before.commitlog_offset + before.wrote_bytes
        if after.commitlog_offset != end:  # a roll: the rest of the file is BLANK
            assert after.commitlog_offset % file_size == 0
            mapped = log.commit_log.mfq.find_by_offset(end)
            assert mapped is not None
            size, magic = read_size_and_magic(mapped.buffer, end - mapped.file_from_offset)
            assert magic == BLANK_MAGIC_CODE and end + size == after.commitlog_offset
            assert size >= 8
    assert [r.queue_offset for r in results if r.queue_id == 0] == list(range(100))
    for r in results[::37]:
        host, offset = decode_message_id(r.msg_id)
        assert (host, offset) == ("127.0.0.1:10911", r.commitlog_offset)
        record = decode_record(log.read(r.commitlog_offset, r.wrote_bytes))
        assert record.store_timestamp == r.store_timestamp and record.queue_offset == r.queue_offset


def test_delay_messages_are_parked_in_the_schedule_topic(log: MessageStore) -> None:
    result = log.put_message(Message("TopicD", 3, b"later", properties={"DELAY": "3", "KEYS": "k"}))
    record = decode_record(log.read(result.commitlog_offset, result.wrote_bytes))
    assert (record.topic, record.queue_id) == (SCHEDULE_TOPIC, 2)
    assert record.properties["REAL_TOPIC"] == "TopicD" and record.properties["REAL_QID"] == "3"
    assert (result.topic, result.queue_id) == (SCHEDULE_TOPIC, 2)


def test_prepared_transaction_messages_take_no_queue_offset(log: MessageStore) -> None:
    prepared = log.put_message(Message("TopicTx", 0, b"p", sys_flag=TRANSACTION_PREPARED_TYPE))
    normal = log.put_message(Message("TopicTx", 0, b"n"))
    assert prepared.queue_offset == 0 and normal.queue_offset == 0
    assert log.put_message(Message("TopicTx", 0, b"n2")).queue_offset == 1


def test_ipv6_hosts_set_the_sysflag_bits(tmp_path: Path) -> None:
    log = make_log(tmp_path, broker_ip="::1")
    try:
        result = log.put_message(Message("Topic6", 0, b"v6", born_host="[::1]:5000"))
        record = decode_record(log.read(result.commitlog_offset, result.wrote_bytes))
        assert record.sys_flag & 0x30 == 0x30
        assert (record.born_host, record.store_host) == ("[::1]:5000", "[::1]:10911")
        assert decode_message_id(result.msg_id) == ("[::1]:10911", result.commitlog_offset)
    finally:
        log.shutdown()


def test_sync_flush_acknowledges_only_flushed_data(tmp_path: Path) -> None:
    log = make_log(tmp_path, flush_disk_type="SYNC_FLUSH")
    try:
        result = log.put_message(Message("TopicS", 0, b"durable"))
        assert result.status is PutMessageStatus.PUT_OK
        assert log.commit_log.mfq.flushed_where >= result.commitlog_offset + result.wrote_bytes
    finally:
        log.shutdown()


def test_sync_flush_timeout_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = make_log(tmp_path, flush_disk_type="SYNC_FLUSH", sync_flush_timeout=100)
    import services.store.formats.mapped_file as mapped_file

    real = mapped_file.os.fdatasync
    monkeypatch.setattr(mapped_file.os, "fdatasync", lambda fd: (time.sleep(0.3), real(fd)))
    try:
        result = log.put_message(Message("TopicS", 0, b"slow disk"))
        assert result.status is PutMessageStatus.FLUSH_DISK_TIMEOUT
        # the record itself was written, as in RocketMQ
        assert decode_record(log.read(result.commitlog_offset, result.wrote_bytes)).body == b"slow disk"
    finally:
        monkeypatch.undo()
        log.shutdown()


def test_transient_store_pool_commits_then_flushes(tmp_path: Path) -> None:
    log = make_log(tmp_path, transient_store_pool_enable=True, transient_store_pool_size=3,
                   commit_interval_commit_log=50)
    try:
        results = log.put_messages([Message("TopicP", 0, b"z" * 500) for _ in range(300)])
        assert log.max_offset < log.commit_log.mfq.max_wrote_offset  # not readable before the commit service ran
        deadline = time.monotonic() + 5
        while log.max_offset < log.commit_log.mfq.max_wrote_offset and time.monotonic() < deadline:
            time.sleep(0.02)
        assert log.max_offset == log.commit_log.mfq.max_wrote_offset  # readers see it once committed
        last = results[-1]
        assert decode_record(log.read(last.commitlog_offset, last.wrote_bytes)).body == b"z" * 500
        assert all(f.write_buffer is None for f in log.commit_log.mfq.files[:-1])  # full files gave their buffers back
    finally:
        log.shutdown()
    log = make_log(tmp_path)
    try:
        assert log.max_offset == results[-1].commitlog_offset + results[-1].wrote_bytes
    finally:
        log.shutdown()


def test_a_rejected_batch_creates_no_topic(log: MessageStore) -> None:
    with pytest.raises(PutMessageError):
        log.put_messages([Message("BrandNew", 0, b"ok"), Message("BrandNew", 99, b"bad queue")])
    assert log.topics.get("BrandNew") is None
    log.put_message(Message("BrandNew", 0, b"ok"))
    assert log.topics.get("BrandNew") == TopicConfig("BrandNew", 8, 8)


def test_a_put_stuck_in_the_lock_makes_others_fail_fast_as_broker_busy(tmp_path: Path) -> None:
    """RocketMQ's isOSPageCacheBusy: a put behind one that has held the lock past the timeout is
    refused at once (RESOURCE_EXHAUSTED at the service), and writes nothing."""
    log = make_log(tmp_path, os_page_cache_busy_time_out_mills=200)
    try:
        log.put_messages([Message("busy", 0, b"first")])
        before = log.max_offset
        release = threading.Event()
        held = threading.Event()

        def stuck_put() -> None:
            with log.commit_log._put_lock:  # a put whose append stalls on the page cache
                log.commit_log._begin_time_in_lock = time.monotonic()
                held.set()
                release.wait(10)
                log.commit_log._begin_time_in_lock = 0.0

        holder = threading.Thread(target=stuck_put)
        holder.start()
        held.wait(5)
        time.sleep(0.3)
        started = time.monotonic()
        with pytest.raises(ResourceExhaustedError, match="broker busy"):
            log.put_messages([Message("busy", 0, b"second")])
        assert time.monotonic() - started < 0.1, "a busy store must refuse at once, not wait for the lock"
        release.set()
        holder.join()
        assert log.max_offset == before
        assert [r.queue_offset for r in log.put_messages([Message("busy", 0, b"third")])] == [1]
    finally:
        log.shutdown()
