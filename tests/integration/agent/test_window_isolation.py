"""A task cannot open another task's window word (issue 23, round 2, item 6).

The word used to be a file under <state>/run/, writable by every worker: a task that wrote a grant into
another's made the victim step outside its bubbles until the hang watchdog killed it, and the victim was
blamed. Now each worker inherits its word as a sealed memfd: nothing under run/, and every road a process
of the same user has to it (the worker's descriptors reopened through /proc) refuses a write.
"""

from __future__ import annotations

import os
from pathlib import Path

from support.agents import spec

from freeride.client import AgentClient
from freeride.tooling.harness import AgentProcess, wait_for_task
from freeride.v1 import tasks_pb2

S = tasks_pb2


def _window_fds(pid: int) -> dict[str, str]:
    """The worker's descriptors that lead to a window word (a file named *.win, or the memfd), by /proc path."""
    found = {}
    for name in os.listdir(f"/proc/{pid}/fd"):
        path = f"/proc/{pid}/fd/{name}"
        try:
            target = os.readlink(path)
        except FileNotFoundError:
            continue
        if target.endswith(".win") or "freeride-window" in target:
            found[path] = target
    return found


def test_another_process_of_the_agents_user_cannot_write_a_workers_window_word(
    agent: AgentProcess, client: AgentClient,
) -> None:
    victim = wait_for_task(client, client.submit(spec("Counter")).id, [S.TASK_STATE_READY])
    run = Path(agent.state_dir) / "run"
    assert not (run.exists() and list(run.glob("*.win"))), "a window word is a file others can open"
    words = _window_fds(victim.pid)
    assert words, f"no window word among worker {victim.pid}'s descriptors"
    for path, target in words.items():
        try:
            fd = os.open(path, os.O_RDWR)  # what another task, running as the same user, may do
        except PermissionError:
            continue
        try:
            try:
                written = os.pwrite(fd, (1).to_bytes(8, "little") * 4, 0)  # an odd seq: the reader would spin
            except PermissionError:
                continue
            raise AssertionError(f"wrote {written} bytes into {target} through {path}")
        finally:
            os.close(fd)
