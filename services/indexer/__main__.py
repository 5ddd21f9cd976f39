"""``python -m mqstore.services.indexer``: the indexer alone (see ``mqstore indexer --help``)."""

import sys

from mqstore.services.cli import main

sys.exit(main(["indexer", *sys.argv[1:]]))
