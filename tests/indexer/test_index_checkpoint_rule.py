"""The checkpoint's indexMsgTimestamp as the indexer writes it, and what RocketMQ 4.9.8's load does with
it after an unclean exit (docs/formats.md, "checkpoint").

RocketMQ records indexMsgTimestamp only when an index file is full (it is flushed on the roll). The
indexer also records the end of the last, not yet full, file after each flush round has msync'ed it:
everything up to that time is on disk, so a later recovery may keep that file. A 4.9.8 broker's
``IndexService.load(lastExitOK=false)`` deletes every index file whose endTimestamp is newer than
indexMsgTimestamp: the flushed last file is kept while nothing was indexed after the flush, and
dropped (to be rebuilt by the broker's re-dispatch) once something was.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from services.indexer.indexer_store import IndexerStore
from services.store.formats.checkpoint import StoreCheckpoint
from services.store.formats.index_service import IndexService
from tests.geometry import SMALL
from tests.indexer.test_dispatch_checkpoint import config, dispatch, workload


def _load_as_rocketmq_after_a_crash(root: Path, copy: Path) -> tuple[list[str], int]:
    """A copy of the indexer's files, loaded by the RocketMQ-rule IndexService as after an unclean exit."""
    shutil.copytree(root, copy)
    checkpoint = StoreCheckpoint(copy / "checkpoint")
    service = IndexService(copy / "index", SMALL.hash_slot_num, SMALL.index_num, checkpoint)
    try:
        return service.load(last_exit_ok=False), checkpoint.index_msg_timestamp
    finally:
        service.close()
        checkpoint.close()


def test_a_flush_round_checkpoints_the_end_of_the_last_index_file_even_when_not_full(tmp_path: Path) -> None:
    requests = workload()
    root = tmp_path / "indexer"
    store = IndexerStore(config(), root)
    store.start()
    try:
        dispatch(store, requests[:100])
        store.flush(0)
        assert store.index is not None
        last = store.index.files[-1]
        assert not last.is_write_full and last.end_timestamp == requests[99].store_timestamp
        assert StoreCheckpoint(root / "checkpoint").index_msg_timestamp == last.end_timestamp
        # Nothing indexed since the flush: a 4.9.8 broker's abnormal load keeps every file.
        dropped, stamp = _load_as_rocketmq_after_a_crash(root, tmp_path / "right-after-flush")
        assert dropped == [] and stamp == last.end_timestamp
        # Indexed past the flushed point: that broker drops the last file (its end is newer).
        dispatch(store, requests[100:120])
        dropped, _ = _load_as_rocketmq_after_a_crash(root, tmp_path / "after-more")
        assert dropped == [last.path.name]
    finally:
        store.shutdown()
