"""``python -m mqstore.services.scheduler``: the scheduler alone (see ``mqstore serve scheduler --help``)."""

import sys

from mqstore.services.cli import main

sys.exit(main(["serve", "scheduler", *sys.argv[1:]]))
