"""A new agent kills only what provably belongs to its killed predecessor's workers (round 3, item 3).

A worker runs as the agent's user, so a task can write any record under `run/workers/`: a record naming
another process (the trainer) must not get it killed. What the new agent trusts is what a task cannot set
on a process it did not start: the environment mark a worker of this state directory carries, and the
descendants such a worker has now.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from freeride.agent.procs.records import WORKER_MARK, ProcRecords, mark_of, state_key
from freeride.agent.procs.workers import WorkerLauncher, kill_marked
from freeride.core.pids import wait_pids

# Says "up" once it runs: a process just spawned has no /proc/PID/environ yet for a moment (the kernel sets it
# up after exec has already closed the pipe Popen waits on), and what reads the marks would miss it.
_SLEEP = [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(600)"]


@pytest.fixture
def spawned() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for p in procs:
        p.kill()
        p.wait()


def _start(spawned: list[subprocess.Popen[bytes]], argv: list[str],
           env: dict[str, str] | None = None) -> psutil.Process:
    p = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE)
    spawned.append(p)
    assert p.stdout is not None and p.stdout.readline() == b"up\n"
    return psutil.Process(p.pid)


def _reclaim(state: Path) -> None:
    asyncio.run(WorkerLauncher("unix:/nonexistent", state / "logs", 0).reclaim(grace_s=0.2))


def test_a_forged_record_does_not_get_another_process_killed(tmp_path: Path,
                                                              spawned: list[subprocess.Popen[bytes]]) -> None:
    victim = _start(spawned, _SLEEP)  # the trainer, say: no worker of this agent ever started it
    other = _start(spawned, _SLEEP)
    state = tmp_path / "state"
    # What a task can write: a record naming the victim as a worker, and one naming it among a worker's processes.
    ProcRecords(state / "run" / "workers").write("task-1-0-4000000", {victim.pid: victim.create_time()})
    ProcRecords(state / "run" / "workers").write("task-2-0-4000000", {os.getpid() + 10**6: 1.0,
                                                                      other.pid: other.create_time()})
    _reclaim(state)
    assert _alive(victim) and _alive(other), "a forged record got a process killed"


def _alive(p: psutil.Process) -> bool:
    """Still running: a SIGKILL sent would have landed within the bound, so a wait for its exit times out."""
    return wait_pids([p.pid], 0.5) == [p.pid]


def _dead(p: psutil.Process) -> bool:
    """Exited (a zombie counts), waiting for a SIGKILL already sent to land: a pidfd event, bounded."""
    return wait_pids([p.pid], 10) == []


def test_an_old_worker_of_this_state_dir_and_its_tree_are_killed(tmp_path: Path,
                                                                    spawned: list[subprocess.Popen[bytes]]) -> None:
    state = tmp_path / "state"
    state.mkdir()
    name = "task-1-0-4000000"
    env = {**os.environ, WORKER_MARK: mark_of(name, state_key(state))}
    # A worker whose child left its session and cleared its environment: nothing marks the child.
    script = ("import subprocess, sys, time;"
              " c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'],"
              " env={}, start_new_session=True); print(c.pid, flush=True); time.sleep(600)")
    p = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE)
    spawned.append(p)
    assert p.stdout is not None
    child = psutil.Process(int(p.stdout.readline()))
    worker = psutil.Process(p.pid)
    try:
        ProcRecords(state / "run" / "workers").write(name, {worker.pid: worker.create_time()})
        _reclaim(state)
        assert _dead(worker) and _dead(child), "what an old worker of this state directory left outlived the restart"
    finally:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()


def test_the_marked_processes_of_another_state_dir_are_left_alone(tmp_path: Path,
                                                                  spawned: list[subprocess.Popen[bytes]]) -> None:
    state, other = tmp_path / "state", tmp_path / "other"
    state.mkdir()
    other.mkdir()
    name = "task-1-0-4000000"
    neighbour = _start(spawned, _SLEEP, env={**os.environ, WORKER_MARK: mark_of(name, state_key(other))})
    ours = _start(spawned, _SLEEP, env={**os.environ, WORKER_MARK: mark_of("task-2-0-4000000", state_key(state))})
    ProcRecords(state / "run" / "workers").write(name, {neighbour.pid: neighbour.create_time()})
    _reclaim(state)
    assert _alive(neighbour), "a worker of another agent's state directory was killed"
    assert _dead(ours), "a process carrying this state directory's worker mark outlived the restart"


def test_kill_marked_leaves_every_unmarked_process_alone(spawned: list[subprocess.Popen[bytes]]) -> None:
    """(A mark compared with `str.__eq__` answered NotImplemented, truthy, for a process without one.)"""
    unmarked = _start(spawned, _SLEEP, env={k: v for k, v in os.environ.items() if k != WORKER_MARK})
    mine = _start(spawned, _SLEEP, env={**os.environ, WORKER_MARK: "1:2:3:test-only"})
    assert kill_marked(lambda m: m == "1:2:3:test-only") == [f"{mine.pid} ({mine.name()})"]
    assert _alive(unmarked)
