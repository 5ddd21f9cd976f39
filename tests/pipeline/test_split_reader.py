"""The byte-range split reader: every record exactly once whatever the split size, damage reported."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.split_reader import (
    GAP_CORRUPT,
    GAP_ZEROS,
    Gap,
    MappedSplit,
    is_boundary,
    iter_record_positions,
    plan_splits,
    resync,
    scan_split,
)
from services.store.formats.commitlog_walk import RecordEntry, iter_commitlog
from tests.conftest import StoreFactory


def read_all(commitlog: Path, split_size: int) -> tuple[list[int], list[Gap], list[int]]:
    """(record offsets, gaps, BLANK offsets) over every split, in split order."""
    offsets: list[int] = []
    gaps: list[Gap] = []
    blanks: list[int] = []
    for split in plan_splits(commitlog, split_size):
        with MappedSplit(split) as view:
            layout = scan_split(view, split)
            offsets += [split.file_offset + p for p in iter_record_positions(view, layout.runs)]
            gaps += layout.gaps
            if layout.blank_offset is not None:
                blanks.append(layout.blank_offset)
    return offsets, gaps, blanks


def walk(commitlog: Path) -> tuple[list[int], list[int]]:
    entries = list(iter_commitlog(commitlog))
    return ([e.offset for e in entries if isinstance(e, RecordEntry)],
            [e.offset for e in entries if not isinstance(e, RecordEntry)])


# Smaller than the 8-byte BLANK, than a header, than the smallest record, around record sizes, whole files.
SMALL_SPLIT_SIZES = (1, 5, 8, 36, 90, 91, 92, 127, 333, 1000, 4095, 4096, 16 * 1024, 1 << 20)


@pytest.mark.parametrize("split_size", SMALL_SPLIT_SIZES)
def test_every_record_once_on_a_mqstore_store(mqstore_store: Path, split_size: int) -> None:
    expected, expected_blanks = walk(mqstore_store / "commitlog")
    offsets, gaps, blanks = read_all(mqstore_store / "commitlog", split_size)
    assert offsets == expected
    assert blanks == expected_blanks
    assert all(gap.kind == GAP_ZEROS for gap in gaps)  # only the unused tail of the last file
    assert len(gaps) <= 1


@pytest.mark.parametrize("split_size", (37, 161, 4096, 100_000, 1 << 20))
def test_every_record_once_on_the_rocketmq_store(pristine_store: StoreFactory, split_size: int) -> None:
    commitlog = pristine_store("normal-raw") / "commitlog"
    offsets, gaps, blanks = read_all(commitlog, split_size)
    assert len(offsets) == 3000
    assert (offsets, blanks) == walk(commitlog)
    assert gaps == [Gap(3008717, 3 * 1048576 - 3008717, GAP_ZEROS, "zero bytes to the end of the file")]


@pytest.mark.parametrize("split_size", (64, 1000, 65536, 1 << 20))
def test_torn_record_is_reported_with_its_offset(pristine_store: StoreFactory, split_size: int) -> None:
    commitlog = pristine_store("torn-raw") / "commitlog"
    offsets, gaps, _ = read_all(commitlog, split_size)
    assert len(offsets) == 2109 and offsets[-1] < 2033918
    corrupt = [gap for gap in gaps if gap.kind == GAP_CORRUPT]
    assert [gap.offset for gap in corrupt] == [2033918]
    assert "torn" in corrupt[0].reason


def test_resync_finds_the_next_record_from_inside_one(pristine_store: StoreFactory) -> None:
    commitlog = pristine_store("normal-raw") / "commitlog"
    split = plan_splits(commitlog, 1 << 20)[0]
    with MappedSplit(split) as view:
        assert is_boundary(view, 0, split.file_size, 161)
        assert not is_boundary(view, 0, split.file_size, 162)
        assert resync(view, 0, split.file_size, 1, split.file_size) == 161  # 0 is a record of 161 bytes
        assert resync(view, 0, split.file_size, 161, 162) == 161
        assert resync(view, 0, split.file_size, 162, 300) is None


def test_garbage_inside_the_data_is_reported_not_skipped(fixture_store: StoreFactory) -> None:
    commitlog = fixture_store("normal-raw") / "commitlog"
    first = sorted(commitlog.iterdir())[0]
    with open(first, "r+b") as handle:  # overwrite the second record (161..346) with garbage
        handle.seek(161)
        handle.write(b"\xff" * 185)
    expected = [o for o in walk(fixture_store("normal-raw") / "commitlog")[0] if o != 161]
    for split_size in (100, 4096, 1 << 20):
        offsets, gaps, _ = read_all(commitlog, split_size)
        assert offsets == expected
        assert [(g.offset, g.length, g.kind) for g in gaps if g.kind == GAP_CORRUPT] == [(161, 185, GAP_CORRUPT)]


def test_plan_from_offset_skips_earlier_files(pristine_store: StoreFactory) -> None:
    commitlog = pristine_store("normal-raw") / "commitlog"
    splits = plan_splits(commitlog, 300_000, from_offset=1_048_576 + 10)
    assert splits[0].offset == 1_048_576 + 10
    assert all(s.end - s.start <= 300_000 for s in splits)


@pytest.mark.parametrize(("name", "split_size"), [("normal-raw", 65536), ("crash-raw", 65536), ("crash-raw", 1 << 20)])
def test_no_split_is_planned_in_the_zeros_after_the_last_record(pristine_store: StoreFactory, name: str,
                                                                split_size: int) -> None:
    """A preallocated file's unused tail and a wholly unused next file hold nothing, yet each split
    there would be a task: the plan stops at the split holding the last non-zero byte."""
    from pipeline.scan import StoreInput

    commitlog = pristine_store(name) / "commitlog"
    expected, _ = walk(commitlog)
    last = next(e for e in reversed(list(iter_commitlog(commitlog))) if isinstance(e, RecordEntry))
    data_end = last.offset + last.size
    splits = StoreInput.open(commitlog).plan(split_size)
    assert splits[-1].offset < data_end <= splits[-1].file_offset + splits[-1].end
    assert [s.index for s in splits] == list(range(len(splits)))
    assert splits == plan_splits(commitlog, split_size)[:len(splits)]  # the same tasks for the data
    offsets: list[int] = []
    for split in splits:
        with MappedSplit(split) as view:
            offsets += [split.file_offset + p for p in iter_record_positions(view, scan_split(view, split).runs)]
    assert offsets == expected
