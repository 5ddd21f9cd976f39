"""``mqstore serve SERVICE ARGS`` started ahead: imports that service first, then waits for one line on stdin.

Importing a service takes a second or more on a busy machine; a campaign that restarts the services
after every cut starts the next processes while the current ones run, and releases them once the file
system is mounted again (the line read is the moment the real start begins).
"""

from __future__ import annotations

import sys

from services.cli import main


def _import_ahead(service: str) -> None:
    """The import is the point: done before the go (explicit imports, so a rename of the modules finds them)."""
    if service == "commitlog":
        import services.commitlog.main  # noqa: F401
    elif service == "indexer":
        import services.indexer.main  # noqa: F401
    elif service == "query":
        import services.query.main  # noqa: F401
    elif service == "scheduler":
        import services.scheduler.main  # noqa: F401


if __name__ == "__main__":
    _import_ahead(sys.argv[2] if len(sys.argv) > 2 and sys.argv[1] == "serve" else "")
    sys.stdin.readline()
    sys.argv = ["mqstore", *sys.argv[1:]]
    sys.exit(main())
