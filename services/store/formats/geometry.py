"""The geometry of a store's files, for the offline tools: commitlog file size, ConsumeQueue file size,
and the index files' hashSlotNum and indexNum.

None of these is written in the files, so a tool reading a store must be told them the way the
services were: the same settings (``--config FILE`` YAML and ``MQSTORE_*`` variables, read by
:func:`services.store.config.load_config`), and a tool's flags, which win. Only what neither gives is
inferred from the files, and only when the files leave no doubt:

* commitlog and ConsumeQueue files are preallocated to their full size, so equal sizes are the answer
  (and files of different sizes are refused: one of them is damaged, and no guess can say which);
* an index file's size fits many (hashSlotNum, indexNum) pairs. With one of them given, the size fixes
  the other; with neither, the pair is RocketMQ's 1:4 ratio of the defaults (5,000,000 / 20,000,000).
  Either way it is accepted only if the file agrees: its newest entry must head its hash slot's chain,
  which a wrong slot count would not show;
* where no file exists (reindex writing new files), the settings' defaults, as the services use them.

A setting counts as given when it differs from its default: a store configured with the default
writes files of the default geometry, which inference finds anyway.
"""

from __future__ import annotations

import argparse
import os
import re
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from services.store.config import ConfigError, MessageStoreConfig, camel_name, load_config
from services.store.formats.consume_queue import CQ_STORE_UNIT_SIZE
from services.store.formats.index_file import (
    HASH_SLOT_SIZE,
    INDEX_ENTRY_SIZE,
    INDEX_HEADER_SIZE,
    IndexFileError,
    index_file_size,
)

DEFAULT_SLOTS_PER_INDEX = 4  # RocketMQ's defaults: 5,000,000 slots, 20,000,000 entries
_STORE_FILE_NAME = re.compile(r"[0-9]{20}")
_HEADER_COUNTS = struct.Struct(">ii")  # hashSlotCount, indexCount at header offset 32
_I32 = struct.Struct(">i")

# Each geometry value: (attribute of MessageStoreConfig, command-line flag).
COMMITLOG_FILE_SIZE = ("mapped_file_size_commit_log", "--commitlog-file-size")
CQ_FILE_SIZE = ("mapped_file_size_consume_queue", "--cq-file-size")
HASH_SLOT_NUM = ("max_hash_slot_num", "--hash-slot-num")
INDEX_NUM = ("max_index_num", "--index-num")
_ALL = (COMMITLOG_FILE_SIZE, CQ_FILE_SIZE, HASH_SLOT_NUM, INDEX_NUM)


class GeometryError(ValueError):
    """Geometry that cannot be settled, or files that do not fit it; the message says what to give."""


class IndexGeometryError(GeometryError, IndexFileError):
    """An index file whose hashSlotNum and indexNum cannot be settled (also an IndexFileError: the file
    cannot be opened as configured)."""


def _dest(flag: str) -> str:
    return flag.removeprefix("--").replace("-", "_")


def _how_to_give(*values: tuple[str, str]) -> str:
    flags = " and ".join(flag for _, flag in values)
    settings = " and ".join(camel_name(setting) for setting, _ in values)
    env = "/".join(f"MQSTORE_{setting.upper()}" for setting, _ in values)
    return f"give {flags}, or {settings} in --config FILE or {env}"


def add_geometry_arguments(parser: argparse.ArgumentParser, *, commitlog: bool = False, consumequeue: bool = False,
                           index: bool = False) -> None:
    """``--config`` and the flags of the geometry a command reads; parse with :func:`options_of`."""
    group = parser.add_argument_group("store geometry (default: the settings, else inferred from the files)")
    group.add_argument("--config", default=None,
                       help="the store's YAML settings file (MessageStoreConfig names, as the services read it); "
                            "MQSTORE_* environment variables apply too")
    wanted = ((COMMITLOG_FILE_SIZE, commitlog), (CQ_FILE_SIZE, consumequeue), (HASH_SLOT_NUM, index),
              (INDEX_NUM, index))
    for (setting, flag), on in wanted:
        if on:
            group.add_argument(flag, dest=_dest(flag), type=int, default=None, help=camel_name(setting))


@dataclass(frozen=True, slots=True)
class GeometryOptions:
    """What a command line gave: the settings file and the geometry flags (None: not given)."""

    config_file: str | None = None
    commitlog_file_size: int | None = None
    cq_file_size: int | None = None
    hash_slot_num: int | None = None
    index_num: int | None = None


def options_of(args: argparse.Namespace) -> GeometryOptions:
    return GeometryOptions(getattr(args, "config", None),
                           *(getattr(args, _dest(flag), None) for _, flag in _ALL))


@dataclass(frozen=True, slots=True)
class Given:
    """A value a flag or the settings gave, and which one (for messages)."""

    value: int
    source: str


class StoreGeometry:
    """Resolves each geometry value when a tool needs it (flags > settings > the files > defaults), so
    a job that reads only the commitlog is never stopped by an index file it does not read."""

    def __init__(self, options: GeometryOptions | None = None, environ: Mapping[str, str] | None = None) -> None:
        options = options or GeometryOptions()
        try:
            self.settings = load_config(options.config_file, environ)
        except ConfigError as exc:
            raise GeometryError(str(exc)) from None
        defaults = MessageStoreConfig()
        self.given: dict[str, Given] = {}
        for setting, flag in _ALL:
            flagged = getattr(options, _dest(flag))
            configured = getattr(self.settings, setting)
            if flagged is not None:
                if flagged <= 0:
                    raise GeometryError(f"{flag} {flagged} must be positive")
                self.given[setting] = Given(flagged, flag)
            elif configured != getattr(defaults, setting):
                self.given[setting] = Given(configured, f"{camel_name(setting)} of the settings")

    # -- commitlog --------------------------------------------------------------------------------
    def commitlog_file_size(self, commitlog_dir: Path) -> int | None:
        """mappedFileSizeCommitLog: given, else None (the files' own size, checked equal when listed)."""
        given = self.given.get(COMMITLOG_FILE_SIZE[0])
        if given is None:
            return None
        for path in _store_files(commitlog_dir):
            size = path.stat().st_size
            if size != given.value:
                raise GeometryError(f"{path}: {size} bytes, but {given.source} says commitlog files are "
                                    f"{given.value} bytes: give the store's own settings")
        return given.value

    # -- ConsumeQueue -----------------------------------------------------------------------------
    def cq_file_size(self, files: Iterable[Path] = (), where: Path | str = "the store") -> int:
        """mappedFileSizeConsumeQueue: given, else the size every one of ``files`` (existing ConsumeQueue
        files, under ``where``) has, else the default."""
        setting = CQ_FILE_SIZE[0]
        given = self.given.get(setting)
        if given is not None:
            if given.value % CQ_STORE_UNIT_SIZE:
                raise GeometryError(f"{given.source}: {given.value} is not a multiple of the "
                                    f"{CQ_STORE_UNIT_SIZE}-byte ConsumeQueue unit")
            return given.value
        sizes = sorted({path.stat().st_size for path in files})
        if len(sizes) > 1:
            raise GeometryError(f"{where}: ConsumeQueue files of different sizes "
                                f"({', '.join(map(str, sizes))} bytes): {_how_to_give(CQ_FILE_SIZE)}")
        if sizes and (sizes[0] <= 0 or sizes[0] % CQ_STORE_UNIT_SIZE):
            raise GeometryError(f"{where}: ConsumeQueue files of {sizes[0]} bytes, not a multiple "
                                f"of the {CQ_STORE_UNIT_SIZE}-byte unit")
        return sizes[0] if sizes else int(getattr(self.settings, setting))

    # -- index ------------------------------------------------------------------------------------
    def index_geometry(self, index_files: Sequence[Path] = ()) -> tuple[int, int]:
        """(hashSlotNum, indexNum) of ``index_files`` (all one geometry), or for new files."""
        slots = self.given.get(HASH_SLOT_NUM[0])
        entries = self.given.get(INDEX_NUM[0])
        if not index_files:
            return (slots.value if slots else self.settings.max_hash_slot_num,
                    entries.value if entries else self.settings.max_index_num)
        by_size: dict[int, Path] = {}
        for path in index_files:
            by_size.setdefault(path.stat().st_size, path)
        if slots is not None and entries is not None:
            for size, path in sorted(by_size.items()):
                if size != index_file_size(slots.value, entries.value):
                    raise IndexGeometryError(
                        f"{path}: {size} bytes, but hashSlotNum {slots.value} ({slots.source}) and indexNum "
                        f"{entries.value} ({entries.source}) make {index_file_size(slots.value, entries.value)}"
                        "-byte index files: give the store's own settings")
            return slots.value, entries.value
        if len(by_size) > 1:
            raise IndexGeometryError(
                f"index files of different sizes ({', '.join(map(str, sorted(by_size)))} bytes, "
                f"e.g. {by_size[max(by_size)]}): {_how_to_give(HASH_SLOT_NUM, INDEX_NUM)}")
        size, path = next(iter(by_size.items()))
        return index_geometry_of(path, size, slots, entries)


def index_geometry_of(path: Path, size: int, slots: Given | None = None,
                      entries: Given | None = None) -> tuple[int, int]:
    """(hashSlotNum, indexNum) of one index file of ``size`` bytes, when not both are given: one given
    value fixes the other, with none the 1:4 ratio is tried; either way the result is checked against
    the file's newest entry."""
    try:
        geometry = infer_geometry(size, slots.value if slots else None, entries.value if entries else None)
    except IndexGeometryError:
        given = [g for g in (slots, entries) if g is not None]
        if given:
            said = " and ".join(f"{g.value} ({g.source})" for g in given)
            raise IndexGeometryError(f"{path}: a {size}-byte index file does not fit {said}: "
                                f"{_how_to_give(HASH_SLOT_NUM, INDEX_NUM)}") from None
        raise IndexGeometryError(f"{path}: cannot infer hashSlotNum and indexNum of a {size}-byte index file: "
                            f"{_how_to_give(HASH_SLOT_NUM, INDEX_NUM)}") from None
    # Anything inferred is checked against the file's content (a wrong guess reads garbage silently).
    if newest_entry_heads_its_slot(path, *geometry) is False:
        raise IndexGeometryError(f"{path}: a {size}-byte index file fits hashSlotNum {geometry[0]} and indexNum "
                            f"{geometry[1]}, but its entries do not: {_how_to_give(HASH_SLOT_NUM, INDEX_NUM)}")
    return geometry


def infer_geometry(file_size: int, hash_slot_num: int | None = None,
                   index_num: int | None = None) -> tuple[int, int]:
    """(hashSlotNum, indexNum) for a file of ``file_size`` bytes, from its size alone: one given value
    fixes the other; with none, RocketMQ's 1:4 ratio. IndexGeometryError when the size does not fit."""
    body = file_size - INDEX_HEADER_SIZE
    if hash_slot_num is None and index_num is None:
        per_slot = HASH_SLOT_SIZE + DEFAULT_SLOTS_PER_INDEX * INDEX_ENTRY_SIZE
        if body <= 0 or body % per_slot:
            raise IndexGeometryError(f"cannot infer the geometry of a {file_size}-byte index file: "
                                f"{_how_to_give(HASH_SLOT_NUM, INDEX_NUM)}")
        return body // per_slot, DEFAULT_SLOTS_PER_INDEX * (body // per_slot)
    if hash_slot_num is None:
        assert index_num is not None
        hash_slot_num, rest = divmod(body - index_num * INDEX_ENTRY_SIZE, HASH_SLOT_SIZE)
    elif index_num is None:
        index_num, rest = divmod(body - hash_slot_num * HASH_SLOT_SIZE, INDEX_ENTRY_SIZE)
    else:
        rest = file_size - index_file_size(hash_slot_num, index_num)
    if rest or hash_slot_num <= 0 or index_num <= 1:
        raise IndexGeometryError(f"a {file_size}-byte index file does not fit hashSlotNum {hash_slot_num}, "
                            f"indexNum {index_num}")
    return hash_slot_num, index_num


def newest_entry_heads_its_slot(path: Path, hash_slot_num: int, index_num: int) -> bool | None:
    """Whether the file reads right with this geometry: the newest entry is always the head of its
    slot's chain (putKey writes the slot last). None for a file without entries (nothing to check)."""
    with open(path, "rb") as handle:
        fd = handle.fileno()
        head = os.pread(fd, INDEX_HEADER_SIZE, 0)
        if len(head) < INDEX_HEADER_SIZE:
            return False
        index_count = _HEADER_COUNTS.unpack_from(head, 32)[1]
        if index_count <= 1:
            return None
        if index_count > index_num:
            return False
        newest = index_count - 1
        entry = os.pread(fd, 4, INDEX_HEADER_SIZE + hash_slot_num * HASH_SLOT_SIZE + newest * INDEX_ENTRY_SIZE)
        if len(entry) < 4:
            return False
        key_hash = _I32.unpack(entry)[0]
        slot = os.pread(fd, 4, INDEX_HEADER_SIZE + (key_hash % hash_slot_num) * HASH_SLOT_SIZE)
    return len(slot) == 4 and _I32.unpack(slot)[0] == newest


def _store_files(directory: Path) -> list[Path]:
    """Files named by a 20-digit offset directly in ``directory`` (commitlog or one queue)."""
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if _STORE_FILE_NAME.fullmatch(p.name) and p.is_file())

