"""Which consumer groups have not consumed a commitlog range (services/store/rules/unconsumed.py), read from
real files: ConsumeQueues written by the indexer's ConsumeQueue code (small files, so a queue spans
several, one starting past queue offset 0 with filler units) and a consumerOffset.json written by the
query service's table. Unreadable sources are "unknown", never "none"."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.query.consumer_offsets import ConsumerOffsetTable
from services.store.formats.consume_queue import CQ_STORE_UNIT_SIZE, ConsumeQueueStore
from services.store.rules.unconsumed import QueueUnits, UnconsumedReader

CQ_FILE_SIZE = 40 * CQ_STORE_UNIT_SIZE  # 40 units a file
SIZE = 100  # every record is 100 bytes: queue A/0's unit k points at commitlog offset 1000 * k


def build_store(root: Path) -> None:
    """mqstore's layout: the commitlog service's root, the indexer's ConsumeQueue under ``indexer/``.

    * A/0: 150 messages at commitlog offsets 0, 1000, ..., 149000 (four files);
    * A/1: 30 messages at 500, 1500, ..., 29500;
    * B/0: its first message at queue offset 45 (the queue was created there: filler units before it),
      20 messages at 200000, 201000, ...
    """
    store = ConsumeQueueStore(root / "indexer" / "consumequeue", CQ_FILE_SIZE)
    store.find_or_create("A", 0).put_batch([(1000 * k, SIZE, 0, k) for k in range(150)])
    store.find_or_create("A", 1).put_batch([(500 + 1000 * k, SIZE, 0, k) for k in range(30)])
    store.find_or_create("B", 0).put_batch([(200_000 + 1000 * k, SIZE, 0, 45 + k) for k in range(20)])
    store.shutdown()


def commit_offsets(root: Path, *commits: tuple[str, str, int, int]) -> None:
    table = ConsumerOffsetTable(root / "query" / "config")
    table.load()
    for group, topic, queue_id, offset in commits:
        table.commit(group, topic, queue_id, offset)
    table.persist()


@pytest.fixture
def root(tmp_path: Path) -> Path:
    build_store(tmp_path)
    return tmp_path


def test_queue_units_find_the_queue_offsets_of_a_commitlog_range(root: Path) -> None:
    with QueueUnits(root / "indexer" / "consumequeue" / "A" / "0") as units:
        assert units.span(0, 40_000) == (0, 40)  # exactly the first file
        assert units.span(39_500, 80_001) == (40, 81)  # across a file boundary
        assert units.span(149_000, 10**9) == (149, 150)
        assert units.span(150_000, 10**9) == (150, 150)  # past the queue: empty
    with QueueUnits(root / "indexer" / "consumequeue" / "B" / "0") as units:
        assert units.span(0, 200_000) == (45, 45), "filler units point at nothing"
        assert units.span(0, 205_000) == (45, 50)
    with QueueUnits(root / "indexer" / "consumequeue" / "C" / "0") as units:
        assert units.span(0, 10**9) == (0, 0), "a queue without ConsumeQueue files has no messages"


def test_groups_that_have_not_consumed_a_range_are_named_with_their_messages(root: Path) -> None:
    commit_offsets(root, ("Lagging", "A", 0, 3), ("Lagging", "A", 1, 0), ("Middle", "A", 0, 20),
                   ("Done", "A", 0, 150), ("Done", "A", 1, 30), ("Other", "B", 0, 45))
    reader = UnconsumedReader(root)

    first = reader.holders(0, 40_000)  # A/0's units 0..39, A/1's units 0..39 (its 30)
    assert not first.unknown and first.holds
    assert first.groups == ["Lagging", "Middle"]
    by_key = {(h.group, h.topic, h.queue_id): h for h in first.holdings}
    assert by_key[("Lagging", "A", 0)].unconsumed == 37  # queue offsets 3..39
    assert by_key[("Lagging", "A", 1)].unconsumed == 30
    assert by_key[("Middle", "A", 0)].unconsumed == 20
    text = first.describe()
    assert "Lagging (topic A queue 0: committed offset 3, 37 unconsumed messages at queue offsets [3, 40))" in text
    assert "Done" not in text and "Other" not in text

    later = reader.holders(100_000, 140_000)
    assert later.groups == ["Lagging", "Middle"]
    assert {h.unconsumed for h in later.holdings} == {40}

    assert reader.holders(200_000, 210_000).groups == ["Other"]
    ranges = [(0, 40_000), (40_000, 100_000), (100_000, 140_000), (200_000, 210_000)]
    assert reader.holders_of(ranges) == [reader.holders(start, end) for start, end in ranges], \
        "asked together (one pass over each ConsumeQueue), the answers are the same"
    consumed = reader.holders(150_000, 200_000)
    assert not consumed.holds and consumed.describe() == "none"

    commit_offsets(root, ("Lagging", "A", 0, 150), ("Lagging", "A", 1, 30), ("Middle", "A", 0, 150))
    assert reader.holders(0, 40_000).groups == [], "a newer offsets file is read again"


def test_no_offsets_file_names_no_group_and_says_where_it_looked(root: Path) -> None:
    found = UnconsumedReader(root).holders(0, 40_000)
    assert not found.holds
    assert found.describe() == (f"none known (no consumer offsets file at {root}/query/config/consumerOffset.json "
                                f"or {root}/config/consumerOffset.json)")


def test_unreadable_sources_are_unknown_not_none(root: Path) -> None:
    config = root / "query" / "config"
    config.mkdir(parents=True)
    (config / "consumerOffset.json").write_text("{not json")
    found = UnconsumedReader(root).holders(0, 40_000)
    assert found.holds and found.unknown.startswith("the consumer offsets cannot be read")
    assert "consumerOffset.json" in found.describe()

    (config / "consumerOffset.json").unlink()
    commit_offsets(root, ("Lagging", "A", 0, 3))
    (root / "indexer" / "consumequeue" / "A" / "0" / f"{CQ_FILE_SIZE:020d}").write_bytes(b"\0" * 7)
    found = UnconsumedReader(root).holders(0, 40_000)
    assert found.holds and "unlike the queue's other files" in found.unknown, found
