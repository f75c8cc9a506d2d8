"""A task whose thread keeps burning CPU while its worker holds no window is named: a warning in the agent's log
and the task's reason (`freeride show`); a task that uses the CPU only in its steps is not (round 3, item 10)."""

from __future__ import annotations

import time

from support.agents import BackgroundTrainer
from support.paths import TASK_FILES

from freeride.client import AgentClient
from freeride.tooling.harness import AgentProcess, wait_for_task
from freeride.v1 import tasks_pb2

TASKS = TASK_FILES / "placement.py"
BURNS = "uses CPU outside its windows"


def _reason(c: AgentClient, task_id: str) -> str:
    return c.get(task_id).reason


def test_a_task_burning_cpu_between_its_windows_is_named_in_the_log_and_its_reason(
        agent: AgentProcess, client: AgentClient) -> None:
    burner = client.submit(tasks_pb2.TaskSpec(ref=f"{TASKS}:BurnsBetweenWindows"))
    quiet = client.submit(tasks_pb2.TaskSpec(ref=f"{TASKS}:Quiet"))
    for task in (burner, quiet):
        wait_for_task(client, task.id, [tasks_pb2.TASK_STATE_READY], timeout_s=60)
    with BackgroundTrainer(agent, bubble_ms=[20.0], compute_ms=30.0):
        deadline = time.monotonic() + 60
        while BURNS not in _reason(client, burner.id) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert BURNS in _reason(client, burner.id), agent.log_tail(40)
        assert f"task {burner.id} {BURNS}" in agent.log_tail(200)
    assert BURNS not in _reason(client, quiet.id)
    assert f"task {quiet.id} {BURNS}" not in agent.log_tail(400)
