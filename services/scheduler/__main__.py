"""``python -m services.scheduler``: the scheduler alone (see ``mqstore serve scheduler --help``)."""

import sys

from services.cli import main

sys.exit(main(["serve", "scheduler", *sys.argv[1:]]))
