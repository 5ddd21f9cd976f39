"""``mqstore ARGS`` started ahead: imports the commitlog service first, then waits for one line on stdin.

Importing the service takes a second or more on a busy machine; a campaign that restarts it after
every cut starts the next process while the current one runs, and releases it once the file system
is mounted again (the line read is the moment the real start begins).
"""

from __future__ import annotations

import sys

import services.commitlog.main  # noqa: F401 - the import is the point: done before the go
from services.cli import main

if __name__ == "__main__":
    sys.stdin.readline()
    sys.argv = ["mqstore", *sys.argv[1:]]
    sys.exit(main())
