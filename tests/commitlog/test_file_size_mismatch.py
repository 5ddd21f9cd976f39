"""A store started with a file size other than the one it was written with is refused in one line
(exit 2, a settings error) and left untouched. Before, the service removed a single-file store's
only file as "a creation cut short" (or failed with a ValueError traceback with several files)."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest

from services.commitlog.message_store import MessageStore
from services.store.config import MessageStoreConfig
from services.store.formats.mapped_file_queue import FileSizeMismatchError, MappedFileQueue
from services.store.formats.message import Message
from tests.commitlog.commitlog_process import commitlog_env, free_port, mqstore_command

KIB = 1024


def _write_store(root: Path, file_size: int, count: int) -> None:
    log = MessageStore(MessageStoreConfig(mapped_file_size_commit_log=file_size), root)
    log.start()
    try:
        for i in range(count):
            log.put_message(Message("Sized", 0, f"message {i}".encode() * 100))
    finally:
        log.shutdown()


def _digests(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


@pytest.mark.parametrize("count", [1, 200])  # one file (the last one) or several
def test_a_store_of_another_file_size_is_refused_and_untouched(tmp_path: Path, count: int) -> None:
    root = tmp_path / "store"
    _write_store(root, 64 * KIB, count)
    before = _digests(root / "commitlog")
    done = subprocess.run([*mqstore_command(), "serve", "commitlog", "--store", str(root),
                           "--listen", f"127.0.0.1:{free_port()}"],
                          env=commitlog_env({"MQSTORE_MAPPED_FILE_SIZE_COMMIT_LOG": str(128 * KIB)}),
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "written with another file size" in done.stderr and f"{64 * KIB} bytes" in done.stderr
    assert "Traceback" not in done.stderr
    assert _digests(root / "commitlog") == before, "nothing may be removed or changed"


def test_a_creation_cut_short_is_still_removed(tmp_path: Path) -> None:
    root = tmp_path / "store"
    _write_store(root, 64 * KIB, 1)
    cut = root / "commitlog" / f"{64 * KIB:020d}"
    cut.write_bytes(b"\0" * 1000)  # the next file, created only in part, no data
    queue = MappedFileQueue(root / "commitlog", 64 * KIB)
    queue.load()
    assert not cut.exists() and len(queue.files) == 1
    queue.shutdown()


def test_a_short_last_file_with_data_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "store"
    _write_store(root, 64 * KIB, 1)
    only = root / "commitlog" / f"{0:020d}"
    with pytest.raises(FileSizeMismatchError):
        MappedFileQueue(root / "commitlog", 128 * KIB).load()
    assert only.stat().st_size == 64 * KIB
