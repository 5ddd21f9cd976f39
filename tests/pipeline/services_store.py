"""A store written by the real services (``mqstore up``: commitlog, indexer, query, gateway processes)
in a small geometry, for the offline tools: mqstore's layout (``indexer/consumequeue``,
``indexer/index``) with index files no size-based guess can read (997 slots, 5000 entries).

Kept apart from conftest.py so modules outside tests/pipeline (the inspect CLI tests) can use it
without Spark.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from pathlib import Path

import grpc

from mqstore.v1 import common_pb2, gateway_pb2, indexer_pb2, indexer_pb2_grpc
from tests.commitlog.commitlog_process import CHANNEL_OPTIONS
from tests.gateway.system_process import start_up

COMMITLOG_FILE_SIZE = 64 * 1024
SETTINGS = {"mappedFileSizeConsumeQueue": 400, "maxHashSlotNum": 997, "maxIndexNum": 5000}
# mappedFileSizeCommitLog goes through the environment (which wins over the file, as for the services).
ENV = {"MQSTORE_MAPPED_FILE_SIZE_COMMIT_LOG": str(COMMITLOG_FILE_SIZE)}
TOPICS = ("Orders", "Audit")
BATCH = 50


@dataclass(frozen=True)
class ServicesStore:
    root: Path
    config: Path  # the YAML the services ran with (without the commitlog size, which came from ENV)
    messages: int


def write_services_store(directory: Path, messages: int = 1800, seed: int = 5) -> ServicesStore:
    """Start ``mqstore up`` on ``directory/store`` with the small settings, send ``messages`` messages
    (UNIQ_KEY and two KEYS words each, so about 3 index items a message: two index files; bodies of
    1 B .. 60 KB, so commitlog files end in BLANK fillers), wait until the indexer has dispatched
    everything, and stop it cleanly."""
    config = directory / "mqstore.yaml"
    config.write_text("".join(f"{name}: {value}\n" for name, value in SETTINGS.items()))
    root = directory / "store"
    rng = random.Random(seed)
    up = start_up(root, env_overrides=ENV, extra_args=["--config", str(config), "--no-metrics"])
    try:
        for first in range(0, messages, BATCH):
            topic = TOPICS[(first // BATCH) % len(TOPICS)]
            batch = [common_pb2.Message(topic=topic, body=rng.randbytes(rng.choice((1, 40, 300, 2000)) if i % 97
                                                                        else rng.randrange(20_000, 60_000)),
                                        properties={"KEYS": f"k-{i} group-{i % 7}", "TAGS": f"Tag{i % 3}"})
                     for i in range(first, min(first + BATCH, messages))]
            up.stub.SendBatch(gateway_pb2.SendBatchRequest(messages=batch), timeout=30)
        _wait_dispatched(up.indexer)
        code = up.stop()
        assert code == 0, f"mqstore up exited with {code}:\n{up.logs()[-5000:]}"
    finally:
        up.kill_all()
    return ServicesStore(root, config, messages)


def _wait_dispatched(indexer: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    with grpc.insecure_channel(indexer, options=CHANNEL_OPTIONS) as channel:
        stub = indexer_pb2_grpc.IndexerServiceStub(channel)
        while True:
            status = stub.GetDispatchStatus(indexer_pb2.GetDispatchStatusRequest(), timeout=5)
            if status.behind_bytes == 0 and status.reput_offset == status.commitlog_max_offset:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"the indexer is still {status.behind_bytes} bytes behind")
            time.sleep(0.1)
