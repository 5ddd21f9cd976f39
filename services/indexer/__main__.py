"""``python -m services.indexer``: the indexer alone (see ``mqstore indexer --help``)."""

import sys

from services.cli import main

sys.exit(main(["indexer", *sys.argv[1:]]))
