"""What a worker's exit code tells the agent when its gRPC stream can no longer say it (WorkerFailed).

A worker whose task closed the descriptors it lives on (the window pipe, its wake-up pipe, gRPC's own)
cannot send a word more: it writes the reason into the task's log, on a line that begins with
REASON_MARK, and exits with NO_RESTART; the agent fails the task at once with that line as its reason
(the last such line: gRPC's threads may go on logging their broken descriptors after it). The task would
close them again after every restart, as a bad argument would fail every construction.
"""

from __future__ import annotations

import os

REASON_MARK = "freeride worker: "  # begins the worker's last word in the task's log before NO_RESTART
NO_RESTART = os.EX_CONFIG  # 78: the task as written cannot run here; FAILED with the log's last line, not retried
