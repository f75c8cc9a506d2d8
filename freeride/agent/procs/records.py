"""Each worker's processes, written down in the state directory: how an agent finds what its workers started
after it was killed (`kill -9`), and, without cgroups, what a task started that left the worker's process group.

One file per worker, `run/workers/<name>` (the name its cgroup has too: task-<id>-<instance>-<agent pid>),
one line per process, "pid start_time" (psutil's create_time), the worker's own line first. It is written
when the worker starts and, for a worker without a cgroup, each time the memory watchdog's sample finds new
processes in the worker's tree: a process that calls setsid() and clears its environment is still the
worker's descendant, so it is written down within one sample of its start (0.25 s) unless its parent
chain to the worker breaks sooner. It is removed once the worker's processes were killed. A start time
that no longer matches means the pid was reused: that process is never touched.

A new agent reads what its predecessor left (`left`), waits for each old worker to finish the checkpoint
it takes when it loses its agent, then kills the rest (`kill`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

import psutil

from freeride.core.pids import wait_pids
from freeride.core.private import private_dir

Procs = dict[int, float]  # pid -> start time (psutil create_time)


class ProcRecords:
    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def write(self, name: str, procs: Mapping[int, float]) -> None:
        private_dir(self.folder)
        tmp = self.folder / f".{name}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.writelines(f"{pid} {start!r}\n" for pid, start in procs.items())
        os.replace(tmp, self.folder / name)

    def remove(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.folder / name).unlink()

    def left(self) -> dict[str, Procs]:
        """Every record here (a killed agent's), by name; a line that does not parse is skipped."""
        out: dict[str, Procs] = {}
        for path in sorted(self.folder.glob("task-*")) if self.folder.is_dir() else []:
            procs: Procs = {}
            with contextlib.suppress(OSError):
                for line in path.read_text().splitlines():
                    pid, _, start = line.partition(" ")
                    with contextlib.suppress(ValueError):
                        procs[int(pid)] = float(start)
            out[path.name] = procs
        return out


def tree(pid: int) -> Procs:
    """The process and its descendants, with their start times; empty if it is gone."""
    out: Procs = {}
    try:
        root = psutil.Process(pid)
        members = [root, *root.children(recursive=True)]
    except psutil.Error:
        return out
    for p in members:
        with contextlib.suppress(psutil.Error):
            out[p.pid] = p.create_time()
    return out


def _same(pid: int, start: float) -> psutil.Process | None:
    """The process `pid` if it still runs and is the one that started at `start` (not a reused pid)."""
    try:
        p = psutil.Process(pid)
        return p if abs(p.create_time() - start) < 0.01 and p.status() != psutil.STATUS_ZOMBIE else None
    except psutil.Error:
        return None


def kill(procs: Mapping[int, float]) -> list[str]:
    """SIGKILL each recorded process still alive (its start time matching); their descriptions."""
    killed = []
    for pid, start in procs.items():
        p = _same(pid, start)
        if p is None:
            continue
        with contextlib.suppress(psutil.Error):
            what = f"{pid} ({p.name()})"
            p.kill()
            killed.append(what)
    return killed


def wait_exited(procs: Iterable[tuple[int, float]], timeout_s: float) -> list[int]:
    """Block until each process has exited (a pidfd each: an event per process, no polling) or `timeout_s`
    passed; the pids still running. One gone meanwhile (or a kernel without pidfds) is not waited on."""
    return wait_pids((pid for pid, start in procs if _same(pid, start) is not None), timeout_s, unwaitable=OSError)
