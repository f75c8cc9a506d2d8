"""`python -m freeride`: the `freeride` command."""

import sys

from freeride.main import main

sys.exit(main())
