"""``python -m services.held_start serve SERVICE ARGS...``: ``mqstore serve SERVICE ARGS...``, held.

It imports the service's modules first, then waits for one line on stdin, and only then starts the
service; at the end of its input without that line it exits (code 0) without starting. ``mqstore up``
starts every child at once this way, so that their imports (half a second of CPU each) overlap, and
releases each once the one before it serves: the services still start in their order.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

from services.cli import main

#: The module ``serve SERVICE`` runs, by service (by name: the services stay independent of each other).
SERVICE_MODULES = {"commitlog": "services.commitlog.main", "indexer": "services.indexer.main",
                   "query": "services.query.main", "scheduler": "services.scheduler.main",
                   "gateway": "gateway.main"}


def held_main(argv: Sequence[str]) -> int:
    if len(argv) > 1 and argv[0] == "serve" and argv[1] in SERVICE_MODULES:
        importlib.import_module(SERVICE_MODULES[argv[1]])
    if not sys.stdin.readline():
        return 0
    return main(argv)


if __name__ == "__main__":
    sys.exit(held_main(sys.argv[1:]))
