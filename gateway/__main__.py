import sys

from mqstore.services.cli import main

sys.exit(main(["gateway", *sys.argv[1:]]))
