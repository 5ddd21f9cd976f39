"""``mqstore inspect consumequeue DIR [--json]``: print the units of ConsumeQueue files offline.

DIR is a store root (mqstore's layout keeps the queues in ``indexer/consumequeue``, RocketMQ's in
``consumequeue``: services.store.formats.store_layout), a ``consumequeue`` directory, one topic's directory or
one queue's directory; mqstore's and RocketMQ's files are the same format. Every file must be
mappedFileSizeConsumeQueue bytes (``--config``/``MQSTORE_*`` or ``--cq-file-size``, else the size all
files have: services.store.formats.geometry). Files are only read, never written, so it is safe on a directory
a live store is using. A queue's data ends at its first invalid unit (commitlog offset < 0 or size
<= 0), the rule RocketMQ's recovery uses.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from services.store.formats.consume_queue import CQ_STORE_UNIT_SIZE, is_valid_unit
from services.store.formats.geometry import GeometryError, GeometryOptions, StoreGeometry
from services.store.formats.store_layout import StoreLayoutError, looks_like_store_root, resolve_store
from services.store.tools.inspect_output import SNAKE_CASE, json_line, silence_stdout, stdout_bytes, usage_error

PROG = "mqstore inspect consumequeue"
_FILE_NAME = re.compile(r"[0-9]{20}")
_UNIT = struct.Struct(">qiq")


class ConsumeQueueError(Exception):
    """A directory or file that cannot be read as a ConsumeQueue; the message says why."""


@dataclass(frozen=True, slots=True)
class QueueDir:
    topic: str
    queue_id: int
    path: Path


@dataclass(frozen=True, slots=True)
class CqUnit:
    topic: str
    queue_id: int
    queue_offset: int
    commitlog_offset: int
    size: int
    tags_code: int

    def row(self) -> dict[str, Any]:
        """The fixture dump's ``cq`` row, keys in its order."""
        return {"type": "cq", "topic": self.topic, "queueId": self.queue_id, "cqOffset": self.queue_offset,
                "phyOffset": self.commitlog_offset, "size": self.size, "tagsCode": self.tags_code}


def _queue_id(path: Path) -> int | None:
    name = path.name
    return int(name) if name.isdigit() and str(int(name)) == name else None


def _is_queue_dir(path: Path) -> bool:
    return _queue_id(path) is not None and not any(child.is_dir() for child in path.iterdir())


def _utf16_order(text: str) -> bytes:
    """Java String.compareTo order, which the dumps' topic order follows."""
    return text.encode("utf-16-be", "surrogatepass")


def _topic_queues(topic_dir: Path) -> list[QueueDir]:
    queues = [QueueDir(topic_dir.name, queue_id, child) for child in topic_dir.iterdir()
              if child.is_dir() and (queue_id := _queue_id(child)) is not None]
    return sorted(queues, key=lambda q: q.queue_id)


def find_queues(directory: Path) -> list[QueueDir]:
    """The queues under ``directory`` (a store root, a consumequeue root, a topic or a queue), in dump
    order."""
    if not directory.is_dir():
        raise ConsumeQueueError(f"{directory}: no such directory")
    if looks_like_store_root(directory):
        directory = resolve_store(directory).consumequeue
        if not directory.is_dir():
            raise ConsumeQueueError(f"{directory}: no such directory (the store has no ConsumeQueue files)")
    children = list(directory.iterdir())
    if any(_FILE_NAME.fullmatch(child.name) for child in children):
        queue_id = _queue_id(directory)
        if queue_id is None:
            raise ConsumeQueueError(f"{directory} holds ConsumeQueue files but its name is not a queue id")
        return [QueueDir(directory.parent.name, queue_id, directory)]
    subdirs = [child for child in children if child.is_dir()]
    if directory.name != "consumequeue" and subdirs and all(_is_queue_dir(child) for child in subdirs):
        return _topic_queues(directory)
    topics = sorted(subdirs, key=lambda path: _utf16_order(path.name))
    return [queue for topic_dir in topics for queue in _topic_queues(topic_dir)]


def _queue_files(queue: QueueDir) -> list[tuple[int, Path]]:
    """The queue's files in offset order."""
    files: list[tuple[int, Path]] = []
    for path in queue.path.iterdir():
        if not (_FILE_NAME.fullmatch(path.name) and path.is_file()):
            raise ConsumeQueueError(f"{path}: not a ConsumeQueue file (expected names of 20 digits)")
        files.append((int(path.name), path))
    return sorted(files)


def file_size_of(queues: list[QueueDir], where: Path, options: GeometryOptions | None = None) -> int:
    """mappedFileSizeConsumeQueue for these queues (found under ``where``): given, else the size all
    their files have."""
    files = [path for queue in queues for _, path in _queue_files(queue)]
    return StoreGeometry(options).cq_file_size(files, where)


def _checked_files(queue: QueueDir, size: int) -> list[tuple[int, Path]]:
    """The queue's files, checked to be one contiguous stream of ``size``-byte files."""
    files = _queue_files(queue)
    for index, (start, path) in enumerate(files):
        if path.stat().st_size != size:
            raise ConsumeQueueError(f"{path}: size {path.stat().st_size} differs from mappedFileSizeConsumeQueue "
                                    f"{size}")
        if start % size or (index and start != files[index - 1][0] + size):
            raise ConsumeQueueError(f"{path}: offset {start} does not follow the previous file (a gap)")
    return files


def iter_units(queue: QueueDir, file_size: int) -> Iterator[CqUnit]:
    """The queue's units from its first file on, up to the first invalid unit."""
    for start, path in _checked_files(queue, file_size):
        first = start // CQ_STORE_UNIT_SIZE
        for index, (offset, size, tags_code) in enumerate(_UNIT.iter_unpack(path.read_bytes())):
            if not is_valid_unit(offset, size):
                return
            yield CqUnit(queue.topic, queue.queue_id, first + index, offset, size, tags_code)


_COLUMNS = (("TOPIC", 26, False), ("QUEUE", 5, True), ("CQOFFSET", 10, True), ("PHYOFFSET", 14, True),
            ("SIZE", 10, True), ("TAGSCODE", 0, False))


def _table_line(values: tuple[str, ...]) -> str:
    cells = [value.rjust(width) if right else value.ljust(width)
             for value, (_, width, right) in zip(values, _COLUMNS, strict=True)]
    return "  ".join(cells).rstrip()


def _line(unit: CqUnit, as_json: bool, json_names: str = SNAKE_CASE) -> str:
    if as_json:
        return json_line(unit.row(), json_names)
    return _table_line((unit.topic, str(unit.queue_id), str(unit.queue_offset), str(unit.commitlog_offset),
                        str(unit.size), str(unit.tags_code)))


def _print(queues: list[QueueDir], file_size: int, as_json: bool, json_names: str) -> None:
    out = stdout_bytes()
    if not as_json:
        out.write((_table_line(tuple(name for name, _, _ in _COLUMNS)) + "\n").encode())
    count = 0
    for queue in queues:
        for unit in iter_units(queue, file_size):
            out.write((_line(unit, as_json, json_names) + "\n").encode())
            count += 1
    if not as_json:
        out.write(f"# {count} units in {len(queues)} queues\n".encode())
    out.flush()




def main(dir: str, as_json: bool, options: GeometryOptions | None = None, json_names: str = SNAKE_CASE) -> int:
    """Print every unit under ``dir``. Returns 0, or 2 after a one-line message on stderr."""
    try:
        queues = find_queues(Path(dir))
        _print(queues, file_size_of(queues, Path(dir), options), as_json, json_names)
    except BrokenPipeError:
        silence_stdout()  # the reader went away (``| head``): not an error
        return 0
    except (ConsumeQueueError, GeometryError, StoreLayoutError) as exc:
        return usage_error(PROG, str(exc))
    except OSError as exc:
        return usage_error(PROG, f"{dir}: {exc.strerror or exc}")
    return 0
