"""``mqstore inspect index FILE [--json] [--slots]``: decode one IndexFile offline, read-only.

``--json`` prints the header first (``type`` "indexheader" with the field names of the reference
dumps' ``indexfile`` rows, raw values as stored), then one ``indexentry`` object per entry 1 ..
indexCount-1 and, with ``--slots``, one ``indexslot`` object per non-empty hash slot. Without it, a
table for people. The geometry (hashSlotNum, indexNum) is not stored in the file: it is the store's
settings (``--config``/``MQSTORE_*``) or ``--hash-slot-num``/``--index-num``, else inferred from the
file when that is unambiguous (services.store.formats.geometry).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from services.store.formats.geometry import GeometryError, GeometryOptions, StoreGeometry
from services.store.formats.geometry import infer_geometry as infer_geometry  # the one definition, re-exported
from services.store.formats.index_file import IndexFile, IndexFileError, IndexHeader
from services.store.tools.inspect_output import SNAKE_CASE, json_line, silence_stdout, stdout_bytes, usage_error

PROG = "mqstore inspect index"


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








def main(file: str, as_json: bool, slots: bool = False, options: GeometryOptions | None = None,
         json_names: str = SNAKE_CASE) -> int:
    """Print index file ``file``. Returns 0, or 2 after a one-line message on stderr."""
    path = Path(file)
    if not path.is_file():
        return usage_error(PROG, f"{file}: not a file (pass one file of an index directory)")
    try:
        geometry = StoreGeometry(options).index_geometry([path])
        index_file = IndexFile(path, *geometry, read_only=True)
    except (GeometryError, IndexFileError) as exc:
        return usage_error(PROG, str(exc))
    except OSError as exc:
        return usage_error(PROG, f"{file}: {exc.strerror or exc}")
    try:
        out = stdout_bytes()
        for row in rows(index_file, slots):
            line = json_line(row, json_names) if as_json else _text_line(row)
            out.write((line + "\n").encode())
        out.flush()
    except BrokenPipeError:
        silence_stdout()
    finally:
        index_file.close()
    return 0
