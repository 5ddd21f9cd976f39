"""``reindex``: rebuild ``consumequeue/`` and ``index/`` from the commitlog, in parallel.

Stage 1 parses every split into dispatch requests (the columnar decoder, else the library's
``parse_dispatch_requests``, bodies never copied) and the index items the online indexer would put for
them (``IndexService``'s own collection code); each task spills them, packed, to a scratch file of its
split next to the output and returns only where each queue's units and its items lie there, so no
request crosses the JVM (no cached RDD read several times, no shuffle). Stage 2 builds each
topic-queue with ``ConsumeQueueStore.dispatch_columns`` (one task a queue) and each index file with
``IndexFile.put_columns`` (one task a file), all in one Spark job: a file holds exactly
``indexNum - 1`` items and starts from the previous file's last item, so the items a file gets follow
from the item counts per split, which the driver adds up. The output is what the online indexer
builds: ConsumeQueue files byte-identical, index files with identical headers and entries; index files
are named from their begin timestamp (the online indexer names them by creation time).

The commitlog's quarantined ranges (``config/quarantine.json`` next to ``commitlog/``: damaged records
its recovery stepped over) are what the online indexer learns from GetStoreInfo: no unit or index
entry points into them, and a queue whose record was lost there gets a filler unit at its queue offset
(ConsumeQueue.put_batch's ``lost``), so the output stays the online indexer's.

The output goes where the store keeps these files: ``indexer/`` in mqstore's layout, the root in
RocketMQ's (services.store.formats.store_layout), or under ``--output``. The geometry (mappedFileSizeConsumeQueue,
maxHashSlotNum, maxIndexNum) is the flags', else the settings' (``--config``, ``MQSTORE_*``), else
that of the files being replaced, else the defaults (services.store.formats.geometry).

Files are written through the local file system (local mode, or a path every executor mounts).
Run as ``mqstore pipeline reindex STORE`` or ``spark-submit pipeline/reindex.py STORE``.
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import struct
import sys
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, cast

import numpy as np

from pipeline.columnar import FastRecords, decode_fast, pc
from pipeline.failures import run_job
from pipeline.scan import StoreInput, splits_rdd
from pipeline.split_reader import (
    DEFAULT_SPLIT_SIZE,
    GAP_CORRUPT,
    Gap,
    MappedSplit,
    Split,
    iter_record_positions,
    scan_split,
)
from services.store.formats.consume_queue import ConsumeQueueStore
from services.store.formats.dispatch_columns import DispatchColumns, cached_column
from services.store.formats.geometry import GeometryOptions, add_geometry_arguments, options_of
from services.store.formats.index_file import (
    IndexColumns,
    IndexFile,
    IndexHeader,
    index_file_name,
    next_index_file_name,
)
from services.store.formats.index_service import IndexService
from services.store.formats.message import SCHEDULE_TOPIC, TRANSACTION_TYPE_MASK, tags_code
from services.store.formats.quarantine import QuarantinedRange, QuarantineTable
from services.store.formats.record import DispatchRequest, RecordError, check_record, parse_dispatch_requests

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_ITEM = struct.Struct(">iqq")  # key hash, commitlog offset, store timestamp: one packed index item
# commitlog offset, size, tags code, queue offset, sys flag, store timestamp: one queue request, packed
# (bytes cross the shuffle far cheaper than pickled tuples)
_REQUEST = struct.Struct(">qiqqiq")


@dataclass
class SplitDispatch:
    """What one split contributes: requests per topic-queue, packed index items, gaps."""

    index: int
    queues: dict[tuple[str, int], bytes]
    items: bytes
    records: int
    gaps: list[Gap]

    @property
    def item_count(self) -> int:
        return len(self.items) // _ITEM.size


@dataclass(frozen=True)
class IndexPiece:
    """Items ``[first, ...)`` (global numbering) of split ``split`` that go into one index file."""

    split: int
    first: int
    items: bytes


@dataclass(frozen=True)
class SpilledSplit:
    """Stage 1's answer for a split: where its pieces lie in its scratch file (``split-NNNNNN``: each
    queue's packed units, then the packed index items), and its counts and gaps."""

    index: int
    queues: dict[tuple[str, int], tuple[int, int]]  # topic-queue: (byte offset, length)
    items_at: int
    item_count: int
    records: int
    gaps: list[Gap]


def _scratch_file(scratch: str, split_index: int) -> Path:
    return Path(scratch) / f"split-{split_index:06d}"


def spill_split(split: Split, scratch: str, lost: Sequence[tuple[int, int]] = ()) -> SpilledSplit:
    """Stage 1's task: :func:`dispatch_split`, written to the split's scratch file (a temporary name of
    this attempt, renamed: a retried task replaces it whole)."""
    dispatch = dispatch_split(split, lost)
    path = _scratch_file(scratch, split.index)
    temp = path.with_name(f".{path.name}.{os.getpid()}-{uuid.uuid4().hex}")
    queues: dict[tuple[str, int], tuple[int, int]] = {}
    at = 0
    with open(temp, "wb") as handle:
        for key, units in dispatch.queues.items():
            handle.write(units)
            queues[key] = (at, len(units))
            at += len(units)
        handle.write(dispatch.items)
    os.replace(temp, path)
    return SpilledSplit(split.index, queues, at, dispatch.item_count, dispatch.records, dispatch.gaps)


def _read(scratch: str, split_index: int, at: int, length: int) -> bytes:
    with open(_scratch_file(scratch, split_index), "rb") as handle:
        handle.seek(at)
        return handle.read(length)


@dataclass(frozen=True)
class BuildTask:
    """Stage 2's task: a topic-queue (``key``) from its pieces (split, byte offset, length), or index
    file ``file_number`` from item ranges (split, first item's global number, byte offset, length)."""

    key: tuple[str, int] | None
    file_number: int
    pieces: tuple[tuple[int, ...], ...]


def run_build(task: BuildTask, scratch: str, cq_root: str, index_dir: str, cq_file_size: int, per_file: int,
              hash_slot_num: int, index_num: int, lost: Sequence[tuple[int, int]]
              ) -> tuple[int, tuple[int, IndexHeader] | None]:
    """(units written, None) for a queue; (0, (file number, header)) for an index file."""
    if task.key is not None:
        pieces = [(split, _read(scratch, split, at, length)) for split, at, length in task.pieces]
        return build_queue(task.key, pieces, cq_root, cq_file_size, lost), None
    items = [IndexPiece(split, first, _read(scratch, split, at, length)) for split, first, at, length in task.pieces]
    return 0, build_index_file(task.file_number, items, index_dir, per_file, hash_slot_num, index_num)


def index_tasks(spilled: Sequence[SpilledSplit], per_file: int) -> list[BuildTask]:
    """One task per index file, naming the item ranges of every split that go into it (as
    :func:`index_pieces` cuts them): a file also gets the item before its own, the previous file's last."""
    total = sum(s.item_count for s in spilled)
    files = (total + per_file - 1) // per_file
    pieces: dict[int, list[tuple[int, ...]]] = {f: [] for f in range(files)}
    first_item = 0
    for split in sorted(spilled, key=lambda s: s.index):
        last = first_item + split.item_count
        file_number = first_item // per_file
        while split.item_count and file_number < files and file_number * per_file - 1 < last:
            lo = max(file_number * per_file - 1, 0, first_item)
            hi = min((file_number + 1) * per_file, last)
            if lo < hi:
                pieces[file_number].append((split.index, lo, split.items_at + (lo - first_item) * _ITEM.size,
                                            (hi - lo) * _ITEM.size))
            file_number += 1
        first_item = last
    return [BuildTask(None, f, tuple(p)) for f, p in pieces.items()]


def queue_tasks(spilled: Sequence[SpilledSplit]) -> list[BuildTask]:
    """One task per topic-queue, with its pieces from every split."""
    pieces: dict[tuple[str, int], list[tuple[int, ...]]] = {}
    for split in spilled:
        for key, (at, length) in split.queues.items():
            pieces.setdefault(key, []).append((split.index, at, length))
    return [BuildTask(key, 0, tuple(p)) for key, p in sorted(pieces.items())]


@dataclass(frozen=True)
class ReindexResult:
    records: int
    queues: int
    cq_units: int
    index_files: list[tuple[str, IndexHeader]]
    gaps: list[Gap]


def _requests(view: memoryview, split: Split, start: int, end: int) -> list[DispatchRequest]:
    """Requests of a run of whole records: one batched parse, or record by record if it fails."""
    try:
        return parse_dispatch_requests(view[start:end], split.file_offset + start)
    except RecordError:
        requests = []
        position = start
        while position < end:
            request = check_record(view, position, check_crc=False)
            if not request.success or request.msg_size <= 0:
                break
            requests.append(request)
            position += request.msg_size
        return requests


_REQUEST_DTYPE = np.dtype([("commitlog_offset", ">i8"), ("size", ">i4"), ("tags_code", ">i8"),
                           ("queue_offset", ">i8"), ("sys_flag", ">i4"), ("store_timestamp", ">i8")])
_ITEM_DTYPE = np.dtype([("key_hash", ">i4"), ("phy_offset", ">i8"), ("store_timestamp", ">i8")])
assert _REQUEST_DTYPE.itemsize == _REQUEST.size and _ITEM_DTYPE.itemsize == _ITEM.size


def _pack_items(items: IndexColumns) -> bytes:
    packed = np.empty(items.key_hash.size, dtype=_ITEM_DTYPE)
    packed["key_hash"], packed["phy_offset"], packed["store_timestamp"] = items
    return packed.tobytes()


class FastDispatchColumns(DispatchColumns):
    """A run's DispatchColumns made from the columnar decoder's arrays (pipeline/columnar.py) instead
    of DispatchRequest objects: what ``parse_dispatch_requests`` would have given, field for field.
    ``requests`` is only built if the library falls back to its per-record path."""

    def __init__(self, fast: FastRecords, tags_codes: np.ndarray, uniq: list[str | None],
                 keys: list[str | None]) -> None:
        f = fast.fields
        self.count = n = fast.positions.size
        self.fast = fast
        self.__dict__.update(
            commitlog_offset=f["commitlog_offset"].astype(np.int64), msg_size=f["store_size"].astype(np.int64),
            tags_code=tags_codes, queue_offset=f["queue_offset"].astype(np.int64),
            store_timestamp=f["store_ms"].astype(np.int64),
            transaction_type=f["sys_flag"].astype(np.int64) & TRANSACTION_TYPE_MASK,
            queue_id=f["queue_id"].astype(np.int64), all_success=True, uniq_keys=uniq, keys=keys)
        topics = fast.topic.to_pylist()
        self.__dict__["topics"] = topics
        self.__dict__["single_topic"] = topics[0] if n and topics.count(topics[0]) == n else None
        self.sys_flags = f["sys_flag"].astype(np.int64)

    @cached_column
    def requests(self) -> list[DispatchRequest]:  # type: ignore[override]
        return [DispatchRequest(True, size, topic, queue_id, offset, queue_offset, tags, timestamp, keys, uniq,
                                sys_flag, 0)
                for size, topic, queue_id, offset, queue_offset, tags, timestamp, keys, uniq, sys_flag in zip(
                    self.msg_size.tolist(), self.topics, self.queue_id.tolist(), self.commitlog_offset.tolist(),
                    self.queue_offset.tolist(), self.tags_code.tolist(), self.store_timestamp.tolist(),
                    self.keys, self.uniq_keys, self.sys_flags.tolist(), strict=True)]


def _fast_columns(view: memoryview, split: Split, start: int, end: int) -> DispatchColumns | None:
    """The run ``[start, end)`` as DispatchColumns through the columnar decoder, or None when any of
    its records needs the per-record path (an uncommon layout, or the schedule topic, whose tags code
    depends on DELAY): then the whole run takes it, so a damaged run ends where it always did."""
    positions = np.fromiter(iter_record_positions(view, [(start, end)]), dtype=np.int64)
    fast = decode_fast(view, positions, False, bodies=False)
    if fast.slow or not fast.positions.size:
        return None
    if bool(pc.any(pc.equal(fast.topic, SCHEDULE_TOPIC)).as_py()):
        return None
    props = fast.properties
    tags = pc.dictionary_encode(props.lookup("TAGS"))
    codes = np.array([tags_code(t) for t in tags.dictionary.to_pylist()] + [0], dtype=np.int64)
    tags_codes = codes[tags.indices.fill_null(len(tags.dictionary)).to_numpy()]
    return FastDispatchColumns(fast, tags_codes, props.lookup("UNIQ_KEY").to_pylist(),
                               props.lookup("KEYS").to_pylist())


def _outside(runs: Sequence[tuple[int, int]], file_offset: int,
             lost: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """The parts of ``runs`` (file positions) outside the ``lost`` commitlog ranges. A quarantined range
    runs from a record's start to the next valid record's, so the parts are whole records."""
    kept: list[tuple[int, int]] = []
    for start, end in runs:
        for lost_start, lost_end in lost:
            lost_start, lost_end = lost_start - file_offset, lost_end - file_offset
            if lost_end <= start or lost_start >= end:
                continue
            if lost_start > start:
                kept.append((start, lost_start))
            start = max(start, lost_end)
            if start >= end:
                break
        if start < end:
            kept.append((start, end))
    return kept


def dispatch_split(split: Split, lost: Sequence[tuple[int, int]] = ()) -> SplitDispatch:
    """Requests per topic-queue and index items of one split, as packed bytes. Each run of records
    becomes the library's DispatchColumns (from the columnar decoder, else ``parse_dispatch_requests``),
    which groups the queues and collects the index items with NumPy (the online indexer's columnar
    path), so no per-record struct packing or key hashing is left in Python. Records in the ``lost``
    (quarantined) commitlog ranges are left out."""
    queues: dict[tuple[str, int], bytearray] = {}
    items = bytearray()
    records = 0
    end_phy_offset = 0
    with MappedSplit(split) as view:
        layout = scan_split(view, split)
        for start, end in _outside(layout.runs, split.file_offset, lost):
            columns = _fast_columns(view, split, start, end)
            if columns is None:
                requests = _requests(view, split, start, end)
                if not requests:
                    continue
                columns = DispatchColumns(requests)
                sys_flags = np.array([r.sys_flag for r in requests], dtype=np.int64)
            else:
                sys_flags = cast(FastDispatchColumns, columns).sys_flags
            records += columns.count
            packed = np.empty(columns.count, dtype=_REQUEST_DTYPE)
            packed["commitlog_offset"] = columns.commitlog_offset
            packed["size"] = columns.msg_size
            packed["tags_code"] = columns.tags_code
            packed["queue_offset"] = columns.queue_offset
            packed["sys_flag"] = sys_flags
            packed["store_timestamp"] = columns.store_timestamp
            rows, bounds, keys = columns.queue_groups
            grouped = packed[rows]
            for i, key in enumerate(keys):
                units = queues.get(key)
                if units is None:
                    units = queues[key] = bytearray()
                units += grouped[bounds[i]:bounds[i + 1]].tobytes()
            # Offsets ascend within a split, so the skip rule (offset below the last file's end) never
            # drops anything here: end_phy_offset stays 0 as in the per-record path.
            collected = IndexService.collect_columns(columns, end_phy_offset)
            if collected is not None:
                items += _pack_items(collected)
    return SplitDispatch(split.index, {key: bytes(units) for key, units in queues.items()}, bytes(items), records,
                         layout.gaps)


class PackedQueueColumns(DispatchColumns):
    """One topic-queue's requests as the library's DispatchColumns, read straight from the packed
    units stage 1 shipped (NumPy views, no DispatchRequest objects). ``requests`` is only built if
    the library falls back to its per-record path (a chunk too small for NumPy to pay off)."""

    def __init__(self, topic: str, queue_id: int, packed: np.ndarray) -> None:
        self.packed, self.topic, self.queue_id_value = packed, topic, queue_id
        self.count = n = packed.size
        self.__dict__.update(
            commitlog_offset=packed["commitlog_offset"].astype(np.int64),
            msg_size=packed["size"].astype(np.int64), tags_code=packed["tags_code"].astype(np.int64),
            queue_offset=packed["queue_offset"].astype(np.int64),
            store_timestamp=packed["store_timestamp"].astype(np.int64),
            transaction_type=packed["sys_flag"].astype(np.int64) & TRANSACTION_TYPE_MASK,
            queue_id=np.full(n, queue_id, dtype=np.int64), all_success=True, topics=[topic] * n,
            single_topic=topic)

    @cached_column
    def requests(self) -> list[DispatchRequest]:  # type: ignore[override]
        return [DispatchRequest(True, size, self.topic, self.queue_id_value, offset, queue_offset, tags, timestamp,
                                None, None, sys_flag, 0)
                for offset, size, tags, queue_offset, sys_flag, timestamp in self.packed.tolist()]


def build_queue(key: tuple[str, int], pieces: Iterable[tuple[int, bytes]], root: str,
                cq_file_size: int, lost: Sequence[tuple[int, int]] = ()) -> int:
    """Write one topic-queue with the library's dispatcher (its columnar path), its requests in
    commitlog order; a queue offset whose record was ``lost`` gets a filler unit."""
    topic, queue_id = key
    store = ConsumeQueueStore(Path(root), cq_file_size)
    store.lost_ranges = tuple(lost)
    try:
        packed = np.frombuffer(b"".join(units for _, units in sorted(pieces, key=lambda piece: piece[0])),
                               dtype=_REQUEST_DTYPE)
        return store.dispatch_columns(PackedQueueColumns(topic, queue_id, packed))
    finally:
        store.shutdown()


def build_index_file(file_number: int, pieces: Iterable[IndexPiece], directory: str, per_file: int,
                     hash_slot_num: int, index_num: int) -> tuple[int, IndexHeader]:
    """Write index file ``file_number`` (a temporary name; the driver renames it)."""
    ordered = sorted(pieces, key=lambda piece: piece.first)
    first = ordered[0].first if ordered else 0
    packed = np.frombuffer(b"".join(piece.items for piece in ordered), dtype=_ITEM_DTYPE)
    prev_offset = prev_timestamp = 0
    if file_number > 0 and first == file_number * per_file - 1:
        prev_offset, prev_timestamp = int(packed["phy_offset"][0]), int(packed["store_timestamp"][0])
        packed = packed[1:]
    items = IndexColumns(packed["key_hash"].astype(np.int64), packed["phy_offset"].astype(np.int64),
                         packed["store_timestamp"].astype(np.int64))
    index = IndexFile(Path(directory) / f".reindex-{file_number:08d}", hash_slot_num, index_num, create=True,
                      prev_end_phy_offset=prev_offset, prev_end_timestamp=prev_timestamp)
    try:
        index.put_columns(items)
        index.flush()
        return file_number, index.header
    finally:
        index.close()


def _is_occupied(directory: Path) -> bool:
    return directory.exists() and any(directory.iterdir())


def _prepare(directory: Path) -> None:
    if _is_occupied(directory):
        shutil.rmtree(directory)
    directory.mkdir(parents=True, exist_ok=True)


@dataclass(frozen=True)
class ReindexInputs:
    """What reindex reads and where it writes, settled before Spark starts (a store that cannot be
    read, geometry that cannot be settled, or output it may not replace is refused at once)."""

    source: StoreInput
    splits: list[Split]
    cq_root: Path
    index_dir: Path
    cq_file_size: int
    hash_slot_num: int
    index_num: int

    @classmethod
    def of(cls, source: StoreInput, output: str | Path | None, split_size: int, force: bool) -> ReindexInputs:
        layout, geometry = source.layout, source.geometry
        splits = source.plan(split_size)
        # The files being replaced tell the geometry when neither flags nor settings do.
        cq_file_size = geometry.cq_file_size(layout.consume_queue_files(), layout.consumequeue)
        hash_slot_num, index_num = geometry.index_geometry(layout.index_files())
        target = Path(output) if output is not None else layout.logic_root
        cq_root, index_dir = target / "consumequeue", target / "index"
        for directory in (cq_root, index_dir):
            if _is_occupied(directory) and not force:
                raise FileExistsError(f"{directory} is not empty: pass --force to replace it")
        return cls(source, splits, cq_root, index_dir, cq_file_size, hash_slot_num, index_num)


def reindex(spark: SparkSession, store: str | Path | StoreInput | ReindexInputs, output: str | Path | None = None,
            *, split_size: int = DEFAULT_SPLIT_SIZE, cq_file_size: int | None = None,
            hash_slot_num: int | None = None, index_num: int | None = None, config_file: str | None = None,
            force: bool = False) -> ReindexResult:
    """Rebuild ``OUTPUT/consumequeue`` and ``OUTPUT/index`` (OUTPUT defaults to where the store's
    layout keeps them). Geometry values given here win over ``config_file`` and ``MQSTORE_*``."""
    if isinstance(store, ReindexInputs):
        inputs = store
    else:
        options = GeometryOptions(config_file, None, cq_file_size, hash_slot_num, index_num)
        inputs = ReindexInputs.of(StoreInput.open(store, options), output, split_size, force)
    splits, cq_root, index_dir = inputs.splits, inputs.cq_root, inputs.index_dir
    cq_file_size, hash_slot_num, index_num = inputs.cq_file_size, inputs.hash_slot_num, inputs.index_num
    _prepare(cq_root)
    _prepare(index_dir)
    quarantined = _quarantined(inputs.source)
    lost = tuple((r.start, r.end) for r in quarantined)
    scratch = index_dir.parent / f".reindex-scratch-{uuid.uuid4().hex}"
    scratch.mkdir(parents=True)
    try:
        spilled = splits_rdd(spark, splits).map(
            functools.partial(spill_split, scratch=str(scratch), lost=lost)).collect()
        per_file = index_num - 1
        tasks = index_tasks(spilled, per_file) + queue_tasks(spilled)  # index files first: the longest tasks
        build = functools.partial(run_build, scratch=str(scratch), cq_root=str(cq_root), index_dir=str(index_dir),
                                  cq_file_size=cq_file_size, per_file=per_file, hash_slot_num=hash_slot_num,
                                  index_num=index_num, lost=lost)
        results = spark.sparkContext.parallelize(tasks, max(len(tasks), 1)).map(build).collect() if tasks else []
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    records = sum(s.records for s in spilled)
    gaps = _with_quarantined([gap for s in spilled for gap in s.gaps], quarantined)
    queue_count = sum(1 for task in tasks if task.key is not None)
    cq_units = sum(units for units, _ in results)
    built = [header for _, header in results if header is not None]
    named = _name_index_files(index_dir, sorted(built))
    return ReindexResult(records, queue_count, cq_units, named, gaps)


def _quarantined(source: StoreInput) -> tuple[QuarantinedRange, ...]:
    """The ranges the commitlog's recovery quarantined (none for a remote store: its commitlog only)."""
    if source.remote is not None:
        return ()
    table = QuarantineTable(source.layout.commitlog.parent)
    table.load()
    return table.ranges


def _with_quarantined(gaps: list[Gap], quarantined: Sequence[QuarantinedRange]) -> list[Gap]:
    """The split readers' gaps and the quarantined ranges (one gap each: a range of garbage is a gap of
    the readers' too), in commitlog order."""
    seen = {gap.offset for gap in gaps}
    extra = [Gap(r.start, r.size, GAP_CORRUPT, f"QUARANTINED by the commitlog's recovery ({r.reason}): no unit or "
                 "index entry points into it, its queue offset holds a filler unit")
             for r in quarantined if r.start not in seen]
    return sorted([*gaps, *extra], key=lambda gap: gap.offset)


def _name_index_files(index_dir: Path, built: list[tuple[int, IndexHeader]]) -> list[tuple[str, IndexHeader]]:
    """Rename the temporary files in order: named by begin timestamp, strictly increasing."""
    named: list[tuple[str, IndexHeader]] = []
    previous = ""
    for file_number, header in built:
        name = index_file_name(header.begin_timestamp)
        if previous and name <= previous:
            name = next_index_file_name(previous)
        (index_dir / f".reindex-{file_number:08d}").rename(index_dir / name)
        named.append((name, header))
        previous = name
    return named


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("store", help="a store root, mqstore's or RocketMQ's (its commitlog/ is read)")
    parser.add_argument("--output", default=None,
                        help="write consumequeue/ and index/ here (default: where the store keeps them, "
                             "STORE/indexer for mqstore's layout, STORE for RocketMQ's)")
    parser.add_argument("--force", action="store_true", help="replace existing consumequeue/ and index/")
    parser.add_argument("--split-size", type=int, default=DEFAULT_SPLIT_SIZE, help="bytes per task")
    parser.add_argument("--master", default=None, help="Spark master (default local[*])")
    add_geometry_arguments(parser, commitlog=True, consumequeue=True, index=True)


def run(args: argparse.Namespace) -> int:
    return run_job("mqstore pipeline reindex", _run, args)


def _run(args: argparse.Namespace) -> int:
    from pipeline.session import get_session

    inputs = ReindexInputs.of(StoreInput.open(args.store, options_of(args)), args.output, args.split_size, args.force)
    result = reindex(get_session(args.master), inputs)
    print(f"reindexed {result.records} records: {result.cq_units} units in {result.queues} consume queues, "
          f"{len(result.index_files)} index files")
    for gap in result.gaps:
        if gap.kind != "zeros":
            print(f"warning: commitlog offset {gap.offset}: {gap.reason}", file=sys.stderr)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mqstore pipeline reindex", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    # Through the package, so workers import the job's functions instead of unpickling __main__'s copies.
    from pipeline.reindex import main as package_main

    sys.exit(package_main())
