"""Spark plumbing shared by the jobs: the store a job reads (layout and geometry, settled at the
driver; a local path, a ``file://`` URI or a remote Hadoop URI, see pipeline/fs.py), splits as a
DataFrame (one partition per split) and a summary accumulator through which workers report what is
not a row (gaps, undecodable records, counts)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from pyspark.accumulators import AccumulatorParam

from pipeline.fs import RemoteFile, list_remote_commitlog, parse_location
from pipeline.progress import Progress
from pipeline.split_reader import (
    Gap,
    MappedSplit,
    Split,
    data_end,
    iter_record_positions,
    plan_splits,
    scan_split,
    without_zero_tail,
)
from services.store.formats.commitlog_walk import CommitLogFile, list_commitlog_files
from services.store.formats.geometry import COMMITLOG_FILE_SIZE, GeometryOptions, StoreGeometry
from services.store.formats.message import MessageRecord
from services.store.formats.record import RecordError, decode_record
from services.store.formats.store_layout import ROCKETMQ, StoreLayout, resolve_store

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark import RDD, Accumulator
    from pyspark.sql import DataFrame, SparkSession

T = TypeVar("T")

SPLIT_COLUMNS = "index INT, path STRING, file_offset BIGINT, file_size BIGINT, start BIGINT, end BIGINT"


@dataclass(frozen=True)
class StoreInput:
    """The store a job reads: where its files are (either layout) and their geometry (flags, settings,
    then the files), resolved once at the driver so tasks never guess. A remote store (``remote``: its
    commitlog files, listed through Hadoop's FileSystem) offers its commitlog only; its ``layout``
    refuses ConsumeQueue and index access with a message saying to mount it."""

    layout: StoreLayout
    geometry: StoreGeometry
    remote: tuple[RemoteFile, ...] | None = None
    name: str = ""  # the store as a path or URI
    remote_commitlog: str = ""  # a remote store's commitlog URI (a Path would fold its "//")

    @classmethod
    def open(cls, store: str | Path | StoreInput, options: GeometryOptions | None = None,
             environ: Mapping[str, str] | None = None, spark: SparkSession | None = None) -> StoreInput:
        """The store at ``store``: a path, a ``file://`` URI, or a remote URI (listed through the driver's
        SparkSession, ``spark`` or the configured one, see pipeline/session.py)."""
        if isinstance(store, StoreInput):
            return store
        location = parse_location(store)
        geometry = StoreGeometry(options, environ)
        if location.local is not None:
            layout = resolve_store(location.local)
            return cls(layout, geometry, None, str(layout.root))
        if spark is None:
            from pipeline.session import get_session

            spark = get_session()
        given = geometry.given.get(COMMITLOG_FILE_SIZE[0])
        commitlog, files = list_remote_commitlog(spark, location, given.value if given else None)
        layout = StoreLayout(Path(location.uri), ROCKETMQ, Path(commitlog), None,
                             f"{location.text}: ConsumeQueue and index files are read from a local path or file:// "
                             "URI only (mount the store on every node); export and stats read remote stores")
        return cls(layout, geometry, tuple(files), location.uri, commitlog)

    def commitlog_files(self) -> list[CommitLogFile]:
        if self.remote is not None:
            return [CommitLogFile(Path(f.uri), f.start_offset, f.size) for f in self.remote]
        commitlog = self.layout.require_commitlog()
        return list_commitlog_files(commitlog, self.geometry.commitlog_file_size(commitlog))

    @property
    def commitlog_name(self) -> str:
        """The commitlog directory, as a path or URI (for state files and reports)."""
        return self.remote_commitlog if self.remote is not None else str(self.layout.commitlog.resolve())

    def plan(self, split_size: int, from_offset: int = 0) -> list[Split]:
        splits = plan_splits(self.layout.commitlog, split_size, from_offset, self.commitlog_files())
        if self.remote is None:
            splits = without_zero_tail(splits)
        Progress.expect(sum(split.end - split.start for split in splits), len(splits))
        if self.remote is None:
            return splits
        uris = {str(Path(f.uri)): f.uri for f in self.remote}  # Path() folds "//"; the split keeps the URI
        return [replace(split, path=uris[split.path]) for split in splits]

    def data_bytes(self) -> int:
        """Commitlog bytes up to the last non-zero byte (a remote store: its files' sizes): what a
        whole scan reads, which sizes the job (pipeline/session.py), not the preallocated files."""
        files = self.commitlog_files()
        if self.remote is not None or not files:
            return sum(f.size for f in files)
        for file in reversed(files):
            end = data_end(file.path, file.size)
            if end:
                return file.start_offset + end - files[0].start_offset
        return 0

    def planned_bytes(self, from_offset: int = 0) -> int:
        """Commitlog bytes a scan from ``from_offset`` covers (for progress: MB/s)."""
        return sum(max(f.end_offset - max(f.start_offset, from_offset), 0) for f in self.commitlog_files())


@dataclass(frozen=True, slots=True)
class SplitTally:
    """What one split decoded: records, their bytes, and the sum of their commitlog offsets (which a
    job compares with what it wrote)."""

    records: int = 0
    record_bytes: int = 0
    offset_sum: int = 0


@dataclass
class ScanSummary:
    """Merged across tasks: counts per split, the end of the last record and the problems (gaps and
    records that do not decode). Everything is keyed (split index, offset), so a task that runs twice
    (a retry, a recomputed stage) is counted once."""

    splits: dict[int, SplitTally] = field(default_factory=dict)
    max_end: int = -1
    gaps: dict[int, Gap] = field(default_factory=dict)
    bad_records: dict[int, str] = field(default_factory=dict)

    @property
    def records(self) -> int:
        return sum(tally.records for tally in self.splits.values())

    @property
    def record_bytes(self) -> int:
        return sum(tally.record_bytes for tally in self.splits.values())

    @property
    def offset_sum(self) -> int:
        return sum(tally.offset_sum for tally in self.splits.values())

    def merge(self, other: ScanSummary) -> ScanSummary:
        self.splits.update(other.splits)
        self.max_end = max(self.max_end, other.max_end)
        self.gaps.update(other.gaps)
        self.bad_records.update(other.bad_records)
        return self

    @property
    def corrupt_gaps(self) -> list[Gap]:
        return [gap for _, gap in sorted(self.gaps.items()) if gap.kind != "zeros"]

    def holes(self) -> list[Gap]:
        """Zero gaps with a record after them: data is missing there."""
        return [gap for _, gap in sorted(self.gaps.items())
                if gap.kind == "zeros" and gap.offset < self.max_end]

    def problems(self) -> list[dict[str, Any]]:
        """Every inconsistency, for reports: corrupt regions, holes and undecodable records."""
        found: list[dict[str, Any]] = [{"offset": gap.offset, "length": gap.length, "kind": gap.kind,
                                        "reason": gap.reason} for gap in self.corrupt_gaps + self.holes()]
        found += [{"offset": offset, "kind": "bad-record", "reason": reason}
                  for offset, reason in sorted(self.bad_records.items())]
        return sorted(found, key=lambda problem: int(problem["offset"]))

    def as_json(self) -> dict[str, Any]:
        return {"records": self.records, "record_bytes": self.record_bytes, "max_end": self.max_end,
                "gaps": [asdict(gap) for _, gap in sorted(self.gaps.items())],
                "problems": self.problems()}


class _SummaryParam(AccumulatorParam[ScanSummary]):
    def zero(self, value: ScanSummary) -> ScanSummary:
        return ScanSummary()

    def addInPlace(self, value1: ScanSummary, value2: ScanSummary) -> ScanSummary:  # noqa: N802 (Spark's name)
        return value1.merge(value2)


def summary_accumulator(spark: SparkSession) -> Accumulator[ScanSummary]:
    return spark.sparkContext.accumulator(ScanSummary(), _SummaryParam())


def split_rows(splits: list[Split]) -> list[tuple[int, str, int, int, int, int]]:
    return [(s.index, s.path, s.file_offset, s.file_size, s.start, s.end) for s in splits]


def splits_rdd(spark: SparkSession, splits: list[Split]) -> RDD[Split]:
    """One partition per split, so Spark schedules (and retries) each byte range on its own."""
    return spark.sparkContext.parallelize(splits, max(len(splits), 1))


def splits_frame(spark: SparkSession, splits: list[Split]) -> DataFrame:
    rows = spark.sparkContext.parallelize(split_rows(splits), max(len(splits), 1))
    return spark.createDataFrame(rows, SPLIT_COLUMNS)


def splits_of_batches(batches: Iterator[pa.RecordBatch]) -> Iterator[Split]:
    """The splits carried by mapInArrow's input batches."""
    for batch in batches:
        columns = batch.to_pydict()
        yield from (Split(*values) for values in zip(
            columns["index"], columns["path"], columns["file_offset"], columns["file_size"],
            columns["start"], columns["end"], strict=True))


def decoded_records(split: Split, summary: ScanSummary,
                    convert: Callable[[MessageRecord], T]) -> Iterator[tuple[int, MessageRecord, T]]:
    """(commitlog offset, record, ``convert(record)``) of every record the split owns. Gaps, and
    records that do not decode (or that ``convert`` refuses with ValueError), go to ``summary`` with
    their offsets; the rest are counted there, under the split's index. The jobs' one way of walking a
    split."""
    records = record_bytes = offset_sum = 0
    with MappedSplit(split) as view:  # a remote file is fetched (pipeline/fs.py)
        layout = scan_split(view, split)
        summary.gaps.update((gap.offset, gap) for gap in layout.gaps)
        for position in iter_record_positions(view, layout.runs):
            offset = split.file_offset + position
            try:
                record = decode_record(view, position)
                converted = convert(record)
            except (RecordError, ValueError) as exc:
                summary.bad_records[offset] = str(exc).partition(": ")[2] or str(exc)
                continue
            records += 1
            record_bytes += record.store_size
            offset_sum += offset
            summary.max_end = max(summary.max_end, offset + record.store_size)
            yield offset, record, converted
    summary.splits[split.index] = SplitTally(records, record_bytes, offset_sum)


def no_conversion(record: MessageRecord) -> None:
    """For :func:`decoded_records` callers that need only the record."""
