"""What a worker's exit code tells the agent when its gRPC stream can no longer say it (WorkerFailed).

A worker whose task closed the descriptors it lives on (the window pipe, its wake-up pipe, gRPC's own)
cannot send a word more: it writes the reason into the task's log and exits with NO_RESTART, and the
agent fails the task at once with that log line as its reason. The task would close them again after
every restart, as a bad argument would fail every construction.
"""

from __future__ import annotations

import os

NO_RESTART = os.EX_CONFIG  # 78: the task as written cannot run here; FAILED with the log's last line, not retried
