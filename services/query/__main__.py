"""``python -m services.query``: the query service alone (see ``mqstore serve query --help``)."""

import sys

from services.cli import main

sys.exit(main(["serve", "query", *sys.argv[1:]]))
