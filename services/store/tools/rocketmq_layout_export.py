"""``mqstore export-rocketmq-store SRC DEST``: one RocketMQ 4.9.8 store directory from an mqstore store.

mqstore splits what a RocketMQ broker keeps under one ``storePathRootDir`` across its services: the
commitlog service's root (``commitlog/``, ``checkpoint``, ``config/topics.json``), the indexer's
(``indexer/``: ``consumequeue/``, ``index/``, its own ``checkpoint``) and the query service's
(``query/config/consumerOffset.json``). Each checkpoint holds only its own service's timestamps, so
neither is the one RocketMQ needs. The export lays them out as one broker store::

    DEST/commitlog/      the commitlog files
    DEST/consumequeue/   the indexer's ConsumeQueue files (byte-identical to RocketMQ's)
    DEST/index/          the indexer's IndexFiles
    DEST/checkpoint      physicMsgTimestamp from the commitlog's, logics/index from the indexer's
    DEST/config/         topics.json, consumerOffset.json, delayOffset.json (RocketMQ's JSON shapes)

Files are hard-linked when DEST is on SRC's filesystem, except the newest file of each directory:
that is the only file either store still writes into, and a hard link would make the two stores
write into each other. Everything else is read only: SRC is never modified, and its services are
kept from starting while the export runs (its lock files are held, without writing to them). A
failed or interrupted export removes what it wrote, so DEST is never left half made.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from services.store.errors import StoreError
from services.store.formats.checkpoint import StoreCheckpoint, read_checkpoint
from services.store.formats.commitlog_walk import CommitLogError, list_commitlog_files
from services.store.formats.consumer_offsets_file import FILE_NAME as CONSUMER_OFFSET_FILE
from services.store.formats.consumer_offsets_file import read_offset_table
from services.store.formats.delay_offsets_file import FILE_NAME, read_delay_offsets
from services.store.formats.index_file import IndexFileError
from services.store.formats.message import SCHEDULE_TOPIC
from services.store.formats.topics_file import FILE_NAME as TOPICS_FILE
from services.store.formats.topics_file import read_topics
from services.store.rules.transaction_records import CHECK_OFFSETS_FILE, check_consumer_offsets
from services.store.store_root import ABORT_FILE, LOCK_FILE, fsync_dir
from services.store.tools.inspect_index import infer_geometry

INDEXER_DIR = "indexer"
QUERY_DIR = "query"
COMMITLOG_DIR = "commitlog"
CONSUME_QUEUE_DIR = "consumequeue"
INDEX_DIR = "index"
CONFIG_DIR = "config"
CHECKPOINT_FILE = "checkpoint"
DELAY_OFFSET_FILE = FILE_NAME  # delayOffset.json
#: the scheduler's root inside an mqstore store (``mqstore up``)
SCHEDULER_DIR = "scheduler"
COPY_CHUNK = 8 * 1024 * 1024
_ROCKETMQ_DEFAULTS = {"topicFilterType": "SINGLE_TAG", "topicSysFlag": 0, "order": False}


class ExportError(Exception):
    """The export cannot be done; the message is one line saying why and what to do."""


@dataclass(frozen=True, slots=True)
class SourceStore:
    """The roots of one mqstore store: ``mqstore up --store ROOT`` puts the indexer and the query
    service under ROOT; services run alone (``mqstore serve``) may have their roots elsewhere."""

    root: Path
    indexer_root: Path
    query_root: Path

    @classmethod
    def at(cls, root: str | Path, indexer_root: str | Path | None = None,
           query_root: str | Path | None = None) -> SourceStore:
        base = Path(root)
        return cls(base, Path(indexer_root) if indexer_root else base / INDEXER_DIR,
                   Path(query_root) if query_root else base / QUERY_DIR)

    def roots(self) -> list[tuple[str, Path]]:
        return [("commitlog service", self.root), ("indexer", self.indexer_root), ("query service", self.query_root)]


@dataclass(slots=True)
class Progress:
    """What has been written so far; handed to the progress callback."""

    files_done: int = 0
    files_total: int = 0
    bytes_done: int = 0
    bytes_total: int = 0


@dataclass(slots=True)
class ExportSummary:
    dest: Path
    commitlog_files: int = 0
    consume_queue_files: int = 0
    consume_queues: int = 0
    index_files: int = 0
    bytes: int = 0
    linked: int = 0
    copied: int = 0
    checkpoint: tuple[int, int, int] = (0, 0, 0)
    topics: int = 0
    consumer_offsets: int = 0
    delay_levels: int = 0
    settings: dict[str, int] = field(default_factory=dict)

    def line(self) -> str:
        return (f"exported to {self.dest}: {self.commitlog_files} commitlog files, {self.consume_queue_files} "
                f"consumequeue files ({self.consume_queues} queues), {self.index_files} index files, "
                f"{_size(self.bytes)} ({self.linked} hard-linked, {self.copied} copied); checkpoint "
                f"physic={self.checkpoint[0]} logics={self.checkpoint[1]} index={self.checkpoint[2]}; "
                f"{self.topics} topics, {self.consumer_offsets} consumer offsets, {self.delay_levels} delay levels")

    def settings_line(self) -> str:
        """The broker settings RocketMQ must start with: it refuses files of another size."""
        given = " ".join(f"{name}={value}" for name, value in self.settings.items())
        return f"start RocketMQ 4.9.8 with storePathRootDir={self.dest} {given}".rstrip()


@dataclass(frozen=True, slots=True)
class _Transfer:
    source: Path
    target: Path  # relative to DEST
    size: int
    must_copy: bool  # the newest file of its directory: still written by whichever store runs on it


def export_rocketmq_store(source: SourceStore, dest: str | Path, *, copy: bool = False,
                          progress: Callable[[Progress], None] | None = None,
                          progress_interval_s: float = 1.0) -> ExportSummary:
    """Write the RocketMQ layout of ``source`` into ``dest`` (absent or an empty directory).

    Raises ExportError before writing anything when the source is not a cleanly stopped mqstore store
    or DEST is not empty; ``progress`` is called at most every ``progress_interval_s`` and once at the end.
    """
    dest = Path(dest)
    _check_source(source)
    _check_dest(dest, source)
    with ExitStack() as held:
        for name, root in source.roots():
            held.enter_context(_held_lock(name, root))
        _check_stopped_cleanly(source)
        transfers = _plan(source)
        summary = ExportSummary(dest)
        created = not dest.exists()
        try:
            _write(source, dest, transfers, copy, summary, progress, progress_interval_s)
        except BaseException:
            _remove_partial(dest, created)
            raise
    return summary


# -- checks ----------------------------------------------------------------------------------
def _check_source(source: SourceStore) -> None:
    root = source.root
    if not root.is_dir():
        raise ExportError(f"{root}: no such directory (give the store root that mqstore up --store was given)")
    if (root / CONSUME_QUEUE_DIR).is_dir():
        raise ExportError(f"{root} is already in RocketMQ's layout (it has {CONSUME_QUEUE_DIR}/ at its root): "
                          "RocketMQ loads it as it is")
    missing = [name for name in (COMMITLOG_DIR, CHECKPOINT_FILE) if not (root / name).exists()]
    if missing:
        raise ExportError(f"{root} is not an mqstore store: it has no {' and no '.join(missing)} "
                          "(give the store root that mqstore up --store was given)")
    if not (source.indexer_root / CHECKPOINT_FILE).is_file():
        raise ExportError(f"{source.indexer_root} is not the indexer's store (no {CHECKPOINT_FILE}): give the "
                          "indexer's root with --indexer, or run mqstore up on the store once to build it")


def _check_dest(dest: Path, source: SourceStore) -> None:
    if dest.exists():
        if not dest.is_dir():
            raise ExportError(f"{dest} exists and is not a directory: give a new or empty directory")
        if any(dest.iterdir()):
            raise ExportError(f"{dest} is not empty: give a new or empty directory (nothing is overwritten)")
    resolved = dest.resolve()
    for _, root in source.roots():
        if resolved == root.resolve() or root.resolve() in resolved.parents:
            raise ExportError(f"{dest} is inside the store {root}: give a directory outside it (SRC is never modified)")


@contextmanager
def _held_lock(name: str, root: Path) -> Iterator[None]:
    """Hold ``root``'s lock while exporting, so its service cannot start and write under us.

    StoreLock.acquire would write this process into the lock file; SRC must not change, so the file
    is opened read-only (flock does not need write access). A store never started has no lock file.
    """
    path = root / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip() or "an unknown process"
            raise ExportError(f"{root} is in use: its {name} is running ({holder}); stop it (Ctrl-C on "
                              "mqstore up) and export again") from None
        yield
    finally:
        os.close(fd)  # closing the only descriptor releases the flock


def _check_stopped_cleanly(source: SourceStore) -> None:
    for name, root in source.roots():
        if (root / ABORT_FILE).exists():
            raise ExportError(f"{root} did not stop cleanly ({root / ABORT_FILE} exists: its {name} crashed or was "
                              "killed): start mqstore up on the store and stop it with Ctrl-C, so recovery runs, "
                              "then export again")


# -- what to write ---------------------------------------------------------------------------
def _plan(source: SourceStore) -> list[_Transfer]:
    try:
        commitlog = list_commitlog_files(source.root / COMMITLOG_DIR)
    except CommitLogError as exc:
        raise ExportError(f"the commitlog cannot be exported: {exc}") from None
    transfers = [_Transfer(f.path, Path(COMMITLOG_DIR) / f.path.name, f.size, i == len(commitlog) - 1)
                 for i, f in enumerate(commitlog)]
    for name in (CONSUME_QUEUE_DIR, INDEX_DIR):
        transfers += _tree(source.indexer_root / name, Path(name))
    return transfers


def _tree(directory: Path, target: Path) -> list[_Transfer]:
    """Every file under ``directory`` (a missing directory has none: an indexer with nothing dispatched)."""
    if not directory.exists():
        return []
    found: list[_Transfer] = []
    for current, dirnames, filenames in os.walk(directory, onerror=_walk_error):
        dirnames.sort()
        here = Path(current)
        for index, name in enumerate(sorted(filenames)):
            path = here / name
            if path.is_symlink() or not path.is_file():
                raise ExportError(f"{path}: not a regular file; a store directory holds only its data files")
            found.append(_Transfer(path, target / here.relative_to(directory) / name, path.stat().st_size,
                                   index == len(filenames) - 1))
    return found


def _walk_error(exc: OSError) -> None:
    raise ExportError(f"cannot read {exc.filename}: {exc.strerror}")


# -- writing ---------------------------------------------------------------------------------
def _write(source: SourceStore, dest: Path, transfers: list[_Transfer], copy: bool, summary: ExportSummary,
           progress: Callable[[Progress], None] | None, progress_interval_s: float) -> None:
    state = Progress(files_total=len(transfers), bytes_total=sum(t.size for t in transfers))
    reporter = _Reporter(progress, progress_interval_s, state)
    for name in (COMMITLOG_DIR, CONSUME_QUEUE_DIR, INDEX_DIR, CONFIG_DIR):
        (dest / name).mkdir(parents=True, exist_ok=True)
    link = not copy
    for transfer in transfers:
        target = dest / transfer.target
        target.parent.mkdir(parents=True, exist_ok=True)
        if link and not transfer.must_copy:
            linked, link = _try_link(transfer.source, target)
        else:
            linked = False
        if not linked:
            _copy_file(transfer.source, target, reporter.copied_bytes)
        summary.linked += linked
        summary.copied += not linked
        reporter.file_done(0 if not linked else transfer.size)
    _count(transfers, summary)
    summary.checkpoint = _write_checkpoint(source, dest)
    summary.topics = _write_topics(source.root / CONFIG_DIR / TOPICS_FILE, dest / CONFIG_DIR / TOPICS_FILE)
    summary.consumer_offsets = _write_consumer_offsets(source.query_root / CONFIG_DIR / CONSUMER_OFFSET_FILE,
                                                       dest / CONFIG_DIR / CONSUMER_OFFSET_FILE,
                                                       source.root / SCHEDULER_DIR / CONFIG_DIR / CHECK_OFFSETS_FILE)
    summary.delay_levels = _write_delay_offsets(dest, source.root / SCHEDULER_DIR / CONFIG_DIR / DELAY_OFFSET_FILE)
    summary.settings = _settings(transfers)
    for directory in sorted({(dest / t.target).parent for t in transfers} | {dest, dest / CONFIG_DIR}):
        fsync_dir(directory)
    reporter.finish()


def _try_link(source: Path, target: Path) -> tuple[bool, bool]:
    """(linked, keep trying links). Another filesystem or one without hard links: copy from now on."""
    try:
        os.link(source, target)
    except OSError as exc:
        if exc.errno in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.EOPNOTSUPP):
            return False, exc.errno == errno.EMLINK
        raise
    return True, True


def _copy_file(source: Path, target: Path, advanced: Callable[[int], None]) -> None:
    """Copy the data, fsync, and keep the source's mode and times: RocketMQ's time lookups read
    ConsumeQueue mtimes, and its file expiry (fileReservedTime) reads every file's mtime. Store files
    are sparse (an older store's were allocated whole, their unwritten rest zeros): holes and zero
    chunks stay holes in the copy, which reads the same bytes and takes the disk its data takes."""
    stat = source.stat()
    size = stat.st_size
    with open(source, "rb") as src, open(target, "xb") as dst:
        in_fd, out_fd = src.fileno(), dst.fileno()
        os.ftruncate(out_fd, size)
        copied = 0
        for start, end in _data_ranges(in_fd, size):
            advanced(start - copied)  # a hole: nothing to copy
            offset = start
            while offset < end:
                chunk = os.pread(in_fd, min(COPY_CHUNK, end - offset), offset)
                if not chunk:
                    raise ExportError(f"{source} shrank to {offset} bytes while being copied: "
                                      "is a service running on it?")
                if chunk.count(0) != len(chunk):  # all zeros: left a hole
                    _write_all(out_fd, chunk, offset)
                offset += len(chunk)
                advanced(len(chunk))
            copied = end
        advanced(size - copied)
        os.fsync(out_fd)
    os.chmod(target, stat.st_mode & 0o7777)
    os.utime(target, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def _data_ranges(fd: int, size: int) -> Iterator[tuple[int, int]]:
    """The [start, end) ranges of ``fd`` that may hold data (SEEK_DATA / SEEK_HOLE); the whole file
    where the file system cannot tell."""
    offset = 0
    while offset < size:
        try:
            start = os.lseek(fd, offset, os.SEEK_DATA)
            end = min(os.lseek(fd, start, os.SEEK_HOLE), size)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # no data past offset
                return
            if exc.errno not in (errno.EINVAL, errno.EOPNOTSUPP):
                raise
            start, end = offset, size
        if start >= size:
            return
        yield start, end
        offset = end


def _write_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


def _write_checkpoint(source: SourceStore, dest: Path) -> tuple[int, int, int]:
    """One checkpoint: the commitlog's flush time, the indexer's ConsumeQueue and index times."""
    try:
        physic, _, _ = read_checkpoint(source.root / CHECKPOINT_FILE)
        _, logics, index = read_checkpoint(source.indexer_root / CHECKPOINT_FILE)
    except (OSError, ValueError) as exc:
        raise ExportError(f"cannot read a checkpoint: {exc}") from None
    checkpoint = StoreCheckpoint(dest / CHECKPOINT_FILE)
    checkpoint.physic_msg_timestamp, checkpoint.logics_msg_timestamp, checkpoint.index_msg_timestamp = \
        physic, logics, index
    checkpoint.close()
    return physic, logics, index


def _write_topics(source: Path, target: Path) -> int:
    """TopicConfigManager's file: TopicConfigSerializeWrapper as fastjson writes it (fields sorted by
    name, tab-indented). SCHEDULE_TOPIC_XXXX is left out: the broker declares it itself, with its 18
    queues, and a config read from the file would replace that."""
    try:
        topics = read_topics(source).topics  # the snapshot and the changes journalled since
    except (ValueError, KeyError, TypeError, StoreError) as exc:
        raise ExportError(f"the topics in {source}: {exc}; repair or restore {TOPICS_FILE}") from None
    config: dict[str, dict[str, Any]] = {}
    for name, fields in sorted(topics.items()):
        if name == SCHEDULE_TOPIC:
            continue
        try:
            read, write, perm = (int(fields[k]) for k in ("read_queue_nums", "write_queue_nums", "perm"))
        except (KeyError, TypeError, ValueError):
            raise ExportError(f"{source}: topic {name!r} lacks read_queue_nums/write_queue_nums/perm") from None
        config[name] = dict(sorted({"topicName": name, "readQueueNums": read, "writeQueueNums": write,
                                    "perm": perm, **_ROCKETMQ_DEFAULTS}.items()))
    wrapper = {"dataVersion": {"counter": 0, "timestamp": int(time.time() * 1000)}, "topicConfigTable": config}
    _write_json(target, wrapper)
    return len(config)


def _write_consumer_offsets(source: Path, target: Path, check_offsets: Path | None = None) -> int:
    """ConsumerOffsetManager's file: ``{"offsetTable": {"topic@group": {"queueId": offset}}}``. The query
    service already keeps that shape; queue ids stay quoted (strict JSON, which fastjson reads too).
    ``check_offsets``: the scheduler's transaction checker progress, RocketMQ's CID_RMQ_SYS_TRANS offsets
    of the half and op queues (so a broker does not check again what mqstore checked or discarded)."""
    try:
        raw = read_offset_table(source)  # the file and the commits its journal holds since
    except FileNotFoundError:
        raw = {}
    except (ValueError, StoreError) as exc:
        raise ExportError(f"the consumer offsets in {source}: {exc}; repair it or restore its .bak") from None
    table = {key: {str(q): o for q, o in sorted(queues.items())} for key, queues in sorted(raw.items())}
    if check_offsets is not None:
        try:
            table.update(check_consumer_offsets(check_offsets))
        except ValueError as exc:
            raise ExportError(f"{exc}; repair it or restore its .bak") from None
    _write_json(target, {"offsetTable": table})
    return sum(len(queues) for queues in table.values())


def _write_delay_offsets(dest: Path, scheduler_offsets: Path) -> int:
    """ScheduleMessageService's file, ``{"offsetTable": {level: offset}}``, when delayed messages exist.

    mqstore stores delayed messages in SCHEDULE_TOPIC_XXXX (queue = level - 1); its scheduler
    (``mqstore up``: ``ROOT/scheduler``) records how far each level was delivered in the same file
    and shape. A level it has not delivered from starts at offset 0: the broker delivers those
    messages, the ones already due at once.
    """
    schedule = dest / CONSUME_QUEUE_DIR / SCHEDULE_TOPIC
    if not schedule.is_dir():
        return 0
    try:
        delivered = read_delay_offsets(scheduler_offsets)
    except ValueError as exc:
        raise ExportError(f"{scheduler_offsets}: {exc}; repair it or restore its .bak") from None
    levels = sorted(int(q.name) + 1 for q in schedule.iterdir() if q.name.isdigit())
    _write_json(dest / CONFIG_DIR / DELAY_OFFSET_FILE,
                {"offsetTable": {str(level): delivered.get(level, 0) for level in levels}})
    return len(levels)


def _write_json(path: Path, document: dict[str, Any]) -> None:
    """fastjson's pretty format: tabs, no space after the colon."""
    with open(path, "x", encoding="utf-8") as file:
        file.write(json.dumps(document, indent="\t", separators=(",", ":"), ensure_ascii=False))
        file.flush()
        os.fsync(file.fileno())


def _count(transfers: list[_Transfer], summary: ExportSummary) -> None:
    queues = set()
    for transfer in transfers:
        summary.bytes += transfer.size
        kind = transfer.target.parts[0]
        if kind == COMMITLOG_DIR:
            summary.commitlog_files += 1
        elif kind == CONSUME_QUEUE_DIR:
            summary.consume_queue_files += 1
            queues.add(transfer.target.parent)
        else:
            summary.index_files += 1
    summary.consume_queues = len(queues)


def _settings(transfers: list[_Transfer]) -> dict[str, int]:
    """RocketMQ's MessageStoreConfig values the files were made with (its load refuses other sizes)."""
    sizes: dict[str, int] = {}
    for transfer in transfers:
        kind = transfer.target.parts[0]
        if kind == COMMITLOG_DIR:
            sizes.setdefault("mappedFileSizeCommitLog", transfer.size)
        elif kind == CONSUME_QUEUE_DIR:
            sizes.setdefault("mappedFileSizeConsumeQueue", transfer.size)
        elif "maxHashSlotNum" not in sizes:
            # Only RocketMQ's 1:4 ratio can be read off a size; otherwise the indexer's settings say.
            with suppress(IndexFileError):
                sizes["maxHashSlotNum"], sizes["maxIndexNum"] = infer_geometry(transfer.size)
    return sizes


def _remove_partial(dest: Path, created: bool) -> None:
    """DEST was empty (or absent) before the export: everything in it now is the export's."""
    if created:
        shutil.rmtree(dest, ignore_errors=True)
    elif dest.is_dir():
        for child in dest.iterdir():
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child, ignore_errors=True)
            else:
                child.unlink(missing_ok=True)


class _Reporter:
    def __init__(self, callback: Callable[[Progress], None] | None, interval_s: float, state: Progress) -> None:
        self._callback = callback
        self._interval_s = interval_s
        self._state = state
        self._last = time.monotonic()
        self._reported = (-1, -1)

    def copied_bytes(self, count: int) -> None:
        """Bytes of a file being copied: a 1 GiB commitlog file reports while it is copied."""
        self._state.bytes_done += count
        self._maybe_report()

    def file_done(self, linked_bytes: int) -> None:
        self._state.bytes_done += linked_bytes
        self._state.files_done += 1
        self._maybe_report()

    def finish(self) -> None:
        """The last line always says where it ended, unless it was just printed."""
        if self._callback is not None and self._reported != (self._state.files_done, self._state.bytes_done):
            self._report()

    def _maybe_report(self) -> None:
        if self._callback is not None and time.monotonic() - self._last >= self._interval_s:
            self._report()

    def _report(self) -> None:
        assert self._callback is not None
        self._last = time.monotonic()
        self._reported = (self._state.files_done, self._state.bytes_done)
        self._callback(self._state)


def progress_line(state: Progress) -> str:
    return (f"export: {state.files_done}/{state.files_total} files, "
            f"{_size(state.bytes_done)}/{_size(state.bytes_total)}")


def _size(count: int) -> str:
    if count < 1024:
        return f"{count} B"
    value = float(count)
    for unit in ("KiB", "MiB", "GiB"):
        value /= 1024
        if value < 1024 or unit == "GiB":
            break
    return f"{value:.1f} {unit}"


def main(source: SourceStore, dest: str, copy: bool, progress_interval_s: float) -> int:
    """The CLI: progress on stderr, the summary and the settings RocketMQ needs on stdout."""
    def show(state: Progress) -> None:
        print(progress_line(state), file=sys.stderr, flush=True)

    try:
        summary = export_rocketmq_store(source, dest, copy=copy, progress=show, progress_interval_s=progress_interval_s)
    except ExportError as exc:
        print(f"mqstore export-rocketmq-store: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"mqstore export-rocketmq-store: {exc.filename or dest}: {exc.strerror or exc} "
              f"(nothing was left in {dest})", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"mqstore export-rocketmq-store: interrupted (nothing was left in {dest})", file=sys.stderr)
        return 130
    print(summary.line())
    print(summary.settings_line())
    return 0
