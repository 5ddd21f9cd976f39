"""``mqstore inspect commitlog DIR [--from OFFSET] [--json]``: decode a commitlog directory offline.

DIR is a store root (mqstore's or RocketMQ's layout) or its commitlog directory. The file size is
mappedFileSizeCommitLog from ``--config``/``MQSTORE_*`` or ``--commitlog-file-size``, else the files'
own (services.store.formats.geometry).

``--json`` prints one object per record, field for field what the RocketMQ reference dumps hold
(``msg`` and ``blank`` rows), so a store written by mqstore can be diffed against one written by
RocketMQ. Without it a table for people. Only reads: safe on a directory a live store is using.

Where the data does not end cleanly (zero bytes, or a final BLANK), stderr says so in one line:
a *torn* record (nothing valid after it: the write a crash cut short, which recovery drops) is a
warning and the exit code stays 0; a *damaged* record with intact records after it (which a recovery
would drop with it) is an error, exit 1, unless ``--allow-corrupt``. Exit 2 is a usage error.

The store's quarantined ranges (``config/quarantine.json``: damaged records a recovery stepped over
under ``recoverCorruptionMode: quarantine``) are listed on stderr, one warning line each. A damaged
record at the start of a quarantined range is one the store already keeps the later records past:
a warning naming ``--from`` for the records after it, exit 0.
"""

from __future__ import annotations

import base64
import sys
import unicodedata
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from services.store.formats.commitlog_walk import (
    BlankEntry,
    CommitLogEntry,
    CommitLogError,
    CommitLogWalk,
    RecordEntry,
    iter_commitlog,
)
from services.store.formats.geometry import GeometryError, GeometryOptions, StoreGeometry
from services.store.formats.message_id import make_message_id
from services.store.formats.quarantine import QuarantineTable
from services.store.formats.store_layout import StoreLayoutError, resolve_store
from services.store.tools.inspect_output import ROCKETMQ_NAMES, SNAKE_CASE, silence_stdout, stdout_bytes, usage_error
from services.store.tools.inspect_output import json_line as output_json_line

PROG = "mqstore inspect commitlog"
EXIT_DAMAGED = 1


def _java_int(value: int) -> int:
    """An unsigned 32-bit value as the signed int Java (and so the dumps) would print."""
    return value - 0x1_0000_0000 if value >= 0x8000_0000 else value


def _utf16_order(key: str) -> bytes:
    """Sort key matching Java's String.compareTo (UTF-16 code units), which the dumps' key order uses."""
    return key.encode("utf-16-be", "surrogatepass")


def entry_row(entry: CommitLogEntry) -> dict[str, Any]:
    """The dump row of one entry: ``msg`` as MessageDecoder.decode plus checkMessageAndReturnSize
    report it, ``blank`` with its signed magic. Key order and value formats follow the dumps."""
    if isinstance(entry, BlankEntry):
        return {"type": "blank", "commitLogOffset": entry.offset, "size": entry.size,
                "magic": _java_int(entry.magic)}
    record, dispatch = entry.record, entry.dispatch
    return {
        "type": "msg",
        "topic": record.topic,
        "queueId": record.queue_id,
        "queueOffset": record.queue_offset,
        "commitLogOffset": record.commitlog_offset,
        "storeSize": record.store_size,
        "bodyCRC": record.body_crc,
        "flag": record.flag,
        "sysFlag": record.sys_flag,
        "bornTimestamp": record.born_timestamp,
        "storeTimestamp": record.store_timestamp,
        "bornHost": record.born_host,
        "storeHost": record.store_host,
        "reconsumeTimes": record.reconsume_times,
        "preparedTransactionOffset": record.prepared_transaction_offset,
        # MessageDecoder leaves the body null when its length is 0; the dumps print that as -1.
        "body": base64.b64encode(record.body).decode("ascii") if record.body else None,
        "bodyLen": len(record.body) if record.body else -1,
        "properties": {k: record.properties[k] for k in sorted(record.properties, key=_utf16_order)},
        "msgId": make_message_id(record.store_host, record.commitlog_offset),
        "dispatch": {
            "success": dispatch.success,
            "msgSize": dispatch.msg_size,
            "tagsCode": dispatch.tags_code,
            "keys": dispatch.keys,
            "uniqKey": dispatch.uniq_key,
        },
    }


def json_line(entry: CommitLogEntry, names: str = ROCKETMQ_NAMES) -> str:
    """One compact JSON line, non-ASCII kept as is, like the dumps (their field names by default)."""
    return output_json_line(entry_row(entry), names)


def _display_width(text: str) -> int:
    return sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)


def _cell(text: str, width: int, right: bool = False) -> str:
    pad = " " * max(0, width - _display_width(text))
    return pad + text if right else text + pad


# (header, width, right-aligned). Widths are fixed so rows can stream: a commitlog holds millions.
_COLUMNS = (("OFFSET", 12, True), ("SIZE", 7, True), ("TOPIC", 26, False), ("QUEUE", 5, True),
            ("QOFFSET", 9, True), ("STORE TIME (UTC)", 23, False), ("TAGS", 14, False), ("KEYS", 0, False))


def _table_line(values: Iterable[str]) -> str:
    cells = [_cell(v, width, right) for v, (_, width, right) in zip(values, _COLUMNS, strict=True)]
    return "  ".join(cells).rstrip()


def _store_time(ms: int) -> str:
    try:
        when = datetime.fromtimestamp(ms / 1000, tz=UTC)
    except (OverflowError, OSError, ValueError):
        return str(ms)
    return when.strftime("%Y-%m-%d %H:%M:%S") + f".{ms % 1000:03d}"


def table_line(entry: CommitLogEntry) -> str:
    if isinstance(entry, BlankEntry):
        return _table_line((str(entry.offset), str(entry.size), "(BLANK: rest of file unused)",
                            "", "", "", "", ""))
    record = entry.record
    return _table_line((str(entry.offset), str(record.store_size), record.topic, str(record.queue_id),
                        str(record.queue_offset), _store_time(record.store_timestamp),
                        record.tags or "-", record.keys or "-"))


def _table_header() -> str:
    return _table_line(name for name, _, _ in _COLUMNS)








def main(dir: str, from_offset: int | None, as_json: bool, options: GeometryOptions | None = None,
         allow_corrupt: bool = False, json_names: str = SNAKE_CASE) -> int:
    """Print every entry of the commitlog of ``dir`` (a store root or its commitlog directory) from
    ``from_offset`` (a record boundary) on. Returns 0, 1 after the data ends at a damaged record with
    intact records after it (0 with ``allow_corrupt``), or 2 after a one-line message on stderr for a
    bad directory, geometry or offset."""
    try:
        layout = resolve_store(Path(dir))
        commitlog = layout.require_commitlog()
        quarantine = QuarantineTable(layout.root)
        quarantine.load()
        walk = iter_commitlog(commitlog, from_offset,
                              file_size=StoreGeometry(options).commitlog_file_size(commitlog))
    except (CommitLogError, GeometryError, StoreLayoutError, ValueError) as exc:  # ValueError: quarantine.json
        return usage_error(PROG, str(exc))
    except OSError as exc:
        return usage_error(PROG, f"{dir}: {exc.strerror or exc}")
    for bad in quarantine.ranges:
        print(f"{PROG}: warning: QUARANTINED range {bad.describe()}: the store answers DATA_LOSS there "
              "and keeps the records after it", file=sys.stderr)
    try:
        _print(walk, as_json, json_names)
    except BrokenPipeError:
        # The reader went away (``| head``): it asked for less, which is not an error.
        silence_stdout()
        return 0
    except (CommitLogError, OSError) as exc:
        return usage_error(PROG, str(exc))
    finally:
        walk.close()
    return _report_damage(walk, allow_corrupt, quarantine)


def _report_damage(walk: CommitLogWalk, allow_corrupt: bool, quarantine: QuarantineTable) -> int:
    """One line on stderr when the data does not end cleanly; the exit code (module docstring)."""
    damage = walk.end.damage if walk.end is not None else None
    if damage is None:
        return 0
    known = quarantine.overlapping(damage.offset, damage.offset + 1)
    if known is not None:
        print(f"{PROG}: warning: the listing stops at the QUARANTINED range {known.describe()}; "
              f"--from {known.end} lists the records after it", file=sys.stderr)
        return 0
    if damage.torn_tail:
        print(f"{PROG}: warning: {damage.describe()}; recovery drops it", file=sys.stderr)
        return 0
    level = "warning" if allow_corrupt else "error"
    hint = "" if allow_corrupt else " (--allow-corrupt to accept)"
    print(f"{PROG}: {level}: {damage.describe()}; a recovery quarantines it and keeps them "
          f"(recoverCorruptionMode: cut would cut the log there and drop them){hint}", file=sys.stderr)
    return 0 if allow_corrupt else EXIT_DAMAGED


def _print(walk: CommitLogWalk, as_json: bool, json_names: str) -> None:
    out = stdout_bytes()
    records = blanks = 0
    if not as_json:
        out.write((_table_header() + "\n").encode())
    for entry in walk:
        if isinstance(entry, RecordEntry):
            records += 1
        else:
            blanks += 1
        out.write(((json_line(entry, json_names) if as_json else table_line(entry)) + "\n").encode())
    if not as_json:
        end = walk.end
        where = f"; data ends at offset {end.offset}: {end.reason}" if end is not None else ""
        out.write(f"# {records} records, {blanks} blanks{where}\n".encode())
    out.flush()
