"""Shared fixtures: the real RocketMQ 4.9.8 stores and dumps under ``tests/fixtures/rocketmq-store``.

Extraction is done once per session (the tarballs are a few MB each); tests that change a store get
their own copy from :func:`fixture_store`, tests that only read use :func:`pristine_store`.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import tarfile
from collections.abc import Callable, Iterator
from decimal import Decimal
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.geometry import BOTH, GeometryPreset, drop_preallocated_files, geometry_id

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

FIXTURES_DIR = Path(__file__).parent / "fixtures" / "rocketmq-store"

#: Store tarballs by short name (``normal-raw`` is ``normal-raw-store.tar.gz``).
STORES = ("normal-raw", "crash-raw", "crash-recovered", "torn-raw", "torn-recovered")
#: Runs that have a dump (``<run>-dump.jsonl.gz``) and, for normal and crash, a put log.
DUMPS = ("normal", "crash", "torn")
PUTLOGS = ("normal", "crash")

Row = dict[str, Any]
StoreFactory = Callable[[str], Path]
RowsLoader = Callable[[str], list[Row]]
#: ``dump_rows(run, *types)``
DumpRows = Callable[..., list[Row]]
LinesLoader = Callable[[str], tuple[str, ...]]


def _store_tarball(name: str) -> Path:
    short = name.removesuffix(".tar.gz").removesuffix("-store")
    if short not in STORES:
        raise ValueError(f"unknown fixture store {name!r}; expected one of {', '.join(STORES)}")
    return FIXTURES_DIR / f"{short}-store.tar.gz"


def _exact_mtime_ns(member: tarfile.TarInfo) -> int | None:
    """The pax ``mtime`` as integer nanoseconds. tarfile parses it into a float, which is only good to
    about 0.5 us at 2026 epochs; RocketMQ compares CQ file mtimes with timestamps, so keep them exact."""
    text = member.pax_headers.get("mtime")
    return None if text is None else int(Decimal(text) * 1_000_000_000)


def extract_store(name: str, dest: Path) -> Path:
    """Extract fixture tarball ``name`` into ``dest`` and return its ``store/`` directory."""
    with tarfile.open(_store_tarball(name)) as tar:
        members = tar.getmembers()
        tar.extractall(dest, filter="fully_trusted")  # our own archives; keeps modes and mtimes
    for member in members:  # setting a file's mtime leaves its directory's mtime alone, so order is free
        ns = _exact_mtime_ns(member)
        if ns is not None and not member.issym():
            os.utime(dest / member.name, ns=(ns, ns))
    return dest / "store"


@pytest.fixture(scope="session")
def pristine_store(tmp_path_factory: pytest.TempPathFactory) -> StoreFactory:
    """``pristine_store(name) -> store dir``, extracted once per session. Read only: do not modify."""
    extracted: dict[str, Path] = {}

    def get(name: str) -> Path:
        key = _store_tarball(name).name
        if key not in extracted:
            extracted[key] = extract_store(name, tmp_path_factory.mktemp(key.removesuffix(".tar.gz")))
        return extracted[key]

    return get


@pytest.fixture
def fixture_store(pristine_store: StoreFactory, tmp_path: Path) -> StoreFactory:
    """``fixture_store(name) -> store dir``: a fresh, writable copy on every call (mtimes preserved)."""
    counter = 0

    def copy(name: str) -> Path:
        nonlocal counter
        counter += 1
        dest = tmp_path / f"{_store_tarball(name).name.removesuffix('.tar.gz')}-{counter}" / "store"
        shutil.copytree(pristine_store(name), dest, copy_function=shutil.copy2)
        return dest

    return copy


@cache
def _load_jsonl(path: Path) -> tuple[Row, ...]:
    with gzip.open(path, "rt", encoding="utf-8") as lines:
        return tuple(json.loads(line) for line in lines if line.strip())


def load_dump(run: str) -> list[Row]:
    """All rows of ``<run>-dump.jsonl.gz`` (meta, msg, blank, cq, query, ...) in file order."""
    if run not in DUMPS:
        raise ValueError(f"unknown dump {run!r}; expected one of {', '.join(DUMPS)}")
    return list(_load_jsonl(FIXTURES_DIR / f"{run}-dump.jsonl.gz"))


def load_putlog(run: str) -> list[Row]:
    """All ``put`` rows of ``<run>-putlog.jsonl.gz``, in put order."""
    if run not in PUTLOGS:
        raise ValueError(f"unknown put log {run!r}; expected one of {', '.join(PUTLOGS)}")
    return list(_load_jsonl(FIXTURES_DIR / f"{run}-putlog.jsonl.gz"))


@pytest.fixture(scope="session")
def dump_rows() -> Callable[..., list[Row]]:
    """``dump_rows(run, *types) -> rows``: a dump's rows, only those of the given types if any are given.
    Rows are parsed once per session and shared: treat them as read only."""

    def rows(run: str, *types: str) -> list[Row]:
        all_rows = load_dump(run)
        return [r for r in all_rows if r["type"] in types] if types else all_rows

    return rows


@cache
def load_dump_lines(run: str) -> tuple[str, ...]:
    """The raw text lines of a dump (no newline), for byte-exact comparisons with our JSON output."""
    if run not in DUMPS:
        raise ValueError(f"unknown dump {run!r}; expected one of {', '.join(DUMPS)}")
    with gzip.open(FIXTURES_DIR / f"{run}-dump.jsonl.gz", "rt", encoding="utf-8", newline="\n") as lines:
        return tuple(line.rstrip("\n") for line in lines if line.strip())


@pytest.fixture(scope="session")
def dump_lines() -> Callable[[str], tuple[str, ...]]:
    """``dump_lines(run) -> lines``: a dump's raw lines, in file order."""
    return load_dump_lines


@pytest.fixture(scope="session")
def putlog_rows() -> RowsLoader:
    """``putlog_rows(run) -> rows``: the put log of the ``normal`` or ``crash`` run."""
    return load_putlog


@pytest.fixture(params=BOTH, ids=geometry_id)
def store_geometry(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[GeometryPreset]:
    """A store test that takes this runs twice: in ``small`` geometry (64 KiB commitlog files, 300-unit
    ConsumeQueue files, index files of 100 slots and 399 entries: a few hundred messages roll every
    file kind) and in ``default`` (RocketMQ's sizes). See tests/geometry.py.

    DEFAULT commitlog files are 1 GiB, allocated: at teardown the large files under ``tmp_path`` are
    deleted. Put this fixture first in a test's arguments, so its teardown runs after the teardown of
    the processes that write there. Pin one geometry with
    ``@pytest.mark.parametrize("store_geometry", [SMALL], indirect=True)``."""
    yield request.param
    drop_preallocated_files(tmp_path)


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """One local Spark session for the whole run (a JVM takes ~8 s to start, and its first jobs warm it
    up): the pipeline's tests and the differential soak's jobs share it."""
    pytest.importorskip("pyspark")
    from pipeline.session import get_session

    session = get_session("local[2]", "mqstore-pipeline-tests", {"spark.sql.shuffle.partitions": "4",
                                                                  "spark.driver.memory": "2g"})
    yield session
    session.stop()
