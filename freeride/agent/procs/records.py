"""Each worker's processes, written down in the state directory, and what a new agent may kill of them.

One file per worker, `run/workers/<name>` (the name its cgroup has too: task-<id>-<instance>-<agent pid>), in
the format of freeride.core.proc_records: the worker's own line first, then, for a worker without a cgroup,
each process the memory watchdog's sample found in its tree (a process that calls setsid() and clears its
environment is still the worker's descendant, so it is written down within one sample of its start, 0.25 s,
unless its parent chain to the worker breaks sooner). It is removed once the worker's processes were killed.

Who acts on a record. The agent and its workers run as one user, so a task can write any record here: no
file permission keeps it out, and no key could either (an HMAC key must outlive a `kill -9` of the agent,
so it would be a file that user reads, and the task with it). A record is therefore never proof:
  - the agent that wrote it kills what it holds in memory, never what the file says;
  - the worker it belongs to, when it has lost its agent, kills what its record names
    (freeride.worker.leftovers): the task runs in that process and could kill those pids itself;
  - a new agent (`left`, `proven`) uses a record only to learn which pids to look at, and kills a process
    only for what a task cannot set on a process it did not start: the worker mark of this state directory
    in its environment (set by the agent at exec, `mark`), or being a descendant, now, of a process that
    carries one; and everything in a predecessor's cgroup (freeride.agent.procs.cgroups).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Iterable
from pathlib import Path

import psutil

from freeride.core.pids import wait_pids
from freeride.core.private import private_dir
from freeride.core.proc_records import Procs, read, same

# Set in each worker's environment and inherited by whatever its task starts: the agent finds (and kills) a
# task's processes even after they leave the worker's process group.
WORKER_MARK = "FREERIDE_WORKER"


def state_key(state_dir: Path) -> str:
    """A short name of the state directory, in every worker mark: a new agent kills the marked processes of its
    own state directory only, never the workers of another agent on the host."""
    return hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()[:12]


def mark(agent_pid: int | str, task_id: str, instance: int | str, key: str) -> str:
    """WORKER_MARK's value for a worker: `<agent pid>:<task>:<instance>:<state key>`."""
    return f"{agent_pid}:{task_id}:{instance}:{key}"


def mark_of(name: str, key: str) -> str:
    """The mark of the worker whose record (or cgroup) is `name` (task-<id>-<instance>-<agent pid>)."""
    _, task_id, instance, agent_pid = name.rsplit("-", 3)
    return mark(agent_pid, task_id, instance, key)


class ProcRecords:
    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def path(self, name: str) -> Path:
        return self.folder / name

    def write(self, name: str, procs: Procs) -> None:
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
        """Every record here (a killed agent's, or a task's forgery), by name."""
        return {path.name: read(path) for path in sorted(self.folder.glob("task-*"))} if self.folder.is_dir() else {}


def proven(left: dict[str, Procs], key: str) -> tuple[list[tuple[int, float]], Procs]:
    """Of what records name: the old workers that are what their record says (alive, same start time, carrying
    the mark its name implies), and everything in their trees now. Nothing else a record names."""
    workers: list[tuple[int, float]] = []
    found: Procs = {}
    for name, procs in left.items():
        if not procs or not _is_worker(name, key):
            continue
        pid, start = next(iter(procs.items()))
        p = same(pid, start)
        try:
            if p is None or p.environ().get(WORKER_MARK) != mark_of(name, key):
                continue
        except psutil.Error:
            continue
        workers.append((pid, start))
        found.update(tree(pid))
    return workers, found


def _is_worker(name: str, key: str) -> bool:
    try:
        mark_of(name, key)
    except ValueError:
        return False
    return True


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


def wait_exited(procs: Iterable[tuple[int, float]], timeout_s: float) -> list[int]:
    """Block until each process has exited (a pidfd each: an event per process, no polling) or `timeout_s`
    passed; the pids still running. One gone meanwhile (or a kernel without pidfds) is not waited on."""
    return wait_pids((pid for pid, start in procs if same(pid, start) is not None), timeout_s, unwaitable=OSError)
