"""``python -m services.query``: the query service alone (see ``mqstore query --help``)."""

import sys

from services.cli import main

sys.exit(main(["query", *sys.argv[1:]]))
