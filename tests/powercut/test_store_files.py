"""The store's file layer on the power-cut file system: what it creates, deletes and replaces is
still so after a power cut, not only after kill -9 (a name is durable once its directory is fsynced)."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.store.formats.checkpoint import StoreCheckpoint
from services.store.formats.delay_offsets_file import read_delay_offsets, write_delay_offsets
from services.store.formats.mapped_file import MappedFile, file_name
from services.store.store_root import make_dirs, write_atomically
from tests.powercut.mount import PowerCutMount, available

UNAVAILABLE = available()
pytestmark = pytest.mark.skipif(UNAVAILABLE is not None, reason=f"no FUSE here: {UNAVAILABLE}")
SIZE = 64 * 1024


def _backing(fs: PowerCutMount, path: Path) -> Path:
    return fs.backing / path.relative_to(fs.mount)


def test_created_directories_and_files_survive_a_cut(fs: PowerCutMount) -> None:
    commitlog = fs.mount / "store" / "commitlog"
    make_dirs(commitlog)  # the store root and its parent's entry for it included
    created = MappedFile(commitlog / file_name(0), SIZE)
    created.close()
    checkpoint = StoreCheckpoint(fs.mount / "store" / "checkpoint")
    checkpoint.close()
    fs.cut(lambda: None)
    assert _backing(fs, created.path).stat().st_size == SIZE, "a new store file keeps its name and size"
    assert _backing(fs, checkpoint.path).exists()


def test_deleted_store_files_stay_deleted(fs: PowerCutMount) -> None:
    commitlog = fs.mount / "commitlog"
    make_dirs(commitlog)
    kept, deleted = (MappedFile(commitlog / file_name(n * SIZE), SIZE) for n in range(2))
    kept.close()
    deleted.close()
    fs.cut(lambda: None)
    fs.start()
    deleted = MappedFile(deleted.path, SIZE, create=False)
    deleted.destroy()  # e.g. past the recovered end of the log: it must not come back with stale records
    fs.cut(lambda: None)
    assert not _backing(fs, deleted.path).exists(), "a deleted store file came back after a power cut"
    assert _backing(fs, kept.path).exists()


def test_an_atomic_replace_leaves_the_old_or_the_new_content(fs: PowerCutMount) -> None:
    path = fs.mount / "config" / "topics.json"
    write_atomically(path, b"old", keep_backup=True)
    write_atomically(path, b"new", keep_backup=True)
    fs.cut(lambda: None)
    assert _backing(fs, path).read_bytes() == b"new"
    assert _backing(fs, path.with_name("topics.json.bak")).read_bytes() == b"old"


def test_the_schedulers_progress_survives_a_cut_in_a_new_config_folder(fs: PowerCutMount) -> None:
    path = fs.mount / "scheduler" / "config" / "delayOffset.json"
    make_dirs(path.parent.parent)
    write_delay_offsets(path, {1: 3}, scan_from=100)  # its first write creates config/: the name must last too
    fs.cut(lambda: None)
    assert read_delay_offsets(_backing(fs, path)) == {1: 3}, "delayOffset.json lost: delays delivered again"
