"""``python -m services.commitlog [--store DIR] [--config FILE] [--listen HOST:PORT]``."""

import sys

from services.cli import main

sys.exit(main(["commitlog", *sys.argv[1:]]))
