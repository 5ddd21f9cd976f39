"""The fast recovery scan (services/store/formats/record_scan.py) against check_record, record by record.

scan_file must stop exactly where a walk of check_record calls (plus the PHYSICALOFFSET check of
recovery) stops, on any layout (IPv6 hosts, the v2 magic, non-ASCII text, SCHEDULE_TOPIC_XXXX with a
good or a bad DELAY) and after any damage. survey must tell a clean end, a torn tail and a damaged
record with intact ones after it, and count what a cut there drops.
"""

from __future__ import annotations

import mmap
import os
import random
import struct
from dataclasses import dataclass
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from services.store.formats.message import (
    BORNHOST_V6_FLAG,
    SCHEDULE_TOPIC,
    STOREHOSTADDRESS_V6_FLAG,
    properties_to_string,
)
from services.store.formats.record import (
    MESSAGE_MAGIC_CODE_V2,
    SIZE_AND_MAGIC,
    check_record,
    encode_blank,
    encode_record_parts,
)
from services.store.formats.record_scan import FileView, Stop, diagnose, record_positions, scan_file, survey
from services.store.formats.socket_address import encode_address

FILE_SIZE = 16 * 1024
BASE = 7 * FILE_SIZE  # a file that is not the first: PHYSICALOFFSET is not the position


@dataclass(frozen=True)
class Spec:
    topic: str
    properties: dict[str, str]
    body: bytes
    sys_flag: int = 0
    v2: bool = False


def encode(spec: Spec, offset: int) -> bytes:
    born = encode_address("[::1]:7" if spec.sys_flag & BORNHOST_V6_FLAG else "10.0.0.1:7")
    store = encode_address("[fe80::2]:9" if spec.sys_flag & STOREHOSTADDRESS_V6_FLAG else "10.0.0.2:9")
    topic, props = spec.topic.encode(), properties_to_string(spec.properties).encode()
    head, body, tail = encode_record_parts(
        topic=topic, queue_id=1, body=spec.body, flag=0, properties=props, sys_flag=spec.sys_flag,
        born_timestamp=1, born_host=born, store_host=store, queue_offset=3, commitlog_offset=offset,
        store_timestamp=2)
    if not spec.v2:
        return head + body + tail
    tail = struct.pack(">H", len(topic)) + topic + struct.pack(">h", len(props)) + props
    total = len(head) + len(body) + len(tail)
    return SIZE_AND_MAGIC.pack(total, MESSAGE_MAGIC_CODE_V2) + head[8:] + body + tail


def build(specs: list[Spec], base: int = BASE, size: int = FILE_SIZE, blank: bool = True) -> bytearray:
    """One file: the records back to back, then a BLANK record (or zeros), the rest zeros."""
    data = bytearray()
    for spec in specs:
        data += encode(spec, base + len(data))
    if blank:
        data += encode_blank(size - len(data))
    assert len(data) <= size
    return data + bytes(size - len(data))


def reference(buf: bytearray, base: int, check_crc: bool = True) -> tuple[list[int], int, bool]:
    """What recovery did before record_scan: check_record record after record."""
    starts: list[int] = []
    pos = 0
    while True:
        request = check_record(buf, pos, check_crc)
        if not request.success:
            return starts, pos, False
        if request.msg_size == 0:
            return starts, pos, True
        if request.commitlog_offset != base + pos:
            return starts, pos, False
        starts.append(pos)
        pos += request.msg_size


def assert_same(buf: bytearray, base: int = BASE, check_crc: bool = True) -> None:
    scan = scan_file(buf, 0, base, check_crc)
    starts, end, blank = reference(buf, base, check_crc)
    assert (list(scan.starts), scan.end, scan.blank) == (starts, end, blank)


SPECS = st.builds(
    Spec,
    topic=st.sampled_from(["TopicA", "t" * 120, "主题-Topic", SCHEDULE_TOPIC, "%RETRY%group", "x"]),
    properties=st.sampled_from([{}, {"KEYS": "k1 k2"}, {"TAGS": "标签", "KEYS": "k"}, {"DELAY": "3"},
                                {"DELAY": "x3"}, {"UNIQ_KEY": "A" * 32, "CLUSTER": "DefaultCluster"}]),
    body=st.binary(max_size=300),
    sys_flag=st.sampled_from([0, 0, 0, 0x4, 0x8, 0xC, BORNHOST_V6_FLAG, STOREHOSTADDRESS_V6_FLAG, 0x30 | 0x8]),
    v2=st.sampled_from([False, False, False, True]),
)
DAMAGES = ("flip", "zero_from", "word")


def damage(buf: bytearray, rng: random.Random, data_end: int) -> None:
    """One random damage inside the records: a flipped byte, zeros from a point on, or a garbage word."""
    kind = rng.choice(DAMAGES)
    where = rng.randrange(max(data_end, 1))
    if kind == "flip":
        buf[where] ^= 1 << rng.randrange(8) if rng.random() < 0.7 else rng.randrange(1, 256)
    elif kind == "zero_from":
        buf[where:] = bytes(len(buf) - where)
    else:
        buf[where:where + 4] = rng.randbytes(4)


@settings(max_examples=150, deadline=None)
@given(specs=st.lists(SPECS, min_size=1, max_size=25), seed=st.integers(0, 2**32), check_crc=st.booleans())
def test_scan_stops_where_check_record_does(specs: list[Spec], seed: int, check_crc: bool) -> None:
    clean = build(specs)
    assert_same(clean, check_crc=check_crc)
    data_end = sum(len(encode(s, 0)) for s in specs)
    rng = random.Random(seed)
    for _ in range(20):
        buf = bytearray(clean)
        damage(buf, rng, data_end)
        assert_same(buf, check_crc=check_crc)


def test_every_kind_of_record_passes() -> None:
    specs = [Spec("TopicA", {"KEYS": "k"}, b"abc"), Spec("主题", {"TAGS": "标签"}, b""),
             Spec(SCHEDULE_TOPIC, {"DELAY": "3", "REAL_TOPIC": "T"}, b"x"), Spec("T", {}, b"y", v2=True),
             Spec("T6", {}, b"z", sys_flag=BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG), Spec("p", {}, b"q", 0x4)]
    buf = build(specs)
    scan = scan_file(buf, 0, BASE)
    assert scan.blank and scan.records == len(specs)
    assert_same(buf)
    starts, end, blank = record_positions(buf, 0, FILE_SIZE)
    assert (list(starts), end, blank) == (list(scan.starts), scan.end, True)


def test_text_checks_cut_at_the_first_bad_record() -> None:
    """Bad UTF-8 and a DELAY that is not an int are found by the vectorised text check, in log order."""
    specs = [Spec("TopicA", {"KEYS": f"k{i}"}, b"body") for i in range(10)]
    specs[4] = Spec(SCHEDULE_TOPIC, {"DELAY": "nope"}, b"delayed")
    specs[7] = Spec("TopicA", {"KEYS": "é"}, b"body")
    buf = build(specs)
    sizes = [len(encode(s, 0)) for s in specs]
    assert scan_file(buf, 0, BASE).end == sum(sizes[:4])
    buf = build([*specs[:4], Spec("TopicA", {}, b"x"), *specs[5:]])
    at = sum(sizes[:4]) + len(encode(Spec("TopicA", {}, b"x"), 0)) + sum(sizes[5:7])
    buf[at + len(encode(specs[7], 0)) - 1] = 0xFF  # the last byte of "é": no longer UTF-8
    assert scan_file(buf, 0, BASE).end == at
    assert_same(buf)


def test_a_record_at_the_wrong_offset_ends_the_walk() -> None:
    buf = build([Spec("TopicA", {}, b"a"), Spec("TopicA", {}, b"b")])
    scan = scan_file(buf, 0, BASE + 1)
    assert (scan.end, scan.blank, scan.records) == (0, False, 0)
    assert "PHYSICALOFFSET mismatch" in diagnose(buf, 0, BASE + 1).reason


# --- survey: what lies past the end -----------------------------------------------------------------

def ten_records() -> tuple[list[Spec], list[int]]:
    specs = [Spec("TopicA", {"KEYS": f"k{i}"}, bytes([i]) * 100) for i in range(10)]
    sizes = [len(encode(s, 0)) for s in specs]
    return specs, [sum(sizes[:i]) for i in range(11)]


def stop_of(buf: bytearray, base: int = BASE) -> Stop:
    scan = scan_file(buf, 0, base)
    return diagnose(buf, scan.end, base)


def test_a_clean_end_is_no_damage() -> None:
    specs, _ = ten_records()
    buf = build(specs, blank=False)
    stop = stop_of(buf)
    assert stop.clean and stop.reason == "all zero bytes (end of data)"
    assert survey(stop, [FileView(BASE, bytes(buf)), FileView(BASE + FILE_SIZE, bytes(FILE_SIZE))]) is None


def test_a_crc_failure_with_records_after_it_counts_them_all() -> None:
    specs, ends = ten_records()
    first = build(specs)
    second = build(specs[:3], base=BASE + FILE_SIZE, blank=False)
    first[ends[4] + 88 + 50] ^= 0x01  # inside record 4's body
    stop = stop_of(first)
    assert (stop.offset, stop.clean) == (BASE + ends[4], False)
    assert stop.reason.startswith("body CRC mismatch")
    found = survey(stop, [FileView(BASE, bytes(first)), FileView(BASE + FILE_SIZE, bytes(second))])
    assert found is not None and not found.torn_tail
    assert found.intact_records == 5 + 3
    assert found.dropped_bytes == BASE + FILE_SIZE + ends[3] - (BASE + ends[4])
    assert f"offset {BASE + ends[4]}" in found.describe() and "8 intact records" in found.describe()


def test_a_garbled_size_is_skipped_by_searching_for_the_next_record() -> None:
    specs, ends = ten_records()
    buf = build(specs, blank=False)
    buf[ends[2]:ends[2] + 4] = struct.pack(">i", 1 << 30)
    stop = stop_of(buf)
    assert stop.reason.startswith("bad TOTALSIZE 1073741824")
    found = survey(stop, [FileView(BASE, bytes(buf))])
    assert found is not None
    assert (found.intact_records, found.dropped_bytes) == (7, ends[10] - ends[2])


def test_a_torn_last_record_is_a_torn_tail() -> None:
    specs, ends = ten_records()
    buf = build(specs, blank=False)
    buf[ends[9] + 30:ends[10]] = bytes(ends[10] - ends[9] - 30)
    stop = stop_of(buf)
    assert stop.reason.startswith("torn or garbled record")
    found = survey(stop, [FileView(BASE, bytes(buf)), FileView(BASE + FILE_SIZE, bytes(FILE_SIZE))])
    assert found is not None and found.torn_tail
    assert (found.offset, found.dropped_bytes) == (BASE + ends[9], ends[10] - ends[9])
    assert "torn record" in found.describe()


def test_zeros_followed_by_a_file_with_records_is_a_gap() -> None:
    specs, ends = ten_records()
    first = build(specs[:2], blank=False)
    second = build(specs[:4], base=BASE + FILE_SIZE, blank=False)
    found = survey(stop_of(first), [FileView(BASE, bytes(first)), FileView(BASE + FILE_SIZE, bytes(second))])
    assert found is not None and found.intact_records == 4
    assert found.dropped_bytes == BASE + FILE_SIZE + ends[4] - (BASE + ends[2])
    assert "later files hold records" in found.reason


def test_the_search_past_a_bad_record_skips_holes(tmp_path: Path) -> None:
    """With a descriptor, survey jumps over a sparse file's holes (SEEK_DATA) and finds the same records."""
    specs, ends = ten_records()
    data = build(specs, blank=False)[:ends[10]]
    data[ends[9] + 88 + 10] ^= 0x01  # the last record of the run fails its CRC
    far = 512 * 1024
    path = tmp_path / f"{BASE:020d}"
    with open(path, "wb") as f:
        f.write(data)
        f.seek(far)
        f.write(encode(specs[0], BASE + far))  # one intact record after a hole
        f.truncate(1024 * 1024)
    fd = os.open(path, os.O_RDONLY)
    try:
        with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as mapped:
            stop = diagnose(mapped, scan_file(mapped, 0, BASE).end, BASE)
            assert stop.offset == BASE + ends[9]
            for view in (FileView(BASE, mapped, fd), FileView(BASE, mapped)):
                found = survey(stop, [view])
                assert found is not None
                assert (found.intact_records, found.dropped_bytes) == (1, far + ends[1] - ends[9])
    finally:
        os.close(fd)
