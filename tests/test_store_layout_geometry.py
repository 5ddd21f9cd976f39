"""The offline tools' two shared answers: where a store's files are (services.store.formats.store_layout) and
their geometry (services.store.formats.geometry): flags over the settings (YAML file, then MQSTORE_*), then
the files, and only when the files leave no doubt."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.store.formats.geometry import GeometryError, GeometryOptions, StoreGeometry
from services.store.formats.index_file import IndexFileError
from services.store.formats.store_layout import MQSTORE, ROCKETMQ, StoreLayoutError, resolve_store
from tests.conftest import StoreFactory


def test_layouts(pristine_store: StoreFactory, tmp_path: Path) -> None:
    rocketmq = pristine_store("normal-raw")
    for given in (rocketmq, rocketmq / "commitlog"):
        layout = resolve_store(given)
        assert (layout.kind, layout.root, layout.commitlog) == (ROCKETMQ, rocketmq, rocketmq / "commitlog")
        assert (layout.consumequeue, layout.index) == (rocketmq / "consumequeue", rocketmq / "index")
        assert len(layout.index_files()) == 16
    mine = tmp_path / "data"
    (mine / "commitlog").mkdir(parents=True)
    assert resolve_store(mine).kind == ROCKETMQ  # a bare commitlog: RocketMQ's flat layout
    (mine / "indexer" / "consumequeue").mkdir(parents=True)
    layout = resolve_store(mine / "commitlog")
    assert (layout.kind, layout.consumequeue, layout.index) == \
        (MQSTORE, mine / "indexer" / "consumequeue", mine / "indexer" / "index")
    (mine / "consumequeue").mkdir()
    both = resolve_store(mine)
    assert both.commitlog == mine / "commitlog"  # still readable
    with pytest.raises(StoreLayoutError, match="both mqstore's layout .* and RocketMQ's"):
        both.index_files()
    with pytest.raises(StoreLayoutError, match="no such directory"):
        resolve_store(tmp_path / "nope")


def test_flags_win_over_the_environment_over_the_file(tmp_path: Path) -> None:
    config = tmp_path / "mqstore.yaml"
    config.write_text("mappedFileSizeConsumeQueue: 400\nmaxHashSlotNum: 997\nmaxIndexNum: 5000\n")
    env = {"MQSTORE_MAX_INDEX_NUM": "6000"}
    geometry = StoreGeometry(GeometryOptions(str(config), hash_slot_num=11), env)
    assert geometry.index_geometry() == (11, 6000)
    assert geometry.cq_file_size() == 400
    default = StoreGeometry(GeometryOptions(), {})
    assert default.given == {}  # defaults are not "given": the files decide, then the defaults
    assert (default.cq_file_size(), default.index_geometry()) == (6_000_000, (5_000_000, 20_000_000))
    with pytest.raises(GeometryError, match="not a multiple of the 20-byte ConsumeQueue unit"):
        StoreGeometry(GeometryOptions(cq_file_size=1001), {}).cq_file_size()
    with pytest.raises(GeometryError, match="unknown setting"):
        config.write_text("maxHashSlots: 3\n")
        StoreGeometry(GeometryOptions(str(config)), {})


def test_inference_from_the_files(pristine_store: StoreFactory, tmp_path: Path) -> None:
    layout = resolve_store(pristine_store("normal-raw"))
    geometry = StoreGeometry(GeometryOptions(), {})
    assert geometry.index_geometry(layout.index_files()) == (100, 400)  # the 1:4 ratio, and the entries agree
    assert geometry.cq_file_size(layout.consume_queue_files()) == 6000
    assert StoreGeometry(GeometryOptions(index_num=400), {}).index_geometry(layout.index_files()) == (100, 400)
    # 105 slots and 399 entries make a file of the same size: the newest entry says it is wrong
    with pytest.raises(IndexFileError, match="fits hashSlotNum 105 and indexNum 399, but its entries do not"):
        StoreGeometry(GeometryOptions(index_num=399), {}).index_geometry(layout.index_files()[-1:])
    with pytest.raises(GeometryError, match="make 8444-byte index files"):
        StoreGeometry(GeometryOptions(hash_slot_num=101, index_num=400), {}).index_geometry(layout.index_files())
    odd = tmp_path / "cq"
    odd.write_bytes(bytes(40))
    with pytest.raises(GeometryError, match="different sizes .*--cq-file-size"):
        geometry.cq_file_size([*layout.consume_queue_files(), odd], "the store")
