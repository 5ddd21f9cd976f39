"""The dispatch path's parser agrees with the full decoder on every fixture record."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from services.store.commitlog_files import iter_commitlog
from services.store.record import RecordError, check_record, parse_dispatch_requests

StoreFactory = Callable[[str], Path]


def chunks_of(commitlog: Path) -> list[tuple[int, bytes]]:
    """(start offset, whole records) per file, as Tail would send them."""
    chunks = []
    for path in sorted(commitlog.iterdir()):
        data = path.read_bytes()
        start = int(path.name)
        end = 0
        while end + 8 <= len(data):
            request = check_record(data, end, check_crc=False)
            if not request.success or request.msg_size <= 0:
                break
            end += request.msg_size
        if end:
            chunks.append((start, data[:end]))
    return chunks


@pytest.mark.parametrize("store", ["normal-raw", "crash-recovered"])
def test_parse_matches_check_record(pristine_store: StoreFactory, store: str) -> None:
    commitlog = pristine_store(store) / "commitlog"
    parsed = [r for start, data in chunks_of(commitlog) for r in parse_dispatch_requests(data, start)]
    expected = [entry.dispatch for entry in iter_commitlog(commitlog) if getattr(entry, "dispatch", None)]
    assert len(parsed) == len(expected) > 2000
    assert parsed == expected


def test_a_chunk_that_does_not_start_at_a_record_is_refused(pristine_store: StoreFactory) -> None:
    start, data = chunks_of(pristine_store("normal-raw") / "commitlog")[0]
    with pytest.raises(RecordError):
        parse_dispatch_requests(data[161:], start + 161 + 1)
    with pytest.raises(RecordError):
        parse_dispatch_requests(data[:1000], start)  # the last record is cut short
