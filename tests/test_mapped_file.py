"""MappedFile details not covered through the CommitLog: prefaulting and name rules."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.store.mapped_file import PREFAULT_STEP, MappedFile, file_name, parse_file_name


def test_prefault_keeps_content_and_stops_on_request(tmp_path: Path) -> None:
    mapped = MappedFile(tmp_path / file_name(0), 2 * PREFAULT_STEP)
    try:
        mapped.append(b"before")
        assert mapped.prefault(3)
        assert mapped.read(0, 6) == b"before"  # populating never changes bytes
        assert not mapped.prefault(0, should_stop=lambda: True)
        mapped.append(b"after")
        assert mapped.read(0, 11) == b"beforeafter"
    finally:
        mapped.destroy()


def test_file_names_are_20_digit_offsets(tmp_path: Path) -> None:
    assert file_name(1048576) == "00000000000001048576"
    assert parse_file_name(tmp_path / "00000000000001048576") == 1048576
    with pytest.raises(ValueError, match="20 digits"):
        parse_file_name(tmp_path / "1048576")
