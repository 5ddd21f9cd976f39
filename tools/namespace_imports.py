"""Rewrite every reference to the top-level packages into the one ``mqstore.`` import namespace (issue 13).

Why a script: the folders stay where they are (``services/``, ``gateway/``, ``pipeline/``, ``bench/``,
``mqstore_client/``); only the names code imports them by change (``services.store`` becomes
``mqstore.services.store``, ``mqstore_client`` becomes ``mqstore.client``, the generated RocketMQ 5 code
``apache.rocketmq.v2`` becomes ``mqstore.apache.rocketmq.v2``). Several people edit the tree at once, so the
rename is a mechanical pass that can be run again at any time: it is deterministic and idempotent (a name
already under ``mqstore.`` is never touched again), and it prints every line it changes.

What it rewrites, in tracked and untracked-but-not-ignored files (code, tests, docs, Makefile, Dockerfile,
k8s manifests, pyproject):

* dotted module names ``services.x...``, ``gateway.x...``, ``pipeline.x...``, ``bench.x...``,
  ``mqstore_client.x...`` wherever they appear (imports, ``-m`` strings, entry points, import-linter
  contracts, mock targets, docs), but only when ``x`` is a real module or package in that folder, so that
  ``gateway.yaml`` or ``pipeline.md`` stay as they are;
* bare package names in Python import statements, also in the docs' code samples (``from gateway import x``,
  ``import mqstore_client``), after ``-m`` (``python -m gateway``, ``[sys.executable, "-m", "gateway"]``),
  and ``mqstore_client`` quoted on its own in backticks;
* ``apache.rocketmq`` in Python import statements only (the gRPC service names such as
  ``apache.rocketmq.v2.MessagingService`` are wire names and stay).

Paths (``services/store/record.py``) are never changed. Afterwards ruff sorts the imports of every Python
file (``--no-ruff`` to skip), and lines now longer than 120 characters are listed for a hand fix.

Usage: ``python tools/namespace_imports.py [--check] [--no-ruff] [ROOT]`` (``--check``: change nothing, exit 1
if anything would change).
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

# import name -> (folder in the repository, new import name)
PACKAGES: dict[str, tuple[str, str]] = {
    "services": ("services", "mqstore.services"),
    "gateway": ("gateway", "mqstore.gateway"),
    "pipeline": ("pipeline", "mqstore.pipeline"),
    "bench": ("bench", "mqstore.bench"),
    "mqstore_client": ("mqstore_client", "mqstore.client"),
}
SUFFIXES = {".py", ".pyi", ".md", ".toml", ".yaml", ".yml", ".cfg", ".ini", ".sh", ".txt", ".rst"}
NAMES = {"Makefile", "Dockerfile", "run", "Procfile"}
SKIP_DIRS = ("gen/", ".venv/", "clients/node/node_modules/", "proto/", "build/", "dist/")
SELF = ("tools/namespace_imports.py", "APPLY.md")
# Files whose lines that read like import statements are rewritten as such (docs hold code samples).
CODE_SUFFIXES = {".py", ".pyi", ".md", ".rst"}
LINE_LENGTH = 120
# ruff's E501 lets a line end in a pragma comment run long.
PRAGMA = re.compile(r"#\s*(type:|noqa|pragma)")

_ROOTS = "|".join(PACKAGES)
# A dotted name starting at one of the roots, not itself part of a longer name, path or option.
DOTTED = re.compile(rf"(?<![\w.\-/$])({_ROOTS})((?:\.[A-Za-z_]\w*)+)")
# `from gateway import x`, `import mqstore_client` / `import mqstore_client as c` (bare root only).
FROM_BARE = re.compile(rf"^(\s*from\s+)({_ROOTS})(\s+import\b)")
IMPORT_BARE = re.compile(rf"^(\s*import\s+)({_ROOTS})(\s*(?:as\s+\w+)?\s*(?:#.*)?)$")
# `-m gateway`, `"-m", "gateway"`, `'-m' 'gateway'`.
DASH_M = re.compile(rf"(-m[\"']?\s*,?\s*[\"']?)({_ROOTS})(?=[\"'\s]|$)")
APACHE = re.compile(r"^(\s*(?:from|import)\s+)(apache\.rocketmq\b)")
# The package named on its own in docs and docstrings: `mqstore_client`, ``mqstore_client``.
TICKED = re.compile(r"(?<=`)mqstore_client(?=`)")


def _is_module(root: Path, folder: str, first: str) -> bool:
    base = root / folder
    return (base / f"{first}.py").is_file() or (base / first).is_dir()


def rewrite_line(line: str, root: Path, python: bool) -> str:
    """One line with every old name replaced; a line without one comes back unchanged (the same object)."""

    def dotted(match: re.Match[str]) -> str:
        name, rest = match.group(1), match.group(2)
        folder, new = PACKAGES[name]
        first = rest[1:].split(".", 1)[0]
        # mqstore_client is unambiguous (mqstore_client.Producer too); the short names only before a module.
        return new + rest if name == "mqstore_client" or _is_module(root, folder, first) else match.group(0)

    out = DOTTED.sub(dotted, line)
    out = DASH_M.sub(lambda m: m.group(1) + PACKAGES[m.group(2)][1], out)
    out = TICKED.sub("mqstore.client", out)
    if python:
        out = FROM_BARE.sub(lambda m: m.group(1) + PACKAGES[m.group(2)][1] + m.group(3), out)

        def bare(m: re.Match[str]) -> str:
            tail = m.group(3)
            # `import mqstore_client` keeps the body's `mqstore_client.X` working through an alias.
            alias = "" if tail.strip().startswith("as") else f" as {m.group(2)}"
            return m.group(1) + PACKAGES[m.group(2)][1] + alias + tail

        out = IMPORT_BARE.sub(bare, out)
        out = APACHE.sub(lambda m: m.group(1) + "mqstore." + m.group(2), out)
    return line if out == line else out


def candidate_files(root: Path) -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=root, check=True,
                            capture_output=True, text=True).stdout.splitlines()
    files = []
    for rel in sorted(set(listed)):
        if rel in SELF or rel.startswith(SKIP_DIRS):
            continue
        path = root / rel
        if (path.suffix in SUFFIXES or path.name in NAMES) and path.is_file() and not path.is_symlink():
            files.append(path)
    return files


def rewrite_file(path: Path, root: Path) -> list[tuple[int, str, str]]:
    """Rewrites one file in place (unless ``dry``); returns (line number, old, new) per changed line."""
    text = path.read_text(encoding="utf-8")
    python = path.suffix in CODE_SUFFIXES
    changes = []
    lines = text.splitlines(keepends=True)
    for number, line in enumerate(lines, 1):
        body = line.rstrip("\r\n")
        new = rewrite_line(body, root, python)
        if new is not body:
            changes.append((number, body, new))
            lines[number - 1] = new + line[len(body):]
    if changes:
        path.write_text("".join(lines), encoding="utf-8")
    return changes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", nargs="?", default=str(Path(__file__).resolve().parents[1]))
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if anything would change")
    parser.add_argument("--no-ruff", action="store_true", help="do not sort the changed files' imports with ruff")
    args = parser.parse_args(argv)
    root = Path(args.root).resolve()
    changed: list[Path] = []
    for path in candidate_files(root):
        rel = path.relative_to(root)
        if args.check:
            text = path.read_text(encoding="utf-8")
            python = path.suffix in CODE_SUFFIXES
            hits = [(n, ln, new) for n, ln in enumerate(text.splitlines(), 1)
                    if (new := rewrite_line(ln, root, python)) is not ln]
        else:
            hits = rewrite_file(path, root)
        for number, old, new in hits:
            print(f"{rel}:{number}: {old.strip()}\n{' ' * (len(str(rel)) + len(str(number)) + 2)}-> {new.strip()}")
        if hits:
            changed.append(path)
    print(f"{len(changed)} files {'would change' if args.check else 'changed'}", file=sys.stderr)
    if args.check:
        return 1 if changed else 0
    # Every Python file, not only the changed ones: `mqstore` is first-party now (pyproject's isort setting),
    # so a file that imported only mqstore.v1 sorts its imports differently too.
    python_files = [str(p) for p in candidate_files(root) if p.suffix == ".py"]
    ruff = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    if python_files and not args.no_ruff and Path(ruff).exists():
        subprocess.run([ruff, "check", "--quiet", "--select", "I", "--fix", *python_files], cwd=root, check=False)
    long_lines = [f"{p.relative_to(root)}:{n}" for p in changed if p.suffix in {".py", ".pyi"}
                  for n, ln in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if len(ln) > LINE_LENGTH
                  and not PRAGMA.search(ln)]
    for where in long_lines:
        print(f"longer than {LINE_LENGTH} characters now, wrap by hand: {where}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
