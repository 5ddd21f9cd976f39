"""Where a store's files are, for every offline tool (``mqstore inspect``, the pipeline jobs).

Two layouts hold the same file formats:

* mqstore's: the commitlog service owns the root (``commitlog/``, ``config/queue_offsets.json``...)
  and the indexer its own root below it: ``<root>/indexer/consumequeue``, ``<root>/indexer/index``;
* RocketMQ's: ``<root>/commitlog``, ``<root>/consumequeue``, ``<root>/index``.

They are told apart by what the root holds, so no tool needs a flag: ``indexer/`` or mqstore's
``config/queue_offsets.json`` mean mqstore's layout, ``consumequeue/`` or ``index/`` RocketMQ's, and a
root with none of them (a bare commitlog) is read as RocketMQ's. A root with marks of both has no
ConsumeQueue or index directory a tool may trust (either answer could read stale files): asking for
them raises, while its commitlog stays readable. A commitlog directory given in place of the root
stands for its parent.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from services.store.formats.index_file import is_index_file_name

MQSTORE = "mqstore"
ROCKETMQ = "rocketmq"
BOTH = "both"  # marks of both layouts: only the commitlog is readable
COMMITLOG_DIR = "commitlog"
CONSUMEQUEUE_DIR = "consumequeue"
INDEX_DIR = "index"
INDEXER_DIR = "indexer"  # the indexer service's own root inside an mqstore store
QUEUE_OFFSETS_FILE = ("config", "queue_offsets.json")  # written by mqstore's commitlog service only
_STORE_FILE_NAME = re.compile(r"[0-9]{20}")


class StoreLayoutError(Exception):
    """A path that is not a store (or whose layout is ambiguous); the message says what to fix."""


@dataclass(frozen=True, slots=True)
class StoreLayout:
    """The directories of one store. ``logic_root`` holds ``consumequeue/`` and ``index/`` (None, with
    ``conflict`` saying why, when the root holds both layouts)."""

    root: Path
    kind: str
    commitlog: Path
    logic: Path | None
    conflict: str = ""

    @property
    def logic_root(self) -> Path:
        if self.logic is None:
            raise StoreLayoutError(self.conflict)
        return self.logic

    @property
    def consumequeue(self) -> Path:
        return self.logic_root / CONSUMEQUEUE_DIR

    @property
    def index(self) -> Path:
        return self.logic_root / INDEX_DIR

    def index_files(self) -> list[Path]:
        """The index files, oldest first (names are their begin times)."""
        if not self.index.is_dir():
            return []
        return sorted(p for p in self.index.iterdir() if p.is_file() and is_index_file_name(p.name))

    def consume_queue_files(self) -> Iterator[Path]:
        """Every ConsumeQueue file, under ``consumequeue/<topic>/<queue id>/``."""
        if not self.consumequeue.is_dir():
            return
        for topic in self.consumequeue.iterdir():
            for queue in topic.iterdir() if topic.is_dir() else ():
                if queue.is_dir():
                    yield from (p for p in queue.iterdir() if _STORE_FILE_NAME.fullmatch(p.name) and p.is_file())

    def require_commitlog(self) -> Path:
        """The commitlog directory, or StoreLayoutError naming what was looked for."""
        if not self.commitlog.is_dir():
            raise StoreLayoutError(f"{self.root}: no commitlog directory ({self.commitlog} is missing); "
                                   "pass a store root or its commitlog directory")
        return self.commitlog


def is_commitlog_dir(path: Path) -> bool:
    """A commitlog directory itself (not a root): named ``commitlog``, or holding commitlog files."""
    if not path.is_dir() or (path / COMMITLOG_DIR).is_dir():
        return False
    return path.name == COMMITLOG_DIR or any(_STORE_FILE_NAME.fullmatch(p.name) and p.is_file()
                                             for p in path.iterdir())


def looks_like_store_root(path: Path) -> bool:
    """Whether ``path`` holds any of a store root's directories (either layout)."""
    return path.is_dir() and any((path / name).is_dir()
                                 for name in (COMMITLOG_DIR, CONSUMEQUEUE_DIR, INDEX_DIR, INDEXER_DIR))


def resolve_store(path: str | Path) -> StoreLayout:
    """The layout of the store at ``path`` (a store root, or its commitlog directory)."""
    given = Path(path)
    if not given.is_dir():
        raise StoreLayoutError(f"{given}: no such directory (pass a store root or its commitlog directory)")
    if is_commitlog_dir(given):
        root, commitlog = given.parent, given
    else:
        root, commitlog = given, given / COMMITLOG_DIR
    mqstore_marks = [str(p.relative_to(root)) for p in (root / INDEXER_DIR, root.joinpath(*QUEUE_OFFSETS_FILE))
                     if p.exists()]
    rocketmq_marks = [name for name in (CONSUMEQUEUE_DIR, INDEX_DIR) if (root / name).is_dir()]
    if mqstore_marks and rocketmq_marks:
        return StoreLayout(root, BOTH, commitlog, None, (
            f"{root} holds both mqstore's layout ({', '.join(mqstore_marks)}) and RocketMQ's "
            f"({', '.join(n + '/' for n in rocketmq_marks)}): remove the stale one (mqstore keeps ConsumeQueue "
            f"and index files under {root / INDEXER_DIR})"))
    if mqstore_marks:
        return StoreLayout(root, MQSTORE, commitlog, root / INDEXER_DIR)
    return StoreLayout(root, ROCKETMQ, commitlog, root)
