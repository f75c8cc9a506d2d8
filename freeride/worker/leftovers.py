"""What a worker that has lost its agent kills on its way out: the processes its agent wrote down for it.

Without cgroups, a process a task started that left the worker's process group and cleared its environment
is known only from the worker's record (freeride.core.proc_records), which the agent keeps up to date. A new
agent no longer kills by records (a task can write them: freeride.agent.procs.records), so once the agent is
gone the worker does it itself, after its final checkpoint: whatever the record names, the task running in
this process could have killed too, so a forged record gains it nothing here. Its own live descendants go
as well (those the last sample had not seen yet).
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

import psutil

from freeride.core.proc_records import RECORD_ENV, Procs, kill, read

log = logging.getLogger("freeride.worker")


def own_leftovers(environ: dict[str, str] | None = None, pid: int | None = None) -> Procs:
    """The processes this worker's record names and its live descendants, itself left out (`pid`: this
    process, unless told)."""
    me = os.getpid() if pid is None else pid
    path = (os.environ if environ is None else environ).get(RECORD_ENV, "")
    procs = read(Path(path)) if path else {}
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process(me).children(recursive=True):
            with contextlib.suppress(psutil.Error):  # gone meanwhile
                procs[child.pid] = child.create_time()
    procs.pop(me, None)
    return procs


def kill_own_leftovers(environ: dict[str, str] | None = None, pid: int | None = None) -> list[str]:
    """SIGKILL them (start times matching), logging what was killed; their descriptions."""
    killed = kill(own_leftovers(environ, pid))
    if killed:
        log.warning("the agent is gone: killed %d process(es) this task left running: %s", len(killed),
                    ", ".join(killed))
    return killed
