"""``format("mqstore")`` end to end: ``mqstore up`` in 64 KiB commitlog files (so the stream reads
across rolls), a local Spark (local[2]) streaming a topic into Parquet while messages are sent, the
query stopped mid-stream and restarted from its checkpoint: every message sent is in the output
exactly once, with the export's columns and values."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from mqstore.v1 import common_pb2, gateway_pb2
from pipeline.streaming import (
    STREAM_SCHEMA,
    StreamOptionError,
    StreamOptions,
    capped,
    split_ranges,
    start_parquet_stream,
)
from tests.gateway.system_process import UpProcess, start_up
from tests.pipeline.services_store import ENV

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

QUEUES = 4


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpProcess]:
    """One ``mqstore up`` for the module (each test streams its own topic)."""
    handle = start_up(tmp_path_factory.mktemp("stream") / "store", env_overrides=ENV, extra_args=["--no-metrics"])
    try:
        yield handle
    finally:
        code = handle.stop()
        handle.kill_all()
        assert code == 0, handle.logs()[-3000:]


@pytest.fixture
def topic(up: UpProcess, request: pytest.FixtureRequest) -> str:
    """A new topic of QUEUES queues for this test."""
    from mqstore.v1 import commitlog_pb2

    name = "Stream" + "".join(c for c in request.node.name.title() if c.isalnum())[:60]
    config = common_pb2.TopicConfig(topic=name, read_queue_nums=QUEUES, write_queue_nums=QUEUES, perm=6)
    up.stub.CreateTopic(commitlog_pb2.TopicRequest(topic=config), timeout=30)
    return name


def _body(i: int) -> bytes:
    return f"message {i} ".encode() * (1 + (i % 7) ** 3)


def _send(up: UpProcess, topic: str, first: int, count: int, batch: int = 25) -> None:
    """Messages ``first .. first+count-1``: KEYS ``m-<i>``, bodies of 10 B .. 3 KB (the 64 KiB files roll)."""
    for start in range(first, first + count, batch):
        messages = [common_pb2.Message(topic=topic, body=_body(i), properties={"KEYS": f"m-{i}", "TAGS": f"T{i % 3}"})
                    for i in range(start, min(start + batch, first + count))]
        up.stub.SendBatch(gateway_pb2.SendBatchRequest(messages=messages), timeout=30)


def _wait_rows(query: object, rows: int, timeout_s: float = 180.0) -> None:
    """Until the query's finished batches have read ``rows`` rows in all."""
    deadline = time.monotonic() + timeout_s
    while sum(p["numInputRows"] for p in query.recentProgress) < rows:  # type: ignore[attr-defined]
        assert query.isActive, query.exception()  # type: ignore[attr-defined]
        assert time.monotonic() < deadline, f"the stream read fewer than {rows} rows in {timeout_s}s"
        time.sleep(0.2)


def _crash_after_planning(checkpoint: Path, output: Path) -> int:
    """Make the checkpoint look as if the query died after logging its last batch's offsets but before
    the Parquet sink or the commit log recorded it (the files the batch wrote stay, orphaned, as a
    crash leaves them). Returns that batch's id: a restart must rerun it with the same ranges."""
    last = max(int(p.name) for p in (checkpoint / "offsets").iterdir() if p.name.isdigit())
    for log in (checkpoint / "commits", output / "_spark_metadata"):
        for name in (str(last), f".{last}.crc"):
            (log / name).unlink(missing_ok=True)
    return last


def test_stream_to_parquet_exactly_once_across_restart(spark: SparkSession, up: UpProcess, topic: str,
                                                        tmp_path: Path) -> None:
    output, checkpoint = str(tmp_path / "out"), str(tmp_path / "checkpoint")
    options = {"endpoint": up.gateway, "topic": topic, "maxMessagesPerTrigger": "200",
               "maxMessagesPerPartition": "100"}
    _send(up, topic, 0, 200)  # before the stream starts

    first = start_parquet_stream(spark, options, output, checkpoint, trigger_s=0.5, query_name="mqstore_first")
    sender = threading.Thread(target=_send, args=(up, topic, 200, 300, 10))  # while it runs
    try:
        sender.start()
        _wait_rows(first, 250)
    finally:
        sender.join()
        first.stop()  # mid-stream: it has not read everything sent
    assert first.exception() is None
    read_first = sum(p["numInputRows"] for p in first.recentProgress)
    replayed = _crash_after_planning(Path(checkpoint), Path(output))
    _send(up, topic, 500, 100)  # while no query runs

    second = start_parquet_stream(spark, options, output, checkpoint, available_now=True)
    second.awaitTermination(120)
    assert not second.isActive and second.exception() is None
    assert second.recentProgress[0]["batchId"] == replayed, "the restart reran the uncommitted batch first"
    assert read_first < 600, "the first query was to stop before it had read everything"

    frame = spark.read.parquet(output)
    assert frame.columns == STREAM_SCHEMA.names
    rows = frame.select("key", "queue_id", "queue_offset", "body", "topic", "tags").collect()
    keys = sorted(int(r["key"][2:]) for r in rows)
    assert keys == list(range(600)), "every message sent, each once"
    by_queue: dict[int, list[int]] = {}
    for r in rows:
        by_queue.setdefault(r["queue_id"], []).append(r["queue_offset"])
        i = int(r["key"][2:])
        assert r["body"] == _body(i) and r["tags"] == f"T{i % 3}"
    assert sorted(by_queue) == list(range(QUEUES))
    for offsets in by_queue.values():
        assert sorted(offsets) == list(range(len(offsets)))

    # A third run from the same checkpoint finds nothing new and writes nothing.
    third = start_parquet_stream(spark, options, output, checkpoint, available_now=True)
    third.awaitTermination(60)
    assert third.exception() is None
    assert spark.read.parquet(output).count() == 600


def test_stream_rows_equal_export(spark: SparkSession, up: UpProcess, topic: str, tmp_path: Path) -> None:
    """The stream's rows are the export's rows of the same store, column for column."""
    from pipeline.export import export

    _send(up, topic, 0, 120)
    output, checkpoint = str(tmp_path / "out"), str(tmp_path / "checkpoint")
    query = start_parquet_stream(spark, {"endpoint": up.gateway, "topic": topic}, output, checkpoint,
                                 available_now=True)
    query.awaitTermination(120)
    assert query.exception() is None
    exported = str(tmp_path / "export")
    export(spark, up.store / "commitlog", exported)
    streamed = [r.asDict() for r in spark.read.parquet(output).orderBy("commitlog_offset").collect()]
    offline = [r.asDict() for r in spark.read.parquet(exported).where(f"topic = '{topic}'")
               .select(*STREAM_SCHEMA.names).orderBy("commitlog_offset").collect()]
    assert len(streamed) == 120
    assert streamed == offline


def test_starting_offsets_latest_and_explicit(spark: SparkSession, up: UpProcess, topic: str, tmp_path: Path) -> None:
    _send(up, topic, 0, 40)
    for name, starting, expected in (("latest", "latest", set(range(40, 60))),
                                     ("explicit", '{"0": 5}', None)):
        output, checkpoint = str(tmp_path / name), str(tmp_path / f"{name}-checkpoint")
        options = {"endpoint": up.gateway, "topic": topic, "startingOffsets": starting}
        if name == "latest":  # the first batch fixes where "latest" was; what comes after is read
            query = start_parquet_stream(spark, options, output, checkpoint, trigger_s=0.5)
            try:
                deadline = time.monotonic() + 180
                while not query.recentProgress:
                    assert time.monotonic() < deadline and query.isActive, query.exception()
                    time.sleep(0.2)
                _send(up, topic, 40, 20)
                _wait_rows(query, 20)
            finally:
                query.stop()
        else:
            query = start_parquet_stream(spark, options, output, checkpoint, available_now=True)
            query.awaitTermination(120)
        assert query.exception() is None
        rows = spark.read.parquet(output).select("key", "queue_id", "queue_offset").collect()
        if expected is not None:
            assert {int(r["key"][2:]) for r in rows} == expected and len(rows) == len(expected)
        else:
            assert all(r["queue_offset"] >= 5 for r in rows if r["queue_id"] == 0)
            assert len(rows) == 60 - 5


def test_cli_stream_available_now_json(spark: SparkSession, up: UpProcess, topic: str, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    """``mqstore pipeline stream --available-now --json``: reads what is there, says how much, stops;
    a rerun on the same checkpoint reads nothing; a bad option is exit 2 before Spark is asked."""
    from pipeline.cli import main

    _send(up, topic, 0, 30)
    args = ["stream", str(tmp_path / "out"), "--checkpoint", str(tmp_path / "checkpoint"), "--endpoint", up.gateway,
            "--topic", topic, "--available-now", "--json"]
    assert main(args) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["job"], result["ok"], result["rows"]) == ("stream", True, 30)
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["rows"] == 0
    assert spark.read.parquet(str(tmp_path / "out")).count() == 30
    assert main([*args, "--starting-offsets", "oldest"]) == 2
    failed = json.loads(capsys.readouterr().out)
    assert failed["ok"] is False and "startingOffsets" in failed["error"]


def test_options_refused_with_what_to_fix() -> None:
    with pytest.raises(StreamOptionError, match="'endpoint' is required"):
        StreamOptions.parse({"topic": "T"})
    with pytest.raises(StreamOptionError, match="startingOffsets"):
        StreamOptions.parse({"endpoint": "h:1", "topic": "T", "startingOffsets": "oldest"})
    with pytest.raises(StreamOptionError, match="maxMessagesPerTrigger"):
        StreamOptions.parse({"endpoint": "h:1", "topic": "T", "maxMessagesPerTrigger": "0"})
    with pytest.raises(StreamOptionError, match="unknown option"):
        StreamOptions.parse({"endpoint": "h:1", "topic": "T", "startingOffset": "latest"})
    parsed = StreamOptions.parse({"Endpoint": "h:1", "TOPIC": "T", "failOnDataLoss": "false"})
    assert (parsed.endpoint, parsed.topic, parsed.fail_on_data_loss) == ("h:1", "T", False)


def test_capped_spreads_the_limit_and_split_ranges_covers_each_offset_once() -> None:
    start = {"0": 10, "1": 0, "2": 5}
    available = {"0": 110, "1": 3, "2": 5, "3": 0}
    assert capped(start, available, None) == available
    end = capped(start, available, 50)
    assert end == {"0": 57, "1": 3, "2": 5, "3": 0}  # queue 1's unused share goes to queue 0
    assert sum(end[q] - start.get(q, end[q]) for q in end) == 50
    parts = split_ranges(start, end, 20)
    covered = [(p.queue_id, o) for p in parts for o in range(p.start, p.end)]
    assert sorted(covered) == sorted({(int(q), o) for q in end for o in range(start.get(q, end[q]), end[q])})
    assert all(p.end - p.start <= 20 for p in parts)


def test_read_range_pulls_exactly_the_range_and_names_missing_offsets(up: UpProcess, topic: str,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The executors' side without Spark: a range is read whole, in queue order, across pulls of at
    most PULL_MESSAGES; a range the queue does not have fails, naming queue and offsets."""
    from mqstore.client import Client
    from pipeline import streaming

    _send(up, topic, 0, 80, batch=1)
    deadline = time.monotonic() + 30
    with Client(up.gateway) as client:  # all 80 dispatched: a queue's end read earlier moves on under the test
        while sum((ends := {r.queue_id: r.max_offset for r in client.all_queue_offsets(topic)}).values()) < 80:
            assert time.monotonic() < deadline, f"80 sends not all dispatched within 30 s: {ends}"
            time.sleep(0.05)
    queue = max(ends, key=lambda q: ends[q])
    assert ends[queue] >= 17
    options = StreamOptions.parse({"endpoint": up.gateway, "topic": topic})
    monkeypatch.setattr(streaming, "PULL_MESSAGES", 7)  # several pulls per range
    batches = list(streaming.read_range(options, streaming.QueueRange(queue, 3, 17)))
    offsets = [o for b in batches for o in b.column("queue_offset").to_pylist()]
    assert offsets == list(range(3, 17))
    assert {q for b in batches for q in b.column("queue_id").to_pylist()} == {queue}
    assert all(b.schema == STREAM_SCHEMA for b in batches)
    monkeypatch.setattr(streaming, "EMPTY_PULL_WAIT_S", 0.01)
    end = ends[queue]
    with pytest.raises(streaming.DataLossError,
                       match=rf"queue {queue}: queue offsets \[{end}, {end + 20}\) were in the queue"):
        list(streaming.read_range(options, streaming.QueueRange(queue, end - 5, end + 20)))


def test_calls_are_tried_again_while_the_gateway_is_unavailable(monkeypatch: pytest.MonkeyPatch,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    """Nothing listens on the port: every pull is UNAVAILABLE, tried CALL_ATTEMPTS times, then the
    error is the task's (a local Spark task is not retried by Spark)."""
    import socket

    from mqstore.client.errors import UnavailableError
    from pipeline import streaming

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{probe.getsockname()[1]}"
    monkeypatch.setattr(streaming, "FIRST_RETRY_WAIT_S", 0.01)
    options = StreamOptions.parse({"endpoint": address, "topic": "T", "timeout": "2"})
    with caplog.at_level("WARNING", logger="pipeline.streaming"), pytest.raises(UnavailableError):
        list(streaming.read_range(options, streaming.QueueRange(0, 0, 5)))
    assert sum("trying again" in r.getMessage() for r in caplog.records) == streaming.CALL_ATTEMPTS - 1
