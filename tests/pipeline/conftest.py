"""Pipeline fixtures: one local Spark session for the whole run (it takes ~8 s to start), and small
stores written by mqstore's own commitlog engine."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from services.commitlog.commit_log import CommitLog
from services.store.config import load_config
from services.store.message import Message

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytest.importorskip("pyspark")

MqstoreFactory = Callable[..., Path]


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    from pipeline.session import get_session

    session = get_session("local[2]", "mqstore-pipeline-tests", {"spark.sql.shuffle.partitions": "4",
                                                                  "spark.driver.memory": "2g"})
    yield session
    session.stop()


def write_mqstore(root: Path, count: int, file_size: int = 16 * 1024, seed: int = 7) -> Path:
    """A store written by mqstore's CommitLog: ``count`` messages over 3 topics, with keys, tags and
    bodies of 0..600 bytes, in ``file_size``-byte commitlog files. Returns the store root."""
    rng = random.Random(seed)
    log = CommitLog(load_config(environ={}, mapped_file_size_commit_log=file_size), root)
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
