"""Store geometries for tests: the sizes of commitlog files, ConsumeQueue files and index files.

A storage defect often shows only where a structure is full: the commitlog rolls to its next file
behind a BLANK filler, a ConsumeQueue spans several files, an index file fills and the next one
starts. RocketMQ's defaults (1 GiB commitlog files, 300,000 units per ConsumeQueue file, 5,000,000
hash slots and 20,000,000 entries per index file) make all of that unreachable in a test, so tests
also run in ``SMALL``, where a few hundred messages cross every boundary. ``DEFAULT`` keeps the
settings every deployment runs with under test too.

The services read these as ``MQSTORE_*`` settings (``services/store/config.py``): :meth:`env` gives
them for a process, :meth:`config` for an in-process engine, :meth:`reindex_args` for ``mqstore
pipeline reindex``. Tests take the ``store_geometry`` fixture (``tests/conftest.py``) to run in both.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from services.store.config import MessageStoreConfig, load_config
from services.store.formats.consume_queue import CQ_STORE_UNIT_SIZE

KIB = 1024
#: Files with at least this much disk allocated count as preallocated store files.
LARGE_FILE_BYTES = 64 * KIB * KIB
_DEFAULTS = MessageStoreConfig()


@dataclass(frozen=True)
class GeometryPreset:
    """File sizes of one store; ``name`` is what a test id shows."""

    name: str
    commitlog_file_size: int
    cq_units_per_file: int
    hash_slot_num: int
    index_num: int
    max_message_size: int = _DEFAULTS.max_message_size

    @property
    def cq_file_size(self) -> int:
        """mappedFileSizeConsumeQueue: a whole number of 20-byte units."""
        return self.cq_units_per_file * CQ_STORE_UNIT_SIZE

    @property
    def index_items_per_file(self) -> int:
        """Index entries a file holds (entry 0 is never used: RocketMQ counts from 1)."""
        return self.index_num - 1

    @property
    def largest_body(self) -> int:
        """A body this large still fits one commitlog file (and maxMessageSize) with room for the
        topic and properties of a test message: the largest a workload should send."""
        return min(self.commitlog_file_size, self.max_message_size) - 1024

    def settings(self) -> dict[str, Any]:
        """The settings as MessageStoreConfig attributes."""
        return {"mapped_file_size_commit_log": self.commitlog_file_size,
                "mapped_file_size_consume_queue": self.cq_file_size,
                "max_hash_slot_num": self.hash_slot_num, "max_index_num": self.index_num,
                "max_message_size": self.max_message_size}

    def env(self) -> dict[str, str]:
        """The settings as ``MQSTORE_*`` environment variables, for a service process."""
        return {f"MQSTORE_{name.upper()}": str(value) for name, value in self.settings().items()}

    def config(self, **overrides: Any) -> MessageStoreConfig:
        """A MessageStoreConfig of this geometry (the environment ignored), for an in-process engine."""
        return load_config(environ={}, **{**self.settings(), **overrides})

    def reindex_args(self) -> list[str]:
        """The geometry options of ``mqstore pipeline reindex``."""
        return ["--cq-file-size", str(self.cq_file_size), "--hash-slot-num", str(self.hash_slot_num),
                "--index-num", str(self.index_num)]


#: Rolls in every test: 64 KiB commitlog files, 300 units per ConsumeQueue file, index files of 100
#: slots and 399 entries (the geometry of the RocketMQ fixtures' ConsumeQueue and index files).
SMALL = GeometryPreset("small", commitlog_file_size=64 * KIB, cq_units_per_file=300, hash_slot_num=100, index_num=400)
#: RocketMQ 4.9.8's MessageStoreConfig defaults.
DEFAULT = GeometryPreset("default", commitlog_file_size=_DEFAULTS.mapped_file_size_commit_log,
                        cq_units_per_file=_DEFAULTS.mapped_file_size_consume_queue // CQ_STORE_UNIT_SIZE,
                        hash_slot_num=_DEFAULTS.max_hash_slot_num, index_num=_DEFAULTS.max_index_num)
GEOMETRIES = {g.name: g for g in (SMALL, DEFAULT)}
#: What a test parametrised over geometries runs in (ids "small" and "default").
BOTH = (SMALL, DEFAULT)


def geometry_id(geometry: GeometryPreset) -> str:
    return geometry.name


def drop_preallocated_files(root: Path) -> None:
    """Delete the large allocated files under ``root`` once a test is done with them: in DEFAULT
    geometry every commitlog file is 1 GiB, fallocated (the next one too, in the background), and a
    test run keeps its temporary directories, so a few dozen stores would fill a disk. Sparse files
    (index files) and small ones are left, for a look after a failure."""
    if not root.is_dir():
        return
    for path in root.rglob("*"):
        with contextlib.suppress(OSError):
            if path.is_file() and not path.is_symlink() and path.stat().st_blocks * 512 >= LARGE_FILE_BYTES:
                path.unlink()


def geometry_named(name: str) -> GeometryPreset:
    """``small``, ``default``, or ``CL_BYTES,CQ_UNITS,SLOTS,ENTRIES`` (e.g. ``1048576,500,200,800``)."""
    if name in GEOMETRIES:
        return GEOMETRIES[name]
    try:
        commitlog, cq_units, slots, entries = (int(part) for part in name.split(","))
    except ValueError:
        raise ValueError(f"geometry {name!r}: give small, default, or CL_BYTES,CQ_UNITS,SLOTS,ENTRIES") from None
    return GeometryPreset(name, commitlog, cq_units, slots, entries)
