"""Move modules to the paths their names say, and rewrite every reference to them.

The source tree is what it imports: ``services/store/formats/record.py`` is the module
``services.store.formats.record``, with no generated links between the two. This script holds the one table
of module moves (``MOVES``) and applies it mechanically, because several people edit the tree at once:

* ``--move`` runs ``git mv`` for every move whose source still exists (run once, by whoever lands a move);
* then, in the files named (or every tracked and untracked-but-not-ignored text file when none are named),
  it rewrites dotted module names (imports, ``-m`` strings, mock targets, contracts, docs), ``from package
  import module`` forms of a moved module, and source paths (``services/store/formats/record.py``).

Rewriting is idempotent: a new name never matches an old one (names are matched whole, never as a prefix of
a longer name), so it can be rerun on a file at any time. Wire names (``apache.rocketmq.v2.MessagingService``)
never carried the ``mqstore.`` prefix and are left alone.

Usage: ``python tools/relayout.py [--move] [--check] [FILE ...]``
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_FORMATS = [
    "checkpoint", "consume_queue", "consumer_offsets_file", "delay_offsets_file",
    "dispatch_columns", "geometry", "index_file", "index_reader", "index_service", "java_hash", "mapped_file",
    "mapped_file_queue", "message", "message_id", "parked_record", "quarantine", "readonly_files", "record",
    "record_scan", "socket_address", "store_layout", "timer_files", "transient_store_pool", "uniq_key",
]
_RULES = [
    "batch_codec", "due_message", "key_query", "names", "producer_message", "pull_request", "subscription",
    "timer_message", "topics", "unconsumed",
]
_TOOLS = ["inspect_commitlog", "inspect_consumequeue", "inspect_index", "inspect_output", "rocketmq_layout_export"]

# old path -> new path, relative to the repository root (files or whole folders). The old paths are split
# literals so that a rewrite of the whole tree leaves this table as it is.
MOVES: dict[str, str] = {
    **{f"services/store/{m}.py": f"services/store/formats/{m}.py" for m in _FORMATS},
    "services/store/" "commitlog_files.py": "services/store/formats/commitlog_walk.py",
    **{f"services/store/{m}.py": f"services/store/rules/{m}.py" for m in _RULES},
    "services/store/" "transactions.py": "services/store/rules/transaction_records.py",
    "services/store/" "consumer_groups.py": "services/store/rules/group_membership.py",
    **{f"services/store/{m}.py": f"services/store/tools/{m}.py" for m in _TOOLS},
    "services/commitlog/" "queue_offsets.py": "services/commitlog/topic_queue_table.py",
    "services/query/" "queue_offsets.py": "services/query/queue_offset_lookup.py",
    "services/query/" "consumer_groups.py": "services/query/consumer_manager.py",
    "services/indexer/" "commitlog_files.py": "services/indexer/commitlog_reader.py",
    "gateway/" "transactions.py": "gateway/transaction_relay.py",
    "gateway/" "uniq_key.py": "gateway/uniq_key_maker.py",
    "mqstore" "_client": "mqstore/client",
}
NEW_PACKAGES = ["services/store/formats", "services/store/rules", "services/store/tools"]

_PACKAGE_DOCS = {
    "services/store/formats": "On-disk formats: the bytes of RocketMQ's store files and the files that hold them.",
    "services/store/rules": "Rules every service checks the same way: names, bounds, topics, subscriptions.",
    "services/store/tools": "Offline tools over a store directory: inspection and the RocketMQ layout export.",
}


def _dotted(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".")


_DOTTED_MOVES = {_dotted(old): _dotted(new) for old, new in MOVES.items() if old.endswith(".py")}

# Dotted names first lose the old namespace prefix; the client and mqstore.v1 keep theirs.
_PREFIX = [
    (re.compile(r"\bmqstore\.apache\.rocketmq\b"), "apache.rocketmq"),
    (re.compile(r"\bmqstore\.(services|gateway|pipeline|bench)\b"), r"\1"),
]
_FROM_IMPORT = re.compile(r"^(\s*)from ([\w.]+) import (\w+)( as \w+)?[ \t]*$", re.M)
_TEXT_SUFFIXES = {".py", ".pyi", ".md", ".toml", ".yaml", ".yml", ".txt", ".cfg", ".ini", ".sh", ".json", ".js",
                  ".ts", ".mjs", ".properties", ""}
_SKIP_PARTS = {"gen", ".venv", "node_modules", "fixtures", ".git"}


def _whole(name: str) -> re.Pattern[str]:
    return re.compile(r"(?<![\w.])" + re.escape(name) + r"(?!\w)")


_DOTTED_RULES = [(_whole(old), new) for old, new in sorted(_DOTTED_MOVES.items(), key=lambda kv: -len(kv[0]))]
_PATH_RULES = [
    (re.compile(r"(?<![\w])(?<!mqstore/)" + re.escape(old) + (r"(?![\w])" if old.endswith(".py") else r"(?=/)")), new)
    for old, new in sorted(MOVES.items(), key=lambda kv: -len(kv[0]))
]


def _from_import(match: re.Match[str]) -> str:
    indent, package, name, alias = match.groups()
    moved = _DOTTED_MOVES.get(f"{package}.{name}")
    if moved is None:
        return match.group(0)
    parent, new_name = moved.rsplit(".", 1)
    if alias is None and new_name != name:
        alias = f" as {name}"
    return f"{indent}from {parent} import {new_name}{alias or ''}"


def rewrite(text: str) -> str:
    for pattern, replacement in _PREFIX:
        text = pattern.sub(replacement, text)
    text = _FROM_IMPORT.sub(_from_import, text)
    for pattern, replacement in _DOTTED_RULES:
        text = pattern.sub(replacement, text)
    for pattern, replacement in _PATH_RULES:
        text = pattern.sub(replacement, text)
    return text


def _candidate_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            check=True, capture_output=True, text=True).stdout.splitlines()
    files = []
    for rel in listed:
        path = ROOT / rel
        if _SKIP_PARTS.intersection(Path(rel).parts) or path.suffix not in _TEXT_SUFFIXES or not path.is_file():
            continue
        if path.suffix == "" and path.name not in {"Makefile", "Dockerfile", "run"}:
            continue
        if path == Path(__file__).resolve():
            continue
        files.append(path)
    return files


def move() -> None:
    for package in NEW_PACKAGES:
        init = ROOT / package / "__init__.py"
        if not init.exists():
            init.parent.mkdir(parents=True, exist_ok=True)
            init.write_text(f'"""{_PACKAGE_DOCS[package]}"""\n')
            subprocess.run(["git", "add", str(init)], cwd=ROOT, check=True)
    for old, new in MOVES.items():
        if (ROOT / old).exists() and not (ROOT / new).exists():
            (ROOT / new).parent.mkdir(parents=True, exist_ok=True)
            subprocess.run(["git", "mv", old, new], cwd=ROOT, check=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tools/relayout.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--move", action="store_true", help="git mv every module still at its old path")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if anything would change")
    parser.add_argument("files", nargs="*", type=Path)
    args = parser.parse_args(argv)
    if args.move and not args.check:
        move()
    files = [f.resolve() for f in args.files] or _candidate_files()
    changed = []
    for path in files:
        before = path.read_text(encoding="utf-8", errors="surrogateescape")
        after = rewrite(before)
        if after != before:
            changed.append(path)
            if not args.check:
                path.write_text(after, encoding="utf-8", errors="surrogateescape")
    for path in changed:
        print(f"{'would rewrite' if args.check else 'rewrote'} {path.relative_to(ROOT)}")
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
