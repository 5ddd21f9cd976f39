"""The comparisons of a soak: what one way of reading the store says against what another says.

Every check returns the divergences it found as plain sentences (empty: the two sides agree), so a
test asserts on them and ``make soak`` prints them. The sides compared:

* ConsumeQueue files: the online indexer's, ``pipeline reindex``'s, a fresh indexer's (byte for byte),
  also on a copy of the store with a CRC-damaged record the commitlog quarantined;
* index files: the same three, decoded (header, hash slots, entries; names differ by creation time);
* messages: the commitlog's records (walked offline), ``pipeline export``'s rows, the producers'
  acknowledged sends (by UNIQ_KEY), and what the gateway answers for each of them.
"""

from __future__ import annotations

import struct
import zlib
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from mqstore.client import Client
from mqstore.client.errors import MqstoreError
from mqstore.v1 import query_pb2
from services.store.formats.commitlog_walk import RecordEntry, iter_commitlog
from services.store.formats.consume_queue import CQ_STORE_UNIT_SIZE
from services.store.formats.index_file import IndexEntry, IndexFile, IndexHeader, is_index_file_name
from services.store.formats.message import TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE, TRANSACTION_TYPE_MASK
from services.store.formats.message_id import decode_message_id
from tests.geometry import GeometryPreset
from tests.soak.workload import Ack, Ledger

#: Sentences kept per check (the count says how many there were).
SAMPLES = 12
#: Lookups in flight at once through the gateway.
CONCURRENT_LOOKUPS = 64
_UNIT = struct.Struct(">qiq")


class Findings:
    """Divergences by check name, in the order found."""

    def __init__(self) -> None:
        self.by_check: dict[str, list[str]] = {}

    def add(self, check: str, detail: str) -> None:
        self.by_check.setdefault(check, []).append(detail)

    def extend(self, check: str, details: Iterable[str]) -> None:
        for detail in details:
            self.add(check, detail)

    def of(self, *checks: str) -> list[str]:
        return [d for check in checks for d in self.by_check.get(check, [])]

    def summary(self, *checks: str) -> str:
        """The divergences of ``checks`` (all when none given), SAMPLES per check, with counts."""
        lines = []
        for check in checks or tuple(self.by_check):
            details = self.by_check.get(check, [])
            if details:
                lines.append(f"{check}: {len(details)} divergence(s)")
                lines += [f"  - {d}" for d in details[:SAMPLES]]
                if len(details) > SAMPLES:
                    lines.append(f"  ... and {len(details) - SAMPLES} more")
        return "\n".join(lines)

    def __bool__(self) -> bool:
        return any(self.by_check.values())


# -- ConsumeQueue files --------------------------------------------------------------------------------


def files_under(root: Path) -> dict[str, Path]:
    return {str(p.relative_to(root)): p for p in sorted(root.rglob("*")) if p.is_file()} if root.is_dir() else {}


def compare_consume_queues(expected_name: str, expected: Path, actual_name: str, actual: Path) -> list[str]:
    """``actual``'s ConsumeQueue files against ``expected``'s, byte for byte; a differing file is
    described by its first differing unit."""
    ours, theirs = files_under(expected), files_under(actual)
    if not ours:
        return [f"{expected_name} has no ConsumeQueue files under {expected}"]
    problems = [f"{name}: in {expected_name}, missing from {actual_name}" for name in sorted(ours.keys() - theirs)]
    problems += [f"{name}: in {actual_name}, not in {expected_name}" for name in sorted(theirs.keys() - ours)]
    for name in sorted(ours.keys() & theirs.keys()):
        a, b = ours[name].read_bytes(), theirs[name].read_bytes()
        if a != b:
            problems.append(f"{name}: {actual_name} differs from {expected_name}: {_first_unit_difference(a, b)}")
    return problems


def _first_unit_difference(expected: bytes, actual: bytes) -> str:
    if len(expected) != len(actual):
        return f"size {len(actual)} instead of {len(expected)}"
    first = next(i for i in range(len(expected)) if expected[i] != actual[i]) // CQ_STORE_UNIT_SIZE
    pos = first * CQ_STORE_UNIT_SIZE

    def unit(data: bytes) -> str:
        offset, size, tags = _UNIT.unpack_from(data, pos)
        return f"(commitlog offset {offset}, size {size}, tags code {tags})"

    return f"first at unit {first} of the file: {unit(actual)} instead of {unit(expected)}"


# -- index files ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class IndexContents:
    """One index file decoded: what a query can read from it (its name left out)."""

    name: str
    header: IndexHeader
    slots: tuple[tuple[int, int], ...]
    entries: tuple[IndexEntry, ...]


def index_contents(directory: Path, geometry: GeometryPreset) -> list[IndexContents]:
    files = sorted(p for p in directory.iterdir() if is_index_file_name(p.name)) if directory.is_dir() else []
    contents = []
    for path in files:
        index = IndexFile(path, geometry.hash_slot_num, geometry.index_num, read_only=True)
        try:
            contents.append(IndexContents(path.name, index.stored_header(), tuple(index.slots()),
                                          tuple(index.entries())))
        finally:
            index.close()
    return contents


def compare_indexes(expected_name: str, expected: Sequence[IndexContents], actual_name: str,
                    actual: Sequence[IndexContents]) -> list[str]:
    """The decoded index files of two builds. First the entries of all files together, as (key hash,
    commitlog offset) counts: a lost or repeated entry is named once, not by every later file it
    shifts. Then file by file in name order (headers, entries, hash slots), up to the first file that
    differs when the entries already did."""
    if not expected:
        return [f"{expected_name} has no index files"]
    ours, theirs = Counter(_items(expected)), Counter(_items(actual))
    problems = [f"index entry (key hash {h}, commitlog offset {o}): {ours[(h, o)]} in {expected_name}, "
                f"{theirs[(h, o)]} in {actual_name}" for h, o in sorted((ours - theirs) + (theirs - ours))]
    if len(expected) != len(actual):
        problems.append(f"{actual_name} has {len(actual)} index files, {expected_name} {len(expected)}")
    for number, (a, b) in enumerate(zip(expected, actual, strict=False)):
        where = f"index file #{number} ({expected_name} {a.name}, {actual_name} {b.name})"
        before = len(problems)
        if a.header != b.header:
            problems.append(f"{where}: header {a.header} in {expected_name}, {b.header} in {actual_name}")
        if a.entries != b.entries:
            problems.append(f"{where}: {_first_entry_difference(expected_name, a.entries, actual_name, b.entries)}")
        elif a.slots != b.slots:
            slot = next((x, y) for x, y in zip(a.slots, b.slots, strict=False) if x != y)
            problems.append(f"{where}: hash slots differ, first (slot, entry) {slot[0]} in {expected_name}, "
                            f"{slot[1]} in {actual_name}")
        if len(problems) > before and ours != theirs:
            problems.append("(later files differ as a consequence of the entries above)")
            break
    return problems


def compare_index_items_but(expected_name: str, expected: Sequence[IndexContents], actual_name: str,
                            actual: Sequence[IndexContents], lost: tuple[int, int]) -> list[str]:
    """The entries of two builds as (key hash, commitlog offset) counts, the ``expected`` side's entries
    into the ``lost`` commitlog range [start, end) left out: an indexer that put them before the range
    was quarantined keeps them (lookups skip them), a build after it has none, and the files they shift
    differ as a consequence."""
    start, end = lost
    ours = Counter(item for item in _items(expected) if not start <= item[1] < end)
    theirs = Counter(_items(actual))
    return [f"index entry (key hash {h}, commitlog offset {o}): {ours[(h, o)]} in {expected_name} (less the "
            f"quarantined range [{start}, {end})), {theirs[(h, o)]} in {actual_name}"
            for h, o in sorted((ours - theirs) + (theirs - ours))]


def _items(files: Sequence[IndexContents]) -> Iterator[tuple[int, int]]:
    for f in files:
        for entry in f.entries:
            yield entry.key_hash, entry.phy_offset


def _first_entry_difference(expected_name: str, expected: Sequence[IndexEntry], actual_name: str,
                            actual: Sequence[IndexEntry]) -> str:
    for a, b in zip(expected, actual, strict=False):
        if a != b:
            return f"first differing entry: {a} in {expected_name}, {b} in {actual_name}"
    return f"{len(expected)} entries in {expected_name}, {len(actual)} in {actual_name}"


# -- messages: commitlog, export, acknowledgements -----------------------------------------------------


@dataclass(frozen=True)
class StoredRecord:
    """What the checks need of one record (commitlog, export row or pulled message alike)."""

    commitlog_offset: int
    uniq_key: str
    topic: str
    queue_id: int
    queue_offset: int
    body_crc: int = 0
    store_host: str = ""


def commitlog_records(root: Path) -> tuple[list[StoredRecord], str]:
    """Every record of ``root/commitlog`` (recovery's walk rules) and why the walk ended."""
    walk = iter_commitlog(root / "commitlog")
    records = [StoredRecord(e.offset, e.record.uniq_key or "", e.record.topic, e.record.queue_id,
                            e.record.queue_offset, zlib.crc32(e.record.body), e.record.store_host)
               for e in walk if isinstance(e, RecordEntry) and _queueable(e.record.sys_flag)]
    return records, walk.end.reason if walk.end else "?"


def _queueable(sys_flag: int) -> bool:
    return sys_flag & TRANSACTION_TYPE_MASK not in (TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE)


def export_rows(output: Path) -> list[StoredRecord]:
    """The rows ``pipeline export`` wrote under ``output`` (Parquet, partitioned by topic and date)."""
    import pyarrow.dataset as ds

    if not output.is_dir():
        return []
    table = ds.dataset(output, format="parquet", partitioning="hive").to_table(
        columns=["commitlog_offset", "uniq_key", "topic", "queue_id", "queue_offset"])
    return [StoredRecord(row["commitlog_offset"], row["uniq_key"] or "", str(row["topic"]), row["queue_id"],
                         row["queue_offset"]) for row in table.to_pylist()]


def compare_records(expected_name: str, expected: Sequence[StoredRecord], actual_name: str,
                    actual: Sequence[StoredRecord]) -> list[str]:
    """The same records on both sides (by commitlog offset: UNIQ_KEY, topic, queue, queue offset)."""
    def key(r: StoredRecord) -> tuple[int, str, str, int, int]:
        return r.commitlog_offset, r.uniq_key, r.topic, r.queue_id, r.queue_offset

    ours, theirs = Counter(map(key, expected)), Counter(map(key, actual))
    problems = []
    if len(expected) != len(actual):
        problems.append(f"{actual_name} has {len(actual)} records, {expected_name} {len(expected)}")
    for k in sorted((ours - theirs).elements()):
        problems.append(f"record at commitlog offset {k[0]} (UNIQ_KEY {k[1]}, {k[2]}/{k[3]}@{k[4]}) "
                        f"missing from {actual_name}")
    for k in sorted((theirs - ours).elements()):
        problems.append(f"{actual_name} has a record at commitlog offset {k[0]} (UNIQ_KEY {k[1]}, {k[2]}/{k[3]}"
                        f"@{k[4]}) that {expected_name} has not (or not as many times)")
    return problems


def check_acknowledged(records: Sequence[StoredRecord], ledger: Ledger) -> list[str]:
    """Every acknowledged message is in the commitlog where its receipt says, with its body; every
    record was sent by a producer; a UNIQ_KEY is stored twice only if its send was retried."""
    by_offset = {r.commitlog_offset: r for r in records}
    problems = []
    for ack in ledger.acks.values():
        offset = decode_message_id(ack.offset_msg_id)[1]
        record = by_offset.get(offset)
        if record is None:
            problems.append(f"acknowledged {ack.uniq_key} ({ack.topic}/{ack.queue_id}@{ack.queue_offset}) is not in "
                            f"the commitlog at offset {offset} (its offset msg id {ack.offset_msg_id})")
        elif (record.uniq_key, record.topic, record.queue_id, record.queue_offset, record.body_crc) != \
                (ack.uniq_key, ack.topic, ack.queue_id, ack.queue_offset, ack.body_crc):
            problems.append(f"acknowledged {ack.uniq_key} ({ack.topic}/{ack.queue_id}@{ack.queue_offset}) differs "
                            f"at offset {offset}: stored {record}")
    copies = Counter(r.uniq_key for r in records)
    for record in records:
        if record.uniq_key not in ledger.attempted:
            problems.append(f"commitlog offset {record.commitlog_offset}: UNIQ_KEY {record.uniq_key!r} was never sent")
    for uniq_key, count in copies.items():
        if count > 1 and uniq_key not in ledger.retried:
            problems.append(f"UNIQ_KEY {uniq_key} is stored {count} times but was sent once")
    return problems


# -- through the gateway -------------------------------------------------------------------------------


def check_lookups(gateway: str, acks: Mapping[str, Ack],
                  pulled: Mapping[str, Ack] | None = None) -> dict[str, list[str]]:
    """Each acknowledged message through the gateway: by offset msg id, by UNIQ_KEY, by each key; and
    each of ``pulled`` (default: ``acks``) at its queue offset when its queue is pulled, from the
    lowest of their queue offsets on. Returns divergences by check."""
    problems: dict[str, list[str]] = {"lookup-offset-id": [], "lookup-uniq-key": [], "lookup-key": [], "pull": []}
    ordered = list(acks.values())
    with Client(gateway, timeout=30.0) as client:
        connection = client.connection
        for chunk in _chunks(ordered, CONCURRENT_LOOKUPS):
            by_offset = connection.call_many("GetMessage", [query_pb2.ViewMessageRequest(
                msg_id=a.offset_msg_id, kind=query_pb2.MESSAGE_ID_KIND_OFFSET) for a in chunk])
            by_uniq = connection.call_many("GetMessage", [query_pb2.ViewMessageRequest(
                msg_id=a.uniq_key, topic=a.topic, kind=query_pb2.MESSAGE_ID_KIND_UNIQ_KEY) for a in chunk])
            for ack, found, uniq_found in zip(chunk, by_offset, by_uniq, strict=True):
                problems["lookup-offset-id"] += _found_as(ack, found, f"by offset msg id {ack.offset_msg_id}",
                                                          exact_offset=True)
                problems["lookup-uniq-key"] += _found_as(ack, uniq_found, "by UNIQ_KEY", exact_offset=False)
            keyed = [(a, k) for a in chunk for k in a.keys]
            answers = connection.call_many("QueryByKey", [query_pb2.QueryMessageRequest(
                topic=a.topic, key=k, max_num=64) for a, k in keyed])
            for (ack, key), answer in zip(keyed, answers, strict=True):
                if isinstance(answer, MqstoreError):
                    problems["lookup-key"].append(f"{ack.uniq_key} by key {key!r}: {answer}")
                    continue
                offsets = Counter(m.commitlog_offset for m in answer.messages)
                if _offset_of(ack) not in offsets:
                    problems["lookup-key"].append(
                        f"{ack.uniq_key} by key {key!r}: not among the {len(answer.messages)} answers "
                        f"({answer.index_hits} index hits)")
                elif offsets[_offset_of(ack)] > 1:
                    problems["lookup-key"].append(
                        f"{ack.uniq_key} by key {key!r}: answered {offsets[_offset_of(ack)]} times (commitlog "
                        f"offset {_offset_of(ack)})")
        problems["pull"] = _check_pulls(client, acks if pulled is None else pulled)
    return problems


def _chunks(items: Sequence[Ack], size: int) -> Iterator[Sequence[Ack]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


def _offset_of(ack: Ack) -> int:
    return decode_message_id(ack.offset_msg_id)[1]


def _found_as(ack: Ack, answer: object, how: str, exact_offset: bool) -> list[str]:
    if isinstance(answer, MqstoreError):
        return [f"{ack.uniq_key} {how}: {answer}"]
    message = answer.message  # type: ignore[attr-defined]
    if message.uniq_key != ack.uniq_key or message.topic != ack.topic or \
            zlib.crc32(message.body) != ack.body_crc:
        return [f"{ack.uniq_key} {how}: got {message.topic} UNIQ_KEY {message.uniq_key} at commitlog offset "
                f"{message.commitlog_offset} (body crc {zlib.crc32(message.body)}, expected {ack.body_crc})"]
    if exact_offset and message.commitlog_offset != _offset_of(ack):
        return [f"{ack.uniq_key} {how}: found at commitlog offset {message.commitlog_offset}, not {_offset_of(ack)}"]
    return []


def _check_pulls(client: Client, acks: Mapping[str, Ack]) -> list[str]:
    """Pull every queue an ack names, from its first ack's queue offset to its end; each ack must be at
    its queue offset."""
    problems = []
    expected: dict[tuple[str, int], dict[int, Ack]] = {}
    for ack in acks.values():
        expected.setdefault((ack.topic, ack.queue_id), {})[ack.queue_offset] = ack
    for (topic, queue_id), wanted in sorted(expected.items()):
        try:
            pulled = pull_queue(client, topic, queue_id, min(wanted))
        except MqstoreError as exc:
            problems.append(f"pulling {topic}/{queue_id}: {exc}")
            continue
        for queue_offset, ack in sorted(wanted.items()):
            got = pulled.get(queue_offset)
            if got is None:
                problems.append(f"{ack.uniq_key}: not pulled from {topic}/{queue_id} at queue offset {queue_offset} "
                                f"({len(pulled)} messages pulled, up to {max(pulled, default=-1)})")
            elif got.uniq_key != ack.uniq_key:
                problems.append(f"{ack.uniq_key}: pulling {topic}/{queue_id} at {queue_offset} gave "
                                f"{got.uniq_key} (commitlog offset {got.commitlog_offset})")
    return problems


def pull_queue(client: Client, topic: str, queue_id: int, offset: int = 0) -> dict[int, StoredRecord]:
    """The messages of one queue from ``offset`` to its end, by queue offset, pulled through the gateway."""
    pulled: dict[int, StoredRecord] = {}
    while True:
        response = client.connection.call("Pull", query_pb2.PullMessageRequest(
            topic=topic, queue_id=queue_id, queue_offset=offset, max_messages=1024, max_bytes=8 << 20))
        for m in response.messages:
            pulled[m.queue_offset] = StoredRecord(m.commitlog_offset, m.uniq_key, m.topic, m.queue_id, m.queue_offset)
        if response.next_begin_offset <= offset or response.next_begin_offset >= response.max_offset:
            return pulled
        offset = response.next_begin_offset
