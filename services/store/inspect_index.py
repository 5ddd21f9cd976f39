"""``mqstore inspect index FILE [--json] [--slots]``: decode one IndexFile offline, read-only.

``--json`` prints the header first (``type`` "indexheader" with the field names of the reference
dumps' ``indexfile`` rows, raw values as stored), then one ``indexentry`` object per entry 1 ..
indexCount-1 and, with ``--slots``, one ``indexslot`` object per non-empty hash slot. Without it, a
table for people. The geometry (hashSlotNum, indexNum) is not stored in the file: it is inferred from
the file size with RocketMQ's ratio indexNum = 4 x hashSlotNum unless given.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from services.store.index_file import (
    HASH_SLOT_SIZE,
    INDEX_ENTRY_SIZE,
    INDEX_HEADER_SIZE,
    IndexFile,
    IndexFileError,
    IndexHeader,
    index_file_size,
)
from services.store.inspect_output import silence_stdout, stdout_bytes, usage_error

PROG = "mqstore inspect index"
DEFAULT_SLOTS_PER_INDEX = 4  # RocketMQ's defaults: 5,000,000 slots, 20,000,000 entries


def infer_geometry(file_size: int, hash_slot_num: int | None = None,
                   index_num: int | None = None) -> tuple[int, int]:
    """(hashSlotNum, indexNum) for a file of ``file_size`` bytes; one given value fixes the other."""
    body = file_size - INDEX_HEADER_SIZE
    if hash_slot_num is None and index_num is None:
        per_slot = HASH_SLOT_SIZE + DEFAULT_SLOTS_PER_INDEX * INDEX_ENTRY_SIZE
        if body <= 0 or body % per_slot:
            raise IndexFileError(f"cannot infer the geometry of a {file_size}-byte file: "
                                 "pass --hash-slot-num and --index-num")
        return body // per_slot, DEFAULT_SLOTS_PER_INDEX * (body // per_slot)
    if hash_slot_num is None:
        assert index_num is not None
        hash_slot_num, rest = divmod(body - index_num * INDEX_ENTRY_SIZE, HASH_SLOT_SIZE)
    elif index_num is None:
        index_num, rest = divmod(body - hash_slot_num * HASH_SLOT_SIZE, INDEX_ENTRY_SIZE)
    else:
        rest = file_size - index_file_size(hash_slot_num, index_num)
    if rest or hash_slot_num <= 0 or index_num <= 1:
        raise IndexFileError(f"a {file_size}-byte file does not fit hashSlotNum {hash_slot_num}, "
                             f"indexNum {index_num}")
    return hash_slot_num, index_num


def header_row(name: str, file_size: int, header: IndexHeader) -> dict[str, Any]:
    return {"type": "indexheader", "name": name, "fileSize": file_size,
            "beginTimestamp": header.begin_timestamp, "endTimestamp": header.end_timestamp,
            "beginPhyOffset": header.begin_phy_offset, "endPhyOffset": header.end_phy_offset,
            "hashSlotCount": header.hash_slot_count, "indexCount": header.index_count}


def rows(index_file: IndexFile, slots: bool) -> Iterator[dict[str, Any]]:
    """Every output object, header first; streamed, since a default file holds 20 million entries."""
    yield header_row(index_file.name, index_file.file_size, index_file.stored_header())
    for e in index_file.entries():
        yield {"type": "indexentry", "entry": e.number, "keyHash": e.key_hash, "phyOffset": e.phy_offset,
               "timeDiff": e.time_diff, "prevIndex": e.prev_index}
    if slots:
        for slot, value in index_file.slots():
            yield {"type": "indexslot", "slot": slot, "value": value}


def _text_line(row: dict[str, Any]) -> str:
    kind = row["type"]
    if kind == "indexheader":
        fields = " ".join(f"{k}={v}" for k, v in row.items() if k != "type")
        return f"# {fields}\n{'ENTRY':>10}  {'KEYHASH':>10}  {'PHYOFFSET':>14}  {'TIMEDIFF':>10}  {'PREV':>10}"
    if kind == "indexentry":
        return (f"{row['entry']:>10}  {row['keyHash']:>10}  {row['phyOffset']:>14}  "
                f"{row['timeDiff']:>10}  {row['prevIndex']:>10}")
    return f"# slot {row['slot']} -> entry {row['value']}"








def main(file: str, as_json: bool, slots: bool = False, hash_slot_num: int | None = None,
         index_num: int | None = None) -> int:
    """Print index file ``file``. Returns 0, or 2 after a one-line message on stderr."""
    path = Path(file)
    if not path.is_file():
        return usage_error(PROG, f"{file}: not a file (pass one file of an index directory)")
    try:
        geometry = infer_geometry(path.stat().st_size, hash_slot_num, index_num)
        index_file = IndexFile(path, *geometry, read_only=True)
    except IndexFileError as exc:
        return usage_error(PROG, str(exc))
    except OSError as exc:
        return usage_error(PROG, f"{file}: {exc.strerror or exc}")
    try:
        out = stdout_bytes()
        for row in rows(index_file, slots):
            line = json.dumps(row, separators=(",", ":")) if as_json else _text_line(row)
            out.write((line + "\n").encode())
        out.flush()
    except BrokenPipeError:
        silence_stdout()
    finally:
        index_file.close()
    return 0
