"""`python -m freeride.worker --agent ADDR --task-id ID --instance N ...`: the agent starts one per task."""

import sys

from freeride.worker.process import main

sys.exit(main())
