"""One worker's record of its processes: the file format, and the kill that honours its start times.

A record is one file (`<state>/run/workers/<name>`), one line per process, "pid start_time" (psutil's
create_time), the worker's own line first. The agent writes it (freeride.agent.procs.records); the worker
reads its own when it has lost its agent (freeride.worker.leftovers). Shared here because the worker may not
import the agent.

What a record is worth: the agent and its workers run as one user, so a task can rewrite any record.
It is therefore only ever acted on by a process that could have killed what it names anyway: the agent
that wrote it (from its memory, never from the file) and the worker it belongs to. A new agent never
kills by a record alone (freeride.agent.procs.workers.reclaim).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from pathlib import Path

import psutil

Procs = dict[int, float]  # pid -> start time (psutil create_time)
# The path of a worker's record, in its environment: what the worker reads when it has lost its agent.
RECORD_ENV = "FREERIDE_WORKER_RECORD"


def read(path: Path) -> Procs:
    """The processes a record names, in its order; a line that does not parse is skipped, a missing file is {}."""
    procs: Procs = {}
    with contextlib.suppress(OSError):
        for line in path.read_text().splitlines():
            pid, _, start = line.partition(" ")
            with contextlib.suppress(ValueError):
                procs[int(pid)] = float(start)
    return procs


def same(pid: int, start: float) -> psutil.Process | None:
    """The process `pid` if it still runs and is the one that started at `start` (not a reused pid)."""
    try:
        p = psutil.Process(pid)
        return p if abs(p.create_time() - start) < 0.01 and p.status() != psutil.STATUS_ZOMBIE else None
    except psutil.Error:
        return None


def kill(procs: Mapping[int, float]) -> list[str]:
    """SIGKILL each process still alive whose start time matches; their descriptions ("pid (name)")."""
    killed = []
    for pid, start in procs.items():
        p = same(pid, start)
        if p is None:
            continue
        with contextlib.suppress(psutil.Error):
            what = f"{pid} ({p.name()})"
            p.kill()
            killed.append(what)
    return killed
