"""``format("mqstore")``: a Spark Structured Streaming source that reads a topic's new messages through
the gateway, as they arrive, with Spark's checkpointed progress.

Why a Python DataSource V2 stream reader (``pyspark.sql.datasource.DataSourceStreamReader``, PySpark
4): Spark itself then keeps the progress. An offset is each queue's next queue offset, as JSON
(``{"0": 120, "1": 97}``, route queue id to queue offset); Spark writes the end offset of a
micro-batch to the checkpoint's offset log before the batch runs and its commit log after the sink
has it, and a restarted query replays an unfinished batch with the *same* [start, end) ranges. A
queue's messages never change, so the replay reads the same rows, and the file sink (``parquet``,
whose ``_spark_metadata`` log names the files of each committed batch) makes the output exactly
once. Nothing needs a consumer group or a commit on the server.

- ``latestOffset``: every readable queue's max offset (one ``GetQueueOffsets`` round trip through
  the gateway for the route's queues); ``maxMessagesPerTrigger`` caps how far a batch reaches, spread
  over the queues. A queue that appears later (the topic grew) enters at its min offset.
- ``partitions``: one task per queue range, cut into pieces of ``maxMessagesPerPartition``.
- ``read`` (on the executors): raw pulls of [start, end) through the gateway; the stored records are
  decoded by the export's decoder (:func:`pipeline.export.records_batch`), so the rows carry the export
  columns, plus ``timestamp`` and ``key`` as export adds them (docs/pipeline.md).

Messages of a planned range that are gone when the range is read (their files expired, the queue
was deleted) are data loss: the query fails naming the queue and offsets, unless
``failOnDataLoss=false``, which skips them with a warning (Kafka source's option of the same name).

``queue_id`` is the route's queue id (what the offsets use; a record carries its shard's, which a
gateway over several shards numbers differently). Use::

    from pipeline.streaming import register
    register(spark)
    stream = (spark.readStream.format("mqstore").option("endpoint", "127.0.0.1:8080")
              .option("topic", "Orders").load())
    stream.writeStream.format("parquet").partitionBy("topic", "store_date") \\
        .option("checkpointLocation", "/lake/_checkpoints/orders").start("/lake/orders")

or ``spark-submit pipeline/streaming.py --endpoint HOST:PORT --topic T OUT --checkpoint DIR``.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any, TypeVar

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

from services.store.formats.message import MessageRecord
from services.store.formats.record import decode_record

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming.query import StreamingQuery
    from pyspark.sql.types import StructType

    from mqstore.client.connection import Connection

LOG = logging.getLogger(__name__)

SOURCE_NAME = "mqstore"
PROG = "mqstore pipeline stream"
EXIT_BAD_OPTIONS = 2
#: Messages a pull asks for (the gateway's maximum) and the bytes it may answer with.
PULL_MESSAGES = 1024
PULL_BYTES = 4 * 1024 * 1024
DEFAULT_PARTITION_MESSAGES = 50_000
#: A pull that returns nothing inside a planned range is retried (the range was seen in the queue's
#: offsets, so it is there): how often, and how long apart.
EMPTY_PULL_RETRIES = 20
EMPTY_PULL_WAIT_S = 0.25

#: Calls that fail for a reason that passes (the gateway restarting, overloaded) are tried again:
#: how often in all, and the first wait (doubled each time). Other errors fail at once.
CALL_ATTEMPTS = 5
FIRST_RETRY_WAIT_S = 0.2

# GetMessageStatus (proto/mqstore/v1/query.proto), by number: the client library's wire types stay here.
_FOUND = 1
_SKIPPED = {2: "every message was filtered out", 3: "their records were deleted from the commitlog",
            4: "their ConsumeQueue file is missing", 7: "they expired (offset below the queue's min offset)"}
_BEYOND_END = {5: "offset beyond the queue's max offset", 6: "offset at the queue's max offset",
               8: "the queue has no messages"}

Offsets = dict[str, int]
T = TypeVar("T")


class StreamOptionError(ValueError):
    """An option of ``format("mqstore")`` that cannot be used; the message says which and what to give."""


class DataLossError(RuntimeError):
    """Messages a batch planned to read are gone from the queue."""


@dataclass(frozen=True)
class StreamOptions:
    """The source's options (case-insensitive, as Spark passes them)."""

    endpoint: str
    topic: str
    token: str | None = None
    tls: bool = False
    starting_offsets: str = "earliest"  # "earliest", "latest", or JSON {"queue id": queue offset}
    max_messages_per_trigger: int | None = None
    max_messages_per_partition: int = DEFAULT_PARTITION_MESSAGES
    decompress: bool = False
    fail_on_data_loss: bool = True
    timeout_s: float = 30.0

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> StreamOptions:
        given = {str(k).lower(): str(v) for k, v in options.items()}
        known = {"endpoint", "topic", "token", "tls", "startingoffsets", "maxmessagespertrigger",
                 "maxmessagesperpartition", "decompress", "failondataloss", "timeout", "path"}
        unknown = sorted(set(given) - known)
        if unknown:
            raise StreamOptionError(f"format('mqstore'): unknown option(s) {', '.join(unknown)}; known: endpoint, "
                                    "topic, token, tls, startingOffsets, maxMessagesPerTrigger, "
                                    "maxMessagesPerPartition, decompress, failOnDataLoss, timeout")
        endpoint = given.get("endpoint", "").strip()
        topic = given.get("topic", given.get("path", "")).strip()
        if not endpoint:
            raise StreamOptionError("format('mqstore'): option 'endpoint' is required: the gateway's HOST:PORT")
        if not topic:
            raise StreamOptionError("format('mqstore'): option 'topic' is required: the topic to read")
        starting = given.get("startingoffsets", "earliest").strip()
        if starting.lower() in ("earliest", "latest"):
            starting = starting.lower()
        else:
            _explicit_offsets(starting)  # checked now, used by initialOffset
        per_trigger = _positive(given, "maxmessagespertrigger", "maxMessagesPerTrigger")
        per_partition = _positive(given, "maxmessagesperpartition", "maxMessagesPerPartition")
        timeout = given.get("timeout", "30")
        try:
            timeout_s = float(timeout)
        except ValueError:
            timeout_s = -1.0
        if timeout_s <= 0:
            raise StreamOptionError(f"format('mqstore'): option 'timeout' is {timeout!r}: give seconds > 0")
        return cls(endpoint=endpoint, topic=topic, token=given.get("token") or None, tls=_flag(given, "tls", False),
                   starting_offsets=starting, max_messages_per_trigger=per_trigger,
                   max_messages_per_partition=per_partition or DEFAULT_PARTITION_MESSAGES,
                   decompress=_flag(given, "decompress", False),
                   fail_on_data_loss=_flag(given, "failondataloss", True), timeout_s=timeout_s)

    def connect(self) -> Connection:
        from mqstore.client.connection import Connection

        return Connection(self.endpoint, self.token, timeout=self.timeout_s, tls=True if self.tls else None)


def _flag(given: Mapping[str, str], key: str, default: bool) -> bool:
    value = given.get(key)
    if value is None:
        return default
    if value.strip().lower() in ("true", "1", "yes"):
        return True
    if value.strip().lower() in ("false", "0", "no"):
        return False
    raise StreamOptionError(f"format('mqstore'): option {key!r} is {value!r}: give true or false")


def _positive(given: Mapping[str, str], key: str, name: str) -> int | None:
    value = given.get(key)
    if value is None:
        return None
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number <= 0:
        raise StreamOptionError(f"format('mqstore'): option {name!r} is {value!r}: give a whole number > 0")
    return number


def _explicit_offsets(text: str) -> dict[int, int]:
    """``startingOffsets`` as JSON: ``{"0": 15, "3": 0}`` (queues not named start at their min offset)."""
    try:
        parsed = json.loads(text)
        if not isinstance(parsed, dict):
            raise ValueError("not an object")
        offsets = {int(q): int(o) for q, o in parsed.items()}
    except (ValueError, TypeError) as exc:
        raise StreamOptionError(f"format('mqstore'): option 'startingOffsets' is {text!r} ({exc}): give "
                                "'earliest', 'latest' or JSON such as {\"0\": 15, \"1\": 0} (queue id: queue "
                                "offset)") from None
    bad = {q: o for q, o in offsets.items() if q < 0 or o < 0}
    if bad:
        raise StreamOptionError(f"format('mqstore'): option 'startingOffsets' has negative queue ids or "
                                f"offsets {bad}")
    return offsets


# -- the rows ---------------------------------------------------------------------------------------


def _stream_schema() -> pa.Schema:
    """The export's columns in the order a Parquet export reads back: the record's columns, then the
    Kafka-named ``timestamp`` and ``key``, then the partition columns ``topic`` and ``store_date``."""
    from pipeline.export import PARTITION_COLUMNS, SCHEMA

    fields = [f for f in SCHEMA if f.name not in PARTITION_COLUMNS]
    fields += [pa.field("timestamp", pa.timestamp("us", tz="UTC")), pa.field("key", pa.string())]
    fields += [SCHEMA.field(name) for name in PARTITION_COLUMNS]
    return pa.schema(fields)


STREAM_SCHEMA = _stream_schema()


def rows_of(records: Sequence[MessageRecord], decompress: bool) -> pa.RecordBatch:
    """One Arrow batch of STREAM_SCHEMA: the export's decoding of each record, plus the Kafka names."""
    from pipeline.export import records_batch

    batch = records_batch(records, decompress)
    columns = {name: batch.column(name) for name in batch.schema.names}
    columns["timestamp"] = columns["store_timestamp"]
    columns["key"] = pa.array([r.properties.get("KEYS") for r in records], pa.string())
    return pa.RecordBatch.from_arrays([columns[name] for name in STREAM_SCHEMA.names], schema=STREAM_SCHEMA)


def decode_raw(data: bytes, queue_id: int) -> list[MessageRecord]:
    """The records of a raw pull answer (each starts with its TOTALSIZE), with the route's queue id."""
    records: list[MessageRecord] = []
    view = memoryview(data)
    pos = 0
    while pos < len(data):
        record = decode_record(view, pos)
        records.append(record if record.queue_id == queue_id else replace(record, queue_id=queue_id))
        pos += record.store_size
    return records


def retrying(what: str, attempt: Callable[[], T]) -> T:
    """``attempt()``, tried again on UNAVAILABLE, DEADLINE_EXCEEDED and RESOURCE_EXHAUSTED: a local
    Spark task is not retried, so a gateway restart would otherwise fail the query."""
    from mqstore.client.errors import DeadlineExceededError, ResourceExhaustedError, UnavailableError

    wait = FIRST_RETRY_WAIT_S
    for number in range(1, CALL_ATTEMPTS + 1):
        try:
            return attempt()
        except (UnavailableError, DeadlineExceededError, ResourceExhaustedError) as exc:
            if number == CALL_ATTEMPTS:
                raise
            LOG.warning("%s failed (%s); trying again in %.1fs", what, exc, wait)
            time.sleep(wait)
            wait *= 2
    raise AssertionError("unreachable")


# -- reading one range -------------------------------------------------------------------------------


class QueueRange(InputPartition):
    """[start, end) of one queue: one Spark task."""

    def __init__(self, queue_id: int, start: int, end: int) -> None:
        super().__init__((queue_id, start, end))
        self.queue_id = queue_id
        self.start = start
        self.end = end


def _lost(options: StreamOptions, queue_id: int, first: int, last: int, why: str) -> None:
    message = (f"topic {options.topic!r} queue {queue_id}: queue offsets [{first}, {last}) are gone ({why}) "
               "before the stream read them")
    if options.fail_on_data_loss:
        raise DataLossError(f"{message}; set option failOnDataLoss=false to skip them")
    LOG.warning("%s; skipped (failOnDataLoss=false)", message)


def read_range(options: StreamOptions, part: QueueRange, connection: Connection | None = None
               ) -> Iterator[pa.RecordBatch]:
    """Every message of ``part``, in queue order, pulled raw through the gateway."""
    from mqstore.client.consumer import pull_request

    own = connection is None
    conn = options.connect() if connection is None else connection
    try:
        offset = part.start
        empty = 0
        while offset < part.end:
            request = pull_request(options.topic, part.queue_id, offset, min(PULL_MESSAGES, part.end - offset),
                                   "*", 0, PULL_BYTES)
            response = retrying(f"a pull from {options.endpoint}", functools.partial(conn.call, "Pull", request))
            status = int(response.status)
            if status == _FOUND and response.messages and not response.record_count:
                raise RuntimeError(f"the gateway at {options.endpoint} answered a raw pull with decoded "
                                   "messages: it predates raw records; upgrade it")
            records = decode_raw(response.records, part.queue_id) if status == _FOUND else []
            records = [r for r in records if r.queue_offset < part.end]
            if records:
                empty = 0
                if records[0].queue_offset > offset:
                    _lost(options, part.queue_id, offset, records[0].queue_offset, "missing from the pull")
                yield rows_of(records, options.decompress)
                offset = records[-1].queue_offset + 1
                continue
            if status in _SKIPPED and response.next_begin_offset > offset:
                last = min(int(response.next_begin_offset), part.end)
                _lost(options, part.queue_id, offset, last, _SKIPPED[status])
                offset = last
                continue
            empty += 1
            if empty > EMPTY_PULL_RETRIES:
                why = _BEYOND_END.get(status, f"pull status {status}")
                raise DataLossError(f"topic {options.topic!r} queue {part.queue_id}: queue offsets [{offset}, "
                                    f"{part.end}) were in the queue but a pull finds none ({why}, queue offsets "
                                    f"[{response.min_offset}, {response.max_offset})): was the topic deleted?")
            time.sleep(EMPTY_PULL_WAIT_S)
    finally:
        if own:
            conn.close()


# -- planning ----------------------------------------------------------------------------------------


def queue_ranges(options: StreamOptions, connection: Connection) -> dict[int, tuple[int, int]]:
    """(min, max) queue offset of every readable queue of the topic's route."""
    from mqstore.client.models import TopicRoute
    from mqstore.client.offsets import queue_offsets
    from mqstore.v1 import gateway_pb2

    request = gateway_pb2.GetRouteRequest(topic=options.topic)
    route = TopicRoute.from_proto(retrying(f"GetRoute from {options.endpoint}",
                                           lambda: connection.call("GetRoute", request)))
    found = retrying(f"GetQueueOffsets from {options.endpoint}",
                     lambda: queue_offsets(connection, options.topic, route.readable_queue_ids, None))
    return {r.queue_id: (r.min_offset, r.max_offset) for r in found}


def capped(start: Offsets, available: Offsets, max_messages: int | None) -> Offsets:
    """``available``, or when more than ``max_messages`` are new, an end that takes that many, spread
    evenly over the queues that have new messages (a queue with fewer gives its share to the others)."""
    if max_messages is None:
        return dict(available)
    behind = {q: available[q] - start.get(q, available[q]) for q in available}
    take = dict.fromkeys(available, 0)
    budget = max_messages
    waiting = sorted(q for q, n in behind.items() if n > 0)
    while budget > 0 and waiting:
        share = max(budget // len(waiting), 1)
        for q in list(waiting):
            more = min(share, behind[q] - take[q], budget)
            take[q] += more
            budget -= more
            if take[q] == behind[q]:
                waiting.remove(q)
            if budget == 0:
                break
    return {q: start.get(q, available[q]) + take[q] for q in available}


def split_ranges(start: Offsets, end: Offsets, per_partition: int) -> list[QueueRange]:
    parts: list[QueueRange] = []
    for key in sorted(end, key=int):
        first, last = start.get(key, end[key]), end[key]
        for piece in range(first, last, per_partition):
            parts.append(QueueRange(int(key), piece, min(piece + per_partition, last)))
    return parts


class MqstoreStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The driver's side: offsets and partitions; ``read`` runs on the executors (pickled)."""

    def __init__(self, options: StreamOptions) -> None:
        self.options = options
        self._connection: Connection | None = None
        self._target: Offsets | None = None  # Trigger.AvailableNow: what existed when the query started
        #: the max offsets latestOffset just asked for (Spark asks reportLatestOffset right after it)
        self._latest: Offsets | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_connection"] = None  # a channel is not picklable; executors open their own
        return state

    def _conn(self) -> Connection:
        if self._connection is None:
            self._connection = self.options.connect()
        return self._connection

    def _available(self) -> Offsets:
        return {str(q): hi for q, (_, hi) in sorted(queue_ranges(self.options, self._conn()).items())}

    def initialOffset(self) -> dict[str, int]:
        ranges = queue_ranges(self.options, self._conn())
        starting = self.options.starting_offsets
        if starting == "latest":
            return {str(q): hi for q, (_, hi) in sorted(ranges.items())}
        explicit = {} if starting == "earliest" else _explicit_offsets(starting)
        unknown = sorted(set(explicit) - set(ranges))
        if unknown:
            raise StreamOptionError(f"format('mqstore'): startingOffsets names queues {unknown} that topic "
                                    f"{self.options.topic!r} does not have (readable queues: {sorted(ranges)})")
        return {str(q): explicit.get(q, lo) for q, (lo, _) in sorted(ranges.items())}

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._available()

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        ranges = queue_ranges(self.options, self._conn())
        self._latest = {str(q): hi for q, (_, hi) in sorted(ranges.items())}
        available: Offsets = {}
        for q, (lo, hi) in sorted(ranges.items()):
            key = str(q)
            if key not in start:
                available[key] = lo  # a new queue enters at its min offset; the next batch reads from there
                continue
            if self._target is not None and key in self._target:
                hi = min(hi, self._target[key])
            available[key] = max(hi, int(start[key]))  # never behind where the stream is
        for key, offset in start.items():  # a queue no longer readable keeps its position
            available.setdefault(key, int(offset))
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        return capped({k: int(v) for k, v in start.items()}, available, max_rows)

    def getDefaultReadLimit(self) -> ReadLimit:
        per_trigger = self.options.max_messages_per_trigger
        return ReadMaxRows(per_trigger) if per_trigger else ReadAllAvailable()

    def reportLatestOffset(self) -> dict[str, int] | None:
        return self._latest if self._latest is not None else self._available()  # one round trip per trigger

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        return split_ranges({k: int(v) for k, v in start.items()}, {k: int(v) for k, v in end.items()},
                            self.options.max_messages_per_partition)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, QueueRange)
        return read_range(self.options, partition)

    def stop(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None


class MqstoreDataSource(DataSource):
    """``spark.readStream.format("mqstore")``: see the module docstring for the options."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> StructType:
        from pyspark.sql.pandas.types import from_arrow_schema

        return from_arrow_schema(STREAM_SCHEMA)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return MqstoreStreamReader(StreamOptions.parse(self.options))


def register(spark: SparkSession) -> None:
    """Make ``format("mqstore")`` known to ``spark`` (once per session)."""
    spark.dataSource.register(MqstoreDataSource)


# -- a ready-made query: topic -> Parquet --------------------------------------------------------------


def start_parquet_stream(spark: SparkSession, reader_options: Mapping[str, str], output: str, checkpoint: str,
                         *, trigger_s: float | None = 5.0, available_now: bool = False,
                         query_name: str | None = None) -> StreamingQuery:
    """The topic's messages appended to Parquet under ``output`` (partitioned by topic and store date,
    as export writes), progress in ``checkpoint``: exactly once across restarts from the same
    checkpoint. ``available_now``: read what exists now, then stop."""
    StreamOptions.parse(reader_options)  # bad options fail here, before a query starts
    register(spark)
    frame = spark.readStream.format(SOURCE_NAME).options(**reader_options).load()
    writer = (frame.writeStream.format("parquet").partitionBy("topic", "store_date")
              .option("checkpointLocation", checkpoint).outputMode("append"))
    if query_name:
        writer = writer.queryName(query_name)
    if available_now:
        writer = writer.trigger(availableNow=True)
    elif trigger_s:
        writer = writer.trigger(processingTime=f"{trigger_s} seconds")
    return writer.start(output)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("output", help="Parquet output directory or URI")
    parser.add_argument("--checkpoint", required=True,
                        help="Spark checkpoint directory: the stream's progress; reuse it to resume exactly once")
    parser.add_argument("--endpoint", required=True, help="the gateway's HOST:PORT")
    parser.add_argument("--topic", required=True)
    parser.add_argument("--token", default=None, help="an access token (default: MQSTORE_TOKEN)")
    parser.add_argument("--starting-offsets", default="earliest",
                        help="earliest (default), latest, or JSON {\"queue id\": queue offset}; only for a new "
                             "checkpoint")
    parser.add_argument("--max-messages-per-trigger", type=int, default=None)
    parser.add_argument("--decompress", action="store_true", help="inflate zlib bodies, as export --decompress")
    parser.add_argument("--trigger-seconds", type=float, default=5.0, help="micro-batch interval (default 5)")
    parser.add_argument("--available-now", action="store_true",
                        help="read what the topic holds now, write it, and stop")
    parser.add_argument("--master", default=None, help="Spark master (default local[*] or spark-submit's)")


def reader_options_of(args: argparse.Namespace) -> dict[str, str]:
    options = {"endpoint": args.endpoint, "topic": args.topic, "startingOffsets": args.starting_offsets,
               "decompress": str(bool(args.decompress)).lower()}
    if args.token:
        options["token"] = args.token
    if args.max_messages_per_trigger:
        options["maxMessagesPerTrigger"] = str(args.max_messages_per_trigger)
    return options


@dataclass(frozen=True)
class StreamResult:
    """What a run of the stream did (``--json``): micro-batches finished and the messages they read."""

    batches: int
    rows: int
    output: str
    checkpoint: str


def run_stream(args: argparse.Namespace) -> StreamResult:
    """Run the stream until it is stopped (Ctrl-C) or, with ``--available-now``, until it has caught up.
    Raises StreamOptionError for bad options (before Spark starts), JobError when the query fails."""
    from pipeline.failures import JobError, root_cause
    from pipeline.session import get_session

    options = reader_options_of(args)
    StreamOptions.parse(options)
    spark = get_session(args.master, "mqstore-stream")
    query = start_parquet_stream(spark, options, args.output, args.checkpoint, trigger_s=args.trigger_seconds,
                                 available_now=args.available_now)
    try:
        query.awaitTermination()
    except KeyboardInterrupt:
        query.stop()
    except Exception as exc:  # noqa: BLE001 (a failed query: its cause in one line)
        raise JobError(f"the stream failed: {root_cause(exc)}") from None
    progress = query.recentProgress
    return StreamResult(batches=len(progress), rows=sum(int(p["numInputRows"]) for p in progress),
                        output=args.output, checkpoint=args.checkpoint)


def run_json(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    """``mqstore pipeline stream --json``: exit code and result (bad options: exit 2, nothing started)."""
    try:
        return 0, asdict(run_stream(args))
    except StreamOptionError as exc:
        return EXIT_BAD_OPTIONS, {"error": str(exc)}


def run(args: argparse.Namespace) -> int:
    from pipeline.failures import run_job

    def stream(_: argparse.Namespace) -> int:
        try:
            result = run_stream(args)
        except StreamOptionError as exc:
            print(f"{PROG}: error: {exc}", file=sys.stderr)
            return EXIT_BAD_OPTIONS
        print(f"streamed {result.rows} messages in {result.batches} micro-batches to {result.output}",
              file=sys.stderr)
        return 0

    return run_job(PROG, stream, args)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="streaming.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
