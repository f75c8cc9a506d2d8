import sys

from freeride.cli.main import main

sys.exit(main())
