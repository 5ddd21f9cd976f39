"""Pipeline fixtures: small stores written by mqstore's own commitlog engine (the one local Spark
session of the whole run, shared with the differential soak, is tests/conftest.py's ``spark``)."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from services.commitlog.message_store import MessageStore
from services.store.config import load_config
from services.store.formats.commitlog_walk import commitlog_file_name, list_commitlog_files
from services.store.formats.message import Message
from services.store.formats.record import encode_blank
from tests.pipeline.services_store import ServicesStore, write_services_store

pytest.importorskip("pyspark")

MqstoreFactory = Callable[..., Path]


def write_mqstore(root: Path, count: int, file_size: int = 16 * 1024, seed: int = 7) -> Path:
    """A store written by mqstore's CommitLog: ``count`` messages over 3 topics, with keys, tags and
    bodies of 0..600 bytes, in ``file_size``-byte commitlog files. Returns the store root."""
    rng = random.Random(seed)
    log = MessageStore(load_config(environ={}, mapped_file_size_commit_log=file_size), root)
    log.start()
    try:
        for i in range(count):
            topic = ("Orders", "Payments", "Audit")[i % 3]
            props = {"KEYS": f"k-{i % 17} user-{i % 5}"} if i % 2 else {}
            if i % 3 == 1:
                props["TAGS"] = "TagX"
            body = rng.randbytes(rng.choice((0, 1, 40, 300, 600)))
            log.put_messages([Message(topic=topic, queue_id=i % 2, body=body, properties=props,
                                      born_timestamp=1_700_000_000_000 + i)])
    finally:
        log.shutdown()
    return root


@pytest.fixture(scope="session")
def mqstore_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A read-only mqstore-written store of 400 messages in 16 KiB files."""
    return write_mqstore(tmp_path_factory.mktemp("mqstore") / "store", 400)


@dataclass(frozen=True)
class PutRecord:
    """What a put returned: where the record went."""

    topic: str
    queue_id: int
    queue_offset: int
    size: int


def write_varied_store(root: Path, count: int, file_size: int = 64 * 1024, seed: int = 11) -> dict[int, PutRecord]:
    """A store written by mqstore's CommitLog with records from 1 byte to nearly ``file_size`` (so most
    files end in a BLANK filler, some large), and one wholly-BLANK file in the middle: the first run is
    closed with a BLANK, then a file that is one BLANK and an empty file follow, and recovery continues
    in that empty file, as RocketMQ's would. Returns the put results by commitlog offset."""
    rng = random.Random(seed)
    config = load_config(environ={}, mapped_file_size_commit_log=file_size)
    puts: dict[int, PutRecord] = {}

    def put(first: int, last: int) -> None:
        log = MessageStore(config, root)
        log.start()
        try:
            for i in range(first, last):
                roll = rng.random()
                size = file_size - 400 - rng.randrange(100) if roll < 0.004 else \
                    rng.randrange(file_size // 2) if roll < 0.015 else rng.choice((1, 40, 120, 300, 900))
                props = {"KEYS": f"k-{i} g-{i % 9}"} if i % 2 else {"TAGS": "TagA"}
                message = Message(topic=("Orders", "Payments", "Audit")[i % 3], queue_id=i % 4,
                                  body=rng.randbytes(size), properties=props, born_timestamp=1_700_000_000_000 + i)
                result = log.put_messages([message])[0]
                puts[result.commitlog_offset] = PutRecord(result.topic, result.queue_id, result.queue_offset,
                                                          result.wrote_bytes)
        finally:
            log.shutdown()

    put(0, count // 2)
    files = list_commitlog_files(root / "commitlog")
    end = max(offset + record.size for offset, record in puts.items())
    last = files[-1]
    with open(last.path, "r+b") as handle:  # what a roll writes: the rest of the file is BLANK
        handle.seek(end - last.start_offset)
        handle.write(encode_blank(last.end_offset - end))
    (root / "commitlog" / commitlog_file_name(last.end_offset)).write_bytes(encode_blank(file_size).ljust(file_size,
                                                                                                          b"\0"))
    (root / "commitlog" / commitlog_file_name(last.end_offset + file_size)).write_bytes(bytes(file_size))
    put(count // 2, count)
    assert min(o for o in puts if o > end) == last.end_offset + file_size, "the second run starts after the BLANK file"
    return puts


@pytest.fixture(scope="session")
def varied_store(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, PutRecord]]:
    """A read-only store of 3000 records of 1 B .. 64 KiB in 64 KiB files (~40), with a wholly-BLANK file."""
    root = tmp_path_factory.mktemp("varied") / "store"
    return root, write_varied_store(root, 3000)


@pytest.fixture(scope="session")
def services_store(tmp_path_factory: pytest.TempPathFactory) -> ServicesStore:
    """Read only: mqstore's layout written by ``mqstore up`` (index files of 997 slots, 5000 entries)."""
    return write_services_store(tmp_path_factory.mktemp("services"))
