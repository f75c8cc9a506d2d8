"""A task's children die with its worker through the kill of the worker's whole process group.

The agent also kills whatever carries the worker's environment mark (for processes that left the
group with setsid), and every child inherits that mark. So the child here clears its environment:
only the process-group kill can reach it, once for a hang kill and once after a normal exit.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import psutil
import pytest
from support.agents import BackgroundTrainer
from support.faults import ref, wait_gone

from freeride.agent.procs.workers import WORKER_MARK
from freeride.client import AgentClient
from freeride.tooling.harness import AgentProcess, wait_for_task
from freeride.v1 import tasks_pb2

S = tasks_pb2


@pytest.mark.parametrize(
    ("how", "state", "reason"),
    [
        ("hang", S.TASK_STATE_FAILED, "hung"),  # the agent kills the worker for hanging in its step
        ("done", S.TASK_STATE_DONE, ""),  # the worker exits on its own
    ],
)
def test_a_child_without_the_worker_mark_dies_with_the_process_group_of_its_worker(
    agent: AgentProcess, client: AgentClient, tmp_path: Path, how: str, state: int, reason: str
) -> None:
    pidfile = tmp_path / "pids"
    task = client.submit(S.TaskSpec(ref=ref("faulty", "UnmarkedChild"), args={"pidfile": str(pidfile), "how": how},
                                    max_restarts=0))
    wait_for_task(client, task.id, [S.TASK_STATE_READY])  # its setup has started the child
    worker_pid, child_pid = map(int, pidfile.read_text().split())
    child = psutil.Process(child_pid)
    try:
        # What makes this a test of the process-group kill: the child is in the worker's group, unmarked.
        assert worker_pid == client.get(task.id).pid and os.getpgid(child_pid) == worker_pid
        assert WORKER_MARK in psutil.Process(worker_pid).environ() and WORKER_MARK not in child.environ()

        with BackgroundTrainer(agent, [20.0]):  # windows: its one step runs, then hangs or finishes
            info = wait_for_task(client, task.id, [state], timeout_s=30)
        assert reason in info.reason
        assert info.counters.killed_steps == (how == "hang")
        assert wait_gone([worker_pid], 30) == [], "the worker outlived its task"
        assert wait_gone([child_pid], 30) == [], f"the worker's unmarked child {child_pid} outlived it ({how})"
    finally:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()  # a failed run leaves no sleeper behind
