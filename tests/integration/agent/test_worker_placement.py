"""A real agent started with --worker-nice/--worker-cpus: its worker, every thread of it and whatever the task
starts run there; one started with --agent-cpus runs there itself, its workers where it was started.
(SCHED_IDLE is checked in tests/unit/agent/test_cpu_placement.py: on a loaded test machine an
idle-policy worker may wait long for a CPU.)"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from support.agents import FAST
from support.paths import TASK_FILES

from freeride.tooling.harness import AgentProcess, wait_for_task
from freeride.v1 import tasks_pb2

TASK = TASK_FILES / "placement.py"


def test_a_worker_its_threads_its_children_and_its_submit_check_run_at_the_agents_nice_and_cpus(
        tmp_path: Path) -> None:
    cpu = max(os.sched_getaffinity(0))
    nice = max(7, os.getpriority(os.PRIO_PROCESS, 0))
    out = tmp_path / "placement.json"
    agent = AgentProcess(state_dir=tmp_path / "state",
                         extra_args=[*FAST, "--worker-nice", str(nice), "--worker-cpus", str(cpu)])
    with agent, agent.client() as c:
        info = c.submit(tasks_pb2.TaskSpec(ref=f"{TASK}:ReportsPlacement", args={"path": str(out)}))
        wait_for_task(c, info.id, [tasks_pb2.TASK_STATE_READY], timeout_s=60)
        placed = json.loads(out.read_text())
        assert f"side-task workers run at nice {nice}, CPUs {cpu}" in agent.log_tail(50)
    threads = placed["worker"] + placed["child"]
    # the reference check at submit too: a burst of submits must not take the trainer's CPU (round 2, item 11)
    threads += json.loads(out.with_suffix(".check.json").read_text())
    assert len(placed["worker"]) >= 3  # main, gRPC's, the task's own: started before and after the worker began
    assert {(t["nice"], tuple(t["cpus"]), t["sched"]) for t in threads} == {(nice, (cpu,), os.SCHED_OTHER)}


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to keep the agent on one of them")
def test_an_agent_given_its_own_cpus_runs_every_thread_there_and_its_workers_keep_the_rest(tmp_path: Path) -> None:
    start = sorted(os.sched_getaffinity(0))
    out = tmp_path / "placement.json"
    agent = AgentProcess(state_dir=tmp_path / "state", extra_args=[*FAST, "--agent-cpus", str(start[-1])])
    with agent, agent.client() as c:
        info = c.submit(tasks_pb2.TaskSpec(ref=f"{TASK}:ReportsPlacement", args={"path": str(out)}))
        wait_for_task(c, info.id, [tasks_pb2.TASK_STATE_READY], timeout_s=60)
        assert agent.proc is not None
        agent_threads = os.listdir(f"/proc/{agent.proc.pid}/task")  # its gRPC threads are up: it answered
        assert len(agent_threads) >= 3
        assert {tuple(sorted(os.sched_getaffinity(int(t)))) for t in agent_threads} == {(start[-1],)}
        assert f"the agent runs on CPUs {start[-1]}" in agent.log_tail(50)
        placed = json.loads(out.read_text())
    assert {tuple(t["cpus"]) for t in placed["worker"] + placed["child"]} == {tuple(start)}
