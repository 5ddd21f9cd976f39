"""Java String.hashCode semantics: tags codes and index key hashes must equal RocketMQ's bit for bit,
including strings outside the BMP (hashed as UTF-16 surrogate pairs)."""

from __future__ import annotations

import struct
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.store.formats.commitlog_walk import RecordEntry, iter_commitlog
from services.store.formats.java_hash import index_key_hash, java_string_hash
from services.store.formats.message import tags_code

INT_MIN = -(2**31)


def _hash_units(units: list[int]) -> int:
    """The Java loop ``h = 31 * h + c`` over UTF-16 units, wrapped to a signed 32-bit int."""
    h = 0
    for unit in units:
        h = (31 * h + unit) % 2**32
    return h - 2**32 if h >= 2**31 else h


@pytest.mark.parametrize(("text", "expected"), [
    ("", 0),
    ("a", 97),
    ("TagA", 2598919),
    ("TagB", 2598920),
    ("TagC-标签", 115944603),  # the fixture's CQ tagsCode for it
    ("polygenelubricants", INT_MIN),
])
def test_known_values(text: str, expected: int) -> None:
    assert java_string_hash(text) == expected


def test_non_bmp_characters_hash_as_surrogate_pairs() -> None:
    # U+1F680 is the pair D83D DE80 in UTF-16; Java sees 5 units in "🚀key", not 4 code points.
    units = [0xD83D, 0xDE80, ord("k"), ord("e"), ord("y")]
    assert java_string_hash("🚀key") == _hash_units(units)
    assert java_string_hash("🚀key") != _hash_units([ord(c) for c in "🚀key"])
    # By hand: 55357 (D83D); *31 + 56960 (DE80) = 1773027; *31 + 107 (k) = 54963944;
    # *31 + 101 (e) = 1703882365; *31 + 121 (y) = 52820353436, which is 1280745884 mod 2^32 (positive).
    assert java_string_hash("🚀key") == 1280745884


def test_lone_surrogates_hash_like_java() -> None:
    assert java_string_hash("\ud83d") == 0xD83D


def test_index_key_hash_maps_int_min_to_zero() -> None:
    assert index_key_hash("polygenelubricants") == 0
    assert index_key_hash("TagA") == 2598919
    negative = next(s for s in ("a" * n for n in range(1, 20)) if java_string_hash(s) < 0)
    assert index_key_hash(negative) == -java_string_hash(negative)


def test_tags_code_of_no_tags_is_zero() -> None:
    assert tags_code(None) == 0 and tags_code("") == 0 and tags_code("TagA") == 2598919


@given(st.text())
def test_hash_is_the_utf16_fold_and_fits_an_int(text: str) -> None:
    raw = text.encode("utf-16-be", "surrogatepass")
    units = [int.from_bytes(raw[i:i + 2], "big") for i in range(0, len(raw), 2)]
    h = java_string_hash(text)
    assert h == _hash_units(units)
    assert INT_MIN <= h < 2**31
    assert 0 <= index_key_hash(text) < 2**31


def _index_entries(index_dir: Path, slots: int) -> dict[int, list[int]]:
    """phyOffset -> key hashes, from every entry of every IndexFile (40-byte header, 4-byte slots,
    20-byte entries; entry 0 is never used, the header's indexCount counts from 1)."""
    by_offset: dict[int, list[int]] = defaultdict(list)
    for path in index_dir.iterdir():
        data = path.read_bytes()
        index_count = struct.unpack_from(">i", data, 36)[0]
        for i in range(1, index_count):
            key_hash, phy_offset = struct.unpack_from(">iq", data, 40 + slots * 4 + i * 20)
            by_offset[phy_offset].append(key_hash)
    return by_offset


def test_fixture_index_holds_our_hash_of_every_key(pristine_store: Callable[[str], Path]) -> None:
    """RocketMQ indexed ``topic#key`` for each KEYS word and the UNIQ_KEY of all 3000 messages; our
    hashes of those strings must be exactly the stored key hashes (non-BMP keys included)."""
    store = pristine_store("normal-raw")
    stored = _index_entries(store / "index", slots=100)
    checked_non_bmp = 0
    for entry in iter_commitlog(store / "commitlog"):
        if not isinstance(entry, RecordEntry):
            continue
        record = entry.record
        keys = [record.uniq_key] if record.uniq_key else []
        keys += [k for k in (record.keys or "").split(" ") if k]
        expected = sorted(index_key_hash(f"{record.topic}#{key}") for key in keys)
        assert sorted(stored[entry.offset]) == expected, entry.offset
        checked_non_bmp += any(ord(c) > 0xFFFF for c in record.keys or "")
    assert checked_non_bmp == 15
